"""The engine's modules import each other in one direction only, at the top.

Read from the source with ``ast``: every import of a ``qitos`` module inside ``qitos.engine`` and
``qitos.sessions`` is a module-level one (none hidden in a function or behind TYPE_CHECKING), and
the import graph among those modules has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import qitos

SRC = Path(qitos.__file__).resolve().parent
PACKAGES = ("engine", "sessions")


def _modules() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((SRC / package).glob("*.py")):
            name = f"qitos.{package}" if path.stem == "__init__" else f"qitos.{package}.{path.stem}"
            found[name] = ast.parse(path.read_text(encoding="utf-8"))
    return found


def _qitos_imports(nodes: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qitos"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("qitos"))
    return names


def test_no_engine_or_sessions_module_imports_qitos_lazily() -> None:
    hidden = []
    for name, tree in _modules().items():
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top and _qitos_imports([node]):
                hidden.append(f"{name}:{node.lineno}")
    assert hidden == []


def test_the_engine_and_sessions_import_graph_has_no_cycle() -> None:
    modules = _modules()
    graph = {name: {m for m in _qitos_imports(tree.body) if m in modules} for name, tree in modules.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycle.extend([*path, node, target])
                return True
            if target not in state and visit(target, [*path, node]):
                return True
        state[node] = 2
        return False

    for name in sorted(graph):
        if name not in state and visit(name, []):
            break
    assert cycle == []
    assert "qitos.engine._engine" not in graph["qitos.engine._model_path"]
    assert "qitos.engine._composition" not in graph["qitos.engine.session_runtime"]
