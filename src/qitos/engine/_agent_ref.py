"""The reference a session records so that another process can rebuild its agent (``agent_ref``).

A session's metadata holds ``agent`` (the agent's class, for people) and ``agent_ref``: what
``qitos sessions resume`` imports to rebuild the agent, in one of two forms:

- ``pkg.module:qualname``: an importable AgentModule class or zero-argument factory;
- ``/abs/path/script.py:qualname``: one defined in a script run as ``python script.py``, whose
  module is ``__main__`` there (a name no other process can import).

The reference names the composition's factory when it has a name (``compose(agent=make_team)``
records ``pkg.teams:make_team``), else the agent's class when that class can be built without
arguments. Otherwise (an agent built with arguments, ``Team(members)``; a lambda; a function
defined inside another) it is None, and the CLI asks for ``--agent``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["MOVED_MODULES", "SCRIPT_ATTRIBUTE", "agent_reference", "import_recorded", "split_reference"]

SCRIPT_ATTRIBUTE = "__qitos_script__"
"""Set on a module imported from a script's path: the absolute path its references name."""


MOVED_MODULES: Mapping[str, str] = {
    "qitos.core.state": "qitos.core._state",
    "qitos.demo.notes_agent": "qitos.demo._notes_agent",
    "qitos.engine.handoff": "qitos.engine._handoff",
    "qitos.kit.agent": "qitos.kit._agent",
}
"""Modules that became private after sessions had recorded names in them (the agents and state
types qitos defines: ``StateSchema``, the demo's ``NotesAgent``, ``Agent``, ``Team``). A stored
``agent``, ``agent_ref`` or state type naming the old path loads from the new one."""


def import_recorded(module_name: str) -> ModuleType:
    """Import the module a stored reference names, following ``MOVED_MODULES``."""
    return importlib.import_module(MOVED_MODULES.get(module_name, module_name))


def agent_reference(*candidates: object) -> str | None:
    """The first candidate (a class or factory) that another process can import and call with no
    arguments, as a reference; None when there is none."""
    for candidate in candidates:
        reference = _reference(candidate)
        if reference is not None:
            return reference
    return None


def split_reference(reference: str) -> tuple[str, str]:
    """``(module or script path, qualname)`` of a reference (a path may itself hold a colon)."""
    where, sep, qualname = reference.rpartition(":")
    if not sep or not where or not qualname:
        return "", ""
    return where, qualname


def _reference(candidate: object) -> str | None:
    module_name = getattr(candidate, "__module__", None)
    qualname = getattr(candidate, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str) or "<" in qualname:
        return None  # a lambda or a function defined inside another
    if not _callable_without_arguments(candidate):
        return None
    module = sys.modules.get(module_name)
    if module is None or _lookup(module, qualname) is not candidate:
        return None  # shadowed, or not reachable by its name
    script = getattr(module, SCRIPT_ATTRIBUTE, None)
    if isinstance(script, str):
        return f"{script}:{qualname}"  # a script imported by path (qitos.cli._agents)
    if module_name != "__main__":
        return f"{module_name}:{qualname}"
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return f"{spec.name}:{qualname}"  # run as python -m pkg.module
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None  # python -c, an interactive session, a notebook
    return f"{os.path.abspath(path)}:{qualname}"


def _lookup(module: object, qualname: str) -> Any:
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _callable_without_arguments(candidate: object) -> bool:
    if not callable(candidate):
        return False
    try:
        return _takes_no_arguments(candidate)
    except TypeError:  # unhashable: not cached
        return _takes_no_arguments.__wrapped__(candidate)


# inspect.signature costs tens of microseconds, and every new session asks about the same few
# module-level classes and factories.
@functools.lru_cache(maxsize=256)
def _takes_no_arguments(candidate: Callable[..., object]) -> bool:
    try:
        signature = inspect.signature(candidate)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )
