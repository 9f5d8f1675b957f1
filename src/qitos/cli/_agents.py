"""Loading the user's agent: ``qitos run AGENT`` and the agent a stored session is restored with.

An agent is named ``module:qualname`` (an importable AgentModule class, zero-argument factory or
agent instance such as a module's ``agent = Agent(model, tools=[...])``; the current directory is on
``sys.path`` first, as with ``python -m``) or
``path/to/script.py:qualname`` (a script, imported as a module: its ``if __name__ == "__main__":``
block does not run). A session records such a reference when it is created
(``qitos.engine._agent_ref``); ``--agent`` names another one.

A script is imported only when nothing at its top level runs besides definitions and assignments:
importing a script that starts a session or prints would do that again, so such a script is
refused with what to do instead.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from qitos.core._agent_module import AgentModule
from qitos.core._errors import ConfigurationError
from qitos.engine._agent_ref import SCRIPT_ATTRIBUTE, import_recorded, split_reference

__all__ = ["AGENT_FORMS", "load_agent", "session_agent"]

AGENT_FORMS = "module:Class or path/to/script.py:Class (a class, a zero-argument factory or an agent instance)"

# What a script may hold at its top level for qitos to import it: definitions and assignments.
_DEFINITIONS = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.Pass,
)

AgentFactory = Callable[[], AgentModule[Any, Any, Any]]


def load_agent(spec: str) -> AgentFactory:
    """Import ``spec`` (see the module docstring); ConfigurationError says what is wrong."""
    where, qualname = split_reference(spec)
    if not where:
        raise ConfigurationError(f"an agent is named {AGENT_FORMS}, got {spec!r}")
    if where.endswith(".py"):
        module = _import_script(Path(where))
    else:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = import_recorded(where)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import agent module {where!r}: {exc}") from exc
    target: Any = module
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(f"{where} has no {qualname!r}") from None
    if isinstance(target, type):
        if not issubclass(target, AgentModule):
            raise ConfigurationError(f"{spec} is a class but not an AgentModule subclass")
        return target
    if isinstance(target, AgentModule):
        instance = target

        def factory() -> AgentModule[Any, Any, Any]:
            return instance

        # It names what it returns, as a class does (an eval pins its agent by this name).
        factory.__module__, factory.__qualname__ = module.__name__, qualname
        return factory
    if callable(target):
        return target  # type: ignore[no-any-return]
    raise ConfigurationError(f"{spec} is neither an AgentModule class, a factory nor an agent instance")


def session_agent(session_id: str, metadata: Mapping[str, object], override: str | None) -> AgentModule[Any, Any, Any]:
    """The agent to restore ``session_id`` with: ``override`` (``--agent``), else the one its
    metadata records, built once here so that every failure names ``--agent``."""
    recorded = str(metadata.get("agent") or "")
    if override:
        spec, source = override, f"--agent {override}"
    elif "agent_ref" in metadata:
        if not metadata["agent_ref"]:
            raise ConfigurationError(
                f"session {session_id}'s agent ({recorded or 'unknown'}) cannot be rebuilt from its record: it was "
                "built with arguments, by a lambda or by a nested function. Pass --agent with a zero-argument "
                f"factory that returns it ({AGENT_FORMS}); compose(agent=factory) with a module-level factory "
                "records one"
            )
        spec, source = str(metadata["agent_ref"]), f"its recorded agent {metadata['agent_ref']}"
    elif recorded:
        spec, source = recorded, f"its recorded agent {recorded}"
    else:
        raise ConfigurationError(f"session {session_id} does not record its agent; pass --agent ({AGENT_FORMS})")
    try:
        factory = load_agent(spec)
        agent = factory()
    except Exception as exc:
        what = str(exc) if isinstance(exc, ConfigurationError) else f"{type(exc).__name__}: {exc}"
        hint = "" if override else f"; pass --agent ({AGENT_FORMS})"
        raise ConfigurationError(f"cannot rebuild session {session_id}'s agent from {source}: {what}{hint}") from exc
    if not isinstance(agent, AgentModule):
        raise ConfigurationError(f"{source} returned {type(agent).__name__}, not an AgentModule")
    return agent


def _import_script(path: Path) -> Any:
    """The script at ``path`` as a module (its directory first on ``sys.path``, as ``python`` does)."""
    path = path.expanduser().resolve()
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the agent's script {path}: {exc.strerror or exc}") from exc
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as exc:
        raise ConfigurationError(f"cannot parse the agent's script {path}: {exc}") from exc
    action = _first_action(tree.body)
    if action is not None:
        raise ConfigurationError(
            f"{path} runs code when imported (line {action.lineno}: {ast.unparse(action)[:60]!r}), so qitos will not "
            'import it: put that code under if __name__ == "__main__":, or move the agent into a module'
        )
    name = f"qitos_script_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"cannot import the agent's script {path}")
    module = importlib.util.module_from_spec(spec)
    setattr(module, SCRIPT_ATTRIBUTE, str(path))
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[name] = module  # dataclasses look their module up while the script runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _first_action(body: list[ast.stmt]) -> ast.stmt | None:
    """The first top-level statement that does something when the script is imported, if any."""
    for node in body:
        if isinstance(node, ast.Try):
            inner = [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
            found = _first_action(inner)
            if found is not None:
                return found
            continue
        if isinstance(node, ast.If) and (_is_main_guard(node.test) or _is_type_checking(node.test)):
            continue
        if isinstance(node, _DEFINITIONS):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        return node
    return None


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
