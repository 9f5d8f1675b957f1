"""The public surface, listed: every public module of qitos (no ``_``-prefixed part in its dotted
path) and the names its ``__all__`` exports. The list is a literal so that growing or changing the
surface is a decision made here, in review, not a side effect of adding a module.

A public module holds its names in a sorted ``__all__``; every listed name resolves; the names the
seed pages give stay importable at the paths they give.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import qitos

SURFACE = {
    "qitos": [
        "Action",
        "Agent",
        "AgentModule",
        "AsyncEngine",
        "Decision",
        "Engine",
        "EngineResult",
        "Observation",
        "RunFailedError",
        "RuntimeBudget",
        "StateSchema",
        "StopReason",
        "Task",
        "TaskBudget",
        "TaskResource",
        "ToolRegistry",
        "__version__",
        "compose",
        "tool",
    ],
    "qitos.checkpoint": [
        "CheckpointStore",
        "InMemoryCheckpointStore",
        "PostgresCheckpointStore",
        "SqliteCheckpointStore",
        "open_store",
    ],
    "qitos.checkpoint.store": ["CheckpointStore"],
    "qitos.cli": [],
    "qitos.cli.app": ["app", "main"],
    "qitos.core": [
        "CheckpointError",
        "CodecError",
        "ConfigurationError",
        "ContextError",
        "Exchange",
        "ExchangeLog",
        "HeadConflictError",
        "IntegrityError",
        "LeaseLostError",
        "ModelError",
        "QitosError",
        "RunError",
        "RunFailedError",
        "SessionBusyError",
        "SessionNotFoundError",
        "SnapshotIntegrityError",
        "StateValidationError",
        "ToolDefinitionError",
        "UsageError",
    ],
    "qitos.core.context": [
        "ContextContribution",
        "ContextContributor",
        "ContextRequest",
        "ContextSelectionPolicy",
        "DeclaredContextBudgetPolicy",
        "PriorityContextSelectionPolicy",
        "StaticContextContributor",
    ],
    "qitos.core.memory": ["Memory", "MemoryRecord", "MemoryResourceError"],
    "qitos.core.request_view": ["CompactionPolicy", "CompactionReceipt", "ContextBudgetExceededError", "RequestView"],
    "qitos.demo": ["NotesAgent", "NotesState"],
    "qitos.distributed": ["Fleet", "SessionOutcome", "Worker", "load_composition"],
    "qitos.engine": [
        "CandidateOutcome",
        "Composition",
        "Critic",
        "CriticVerdict",
        "Delegation",
        "EngineEvent",
        "EngineEventType",
        "EngineHook",
        "EventStream",
        "FanoutSelector",
        "FinalResultCriteria",
        "FirstCandidateSelector",
        "HookContext",
        "OtelSettings",
        "RuntimeSnapshotContext",
        "StepRecord",
        "StopCriteria",
        "Team",
        "TeamState",
        "delegate",
    ],
    "qitos.engine.runtime": ["LifecyclePolicy"],
    "qitos.engine.session_runtime": ["Session", "SessionInspection"],
    "qitos.eval": [
        "CompareError",
        "Comparison",
        "Dataset",
        "DatasetError",
        "EvalChangedError",
        "EvalProgress",
        "EvalReport",
        "EvalStore",
        "ReplaySourceError",
        "Sample",
        "SampleReport",
        "SampleResult",
        "Score",
        "Scorer",
        "ScorerError",
        "ScoringError",
        "aevaluate",
        "compare",
        "evaluate",
        "open_eval_store",
        "scorers",
    ],
    "qitos.eval.benchmarks": ["Benchmark", "bfcl", "humaneval", "pass_at_k"],
    "qitos.eval.scorers": ["choice", "code", "exact", "includes", "model_graded", "numeric", "pattern", "tool_calls"],
    "qitos.kit": [],
    "qitos.kit.context": [],
    "qitos.kit.context.compaction": ["ClosedExchangeWindowCompactor", "SummaryCompactor", "SummaryModel"],
    "qitos.kit.context.policy": [
        "ContextPolicy",
        "ContextPolicyError",
        "ContextPolicyReceipt",
        "ContextPolicyViolation",
        "apply_context_policy",
        "audit_context",
        "parse_context_policy",
        "reduce_context",
        "validate_context_policy",
    ],
    "qitos.kit.memory": [],
    "qitos.kit.memory.adapter": ["MemorySourceAdapter"],
    "qitos.kit.memory.markdown_file_memory": ["MarkdownFileMemory"],
    "qitos.kit.memory.memdir_memory": ["MemdirMemory"],
    "qitos.kit.parsers": ["DecisionParser", "JsonDecisionParser", "ParseError", "ReActParser"],
    "qitos.kit.tools": [],
    "qitos.models": [
        "FunctionModel",
        "LocalModel",
        "ModelAdapter",
        "ModelResponse",
        "OpenAICompatibleModel",
        "ReplayDivergenceError",
        "ReplayModel",
        "ScriptedModel",
        "ToolCall",
        "Usage",
    ],
    "qitos.sessions": ["ApprovalReceipt", "PauseReceipt", "SessionLifecycle", "SteeringReceipt"],
    "qitos.testing": ["CheckpointStoreConformance"],
    "qitos.tools": [
        "MCPConnectionError",
        "MCPToolError",
        "MCPToolset",
        "ToolRegistry",
        "ToolResult",
        "ToolSpec",
        "WorkspacePathError",
        "shell_tool",
        "tool",
        "workspace_tools",
    ],
    "qitos.trace": ["RunTrace", "TraceError", "TraceWriter", "list_runs", "open_run"],
    "qitos.viewer": ["ViewerServer"],
}

# What the seed pages import, at the paths they import it from: these never move.
SEED_NAMES = {
    "qitos": ["Action", "Decision", "StateSchema", "StopReason", "Task", "TaskBudget", "TaskResource"],
    "qitos.checkpoint.store": ["CheckpointStore"],
    "qitos.core.context": ["DeclaredContextBudgetPolicy", "PriorityContextSelectionPolicy", "StaticContextContributor"],
    "qitos.core.memory": ["MemoryRecord", "MemoryResourceError"],
    "qitos.core.request_view": ["CompactionReceipt", "ContextBudgetExceededError", "RequestView"],
    "qitos.engine.runtime": ["LifecyclePolicy"],
    "qitos.engine.session_runtime": ["Session", "SessionInspection"],
    "qitos.kit.context.compaction": ["ClosedExchangeWindowCompactor"],
    "qitos.kit.memory.adapter": ["MemorySourceAdapter"],
    "qitos.kit.memory.markdown_file_memory": ["MarkdownFileMemory"],
    "qitos.kit.memory.memdir_memory": ["MemdirMemory"],
}

# At most this many exported names beyond the seeds' own (a name exported by two modules counts twice).
BUDGET = 150

SRC = Path(qitos.__file__).resolve().parent


def _public_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if any(part.startswith("_") and part != "__init__" for part in parts):
            continue
        found[".".join(parts).removesuffix(".__init__")] = path
    return found


def _declared_all(path: Path) -> list[str] | None:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(value))
    return None


def _isort_key(name: str) -> tuple[int, str]:
    # the order ruff keeps an __all__ in: CONSTANTS, then Classes, then functions
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_the_public_modules_and_their_names_are_exactly_the_listed_ones() -> None:
    declared = {name: _declared_all(path) for name, path in _public_modules().items()}
    assert {name for name, names in declared.items() if names is None} == set(), "a public module without __all__"
    assert {name: sorted(names or []) for name, names in declared.items()} == SURFACE


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_each_all_is_sorted_and_every_name_resolves(module: str) -> None:
    imported = importlib.import_module(module)
    assert list(imported.__all__) == sorted(set(imported.__all__), key=_isort_key)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == []
    documented = [
        name
        for name in imported.__all__
        if (isinstance(obj := getattr(imported, name), type) or callable(obj)) and not (obj.__doc__ or "").strip()
    ]
    assert documented == [], "public classes and functions keep their docstrings"


@pytest.mark.parametrize("module", sorted(SEED_NAMES))
def test_the_seed_names_stay_at_their_seed_paths(module: str) -> None:
    imported = importlib.import_module(module)
    for name in SEED_NAMES[module]:
        assert name in imported.__all__, f"{module}.{name}"
        assert getattr(imported, name) is not None


def test_beyond_the_seeds_the_surface_stays_small() -> None:
    seeds = {(module, name) for module, names in SEED_NAMES.items() for name in names}
    beyond = [(module, name) for module, names in SURFACE.items() for name in names if (module, name) not in seeds]
    assert len(beyond) <= BUDGET
