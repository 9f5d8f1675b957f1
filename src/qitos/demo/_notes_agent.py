"""``NotesAgent``: the demo agent. It lists, reads and indexes the Markdown notes of a workspace.

The agent works through the workspace file tools of :mod:`qitos.kit.tools._files` (``list_files``,
``read_file``, ``write_file``) and ends with a short index of the notes, also written to
``INDEX.md`` in the workspace. The same class runs in two modes:

- ``policy="scripted"``: ``decide`` is a deterministic policy (list, read each note, write the
  index, answer). No model is involved; the run is the same every time.
- ``policy="model"``: while there is something to explore, ``decide`` returns None and the engine
  takes its model path (RequestView, model adapter, tool calls parsed into decisions): the model
  lists the workspace and reads the notes, in the order it chooses. Before each model turn the
  agent offers only the tool that makes sense next (``list_files``, then ``read_file``) with its
  path argument narrowed to what exists (a JSON-schema enum built from the state), so an adapter
  that constrains its output to the tool schemas (the embedded local model does) cannot name a
  file that is not there, and even a very small model gets through. Once every note is read, the
  agent writes ``INDEX.md`` and answers itself: the index is computed from what the model read,
  so it is right whatever the model's size. ``reduce`` is shared by both policies.

The workspace is a directory on disk; :func:`prepare_workspace` copies the bundled notes
(package data under ``qitos/demo/workspace``) into a new or empty directory. Package data is never
modified. The workspace path is part of the state, so a session restored in another process works
on the same directory.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import ConfigurationError
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, ToolSpec
from qitos.kit.parsers._base import DecisionParser
from qitos.kit.tools._files import workspace_tools
from qitos.models._function import ModelSource

__all__ = [
    "INDEX_FILE",
    "NoteEntry",
    "NotesAgent",
    "NotesState",
    "Policy",
    "bundled_note_paths",
    "parse_note",
    "prepare_workspace",
    "render_index",
    "scripted_model_responses",
]

INDEX_FILE = "INDEX.md"
WORKSPACE_ENV = "QITOS_DEMO_WORKSPACE"
Policy = Literal["scripted", "model"]

SYSTEM_PROMPT = (
    "You explore a workspace of Markdown notes so that they can be indexed, one tool call per turn: "
    "first list_files, then read_file for each note that is not read yet."
)


@dataclass(frozen=True, kw_only=True)
class NoteEntry:
    """One indexed note: its path in the workspace, title, first sentence, tags and size."""

    path: str
    title: str
    summary: str
    tags: tuple[str, ...] = ()
    lines: int = 0


@dataclass
class NotesState(StateSchema):
    """The demo agent's state: the workspace, the notes found, read and indexed."""

    workspace: str = ""
    listed: bool = False
    files: list[str] = field(default_factory=list)
    notes: list[NoteEntry] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    index_written: bool = False

    def unread(self) -> list[str]:
        """Listed notes that were neither read nor failed, in listing order."""
        done = {n.path for n in self.notes} | set(self.failed)
        return [f for f in self.files if f not in done]

    def next_unread(self) -> str | None:
        """The first listed note that was neither read nor failed."""
        return next(iter(self.unread()), None)


def parse_note(path: str, text: str) -> NoteEntry:
    """Title (first ``#`` heading, else the file name), first sentence, ``tags:`` line, line count."""
    title = ""
    summary = ""
    tags: tuple[str, ...] = ()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#") and not title:
            title = line.lstrip("#").strip()
        elif line.lower().startswith("tags:") and not tags:
            tags = tuple(t.strip() for t in line[5:].split(",") if t.strip())
        elif not summary and not line.startswith("#"):
            summary = _first_sentence(line)
    if not title:
        title = Path(path).stem.replace("-", " ").replace("_", " ").strip() or path
    return NoteEntry(path=path, title=title, summary=summary, tags=tags, lines=len(text.splitlines()))


def _first_sentence(line: str) -> str:
    for stop in (". ", "! ", "? "):
        cut = line.find(stop)
        if cut >= 0:
            line = line[: cut + 1]
    return line if len(line) <= 160 else line[:157] + "..."


def render_index(notes: list[NoteEntry] | tuple[NoteEntry, ...]) -> str:
    """The index text: a heading and one line per note, sorted by path."""
    lines = [f"# Notes index ({len(notes)} note{'s' if len(notes) != 1 else ''})", ""]
    for note in sorted(notes, key=lambda n: n.path):
        tags = f" [{', '.join(note.tags)}]" if note.tags else ""
        summary = f" - {note.summary}" if note.summary else ""
        lines.append(f"- {note.path}: {note.title}{summary}{tags}")
    return "\n".join(lines) + "\n"


def _is_note(path: str) -> bool:
    return path.endswith(".md") and Path(path).name != INDEX_FILE and not path.endswith("/")


# --------------------------------------------------------------------------- the workspace


def _bundled_root() -> Traversable:
    return resources.files("qitos.demo").joinpath("workspace")


def _walk_bundle(node: Traversable, prefix: str = "") -> Iterator[tuple[str, Traversable]]:
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            yield from _walk_bundle(child, rel + "/")
        elif child.name.endswith(".md"):
            yield rel, child


def bundled_note_paths() -> list[str]:
    """Relative paths of the bundled demo notes, sorted."""
    return [rel for rel, _ in _walk_bundle(_bundled_root())]


def prepare_workspace(directory: str | os.PathLike[str] | None = None) -> tuple[Path, bool]:
    """A workspace directory holding notes; returns ``(path, copied)``.

    With no ``directory``, a new temporary directory receives a copy of the bundled notes. A
    missing or empty ``directory`` is created and receives the copy. A directory that already has
    files is used as it is (the agent indexes the notes found there) and nothing is copied.
    """
    if directory is None:
        target = Path(tempfile.mkdtemp(prefix="qitos-demo-"))
    else:
        target = Path(directory).expanduser()
        if target.exists() and not target.is_dir():
            raise ConfigurationError(f"demo workspace {str(target)!r} exists and is not a directory")
        if target.is_dir() and any(target.iterdir()):
            return target.resolve(), False
        target.mkdir(parents=True, exist_ok=True)
    for rel, source in _walk_bundle(_bundled_root()):
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(source.read_bytes())
    return target.resolve(), True


# --------------------------------------------------------------------------- the agent


class NotesAgent(AgentModule[NotesState, Observation, Action]):
    """Lists, reads and indexes the notes of a workspace with the workspace file tools.

    Args:
        workspace: the notes directory. None: the ``QITOS_DEMO_WORKSPACE`` environment variable,
            else a fresh temporary copy of the bundled notes (made when a run starts, not here).
        policy: ``"scripted"`` (deterministic ``decide``) or ``"model"`` (the engine's model path).
        llm: the model adapter for ``policy="model"`` (or give it to the Engine / ``compose``).
        model_parser: a text protocol parser for models without native tool calls.
        max_steps: the step limit written into the initial state.
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        policy: Policy = "scripted",
        llm: ModelSource | None = None,
        model_parser: DecisionParser | None = None,
        max_steps: int = 24,
        **config: Any,
    ) -> None:
        if policy not in ("scripted", "model"):
            raise ConfigurationError(f"NotesAgent policy must be 'scripted' or 'model', got {policy!r}")
        if max_steps < 1:
            raise ConfigurationError(f"NotesAgent max_steps must be >= 1, got {max_steps}")
        super().__init__(tool_registry=ToolRegistry(), llm=llm, model_parser=model_parser, **config)
        self.policy: Policy = policy
        self.max_steps = max_steps
        configured = workspace if workspace is not None else os.environ.get(WORKSPACE_ENV)
        self.workspace: Path | None = Path(configured).expanduser().resolve() if configured else None
        self._bound_root: Path | None = None
        self._specs: dict[str, ToolSpec] = {}
        self._offered: tuple[str, ...] | None = None
        if self.workspace is not None and self.workspace.is_dir():
            self._bind(self.workspace)

    # ---- tools

    def _bind(self, root: Path) -> None:
        """(Re)register the file tools confined to ``root``."""
        if self._bound_root == root:
            return
        specs = {spec.name: spec for spec in workspace_tools(root)}
        self._specs = {name: specs[name] for name in ("list_files", "read_file", "search_files", "write_file")}
        self.tool_registry = ToolRegistry(self._specs.values())
        self._bound_root = root
        self._offered = None

    def _offer_next_tools(self, state: NotesState) -> None:
        """Model mode: register only the next sensible tool, its arguments narrowed to what exists."""
        specs = self._specs
        offered: list[ToolSpec] = []
        if not state.listed:
            offered.append(_narrow(specs["list_files"], {"path": ["."], "recursive": [True]}))
        elif unread := state.unread():
            offered.append(_narrow(specs["read_file"], {"path": unread}))
        key = tuple(_spec_key(spec) for spec in offered)
        if key != self._offered:
            self.tool_registry = ToolRegistry(offered)
            self._offered = key

    def _ensure_bound(self, state: NotesState) -> None:
        # A restored session carries its workspace in the state; bind the tools to it.
        if state.workspace:
            root = Path(state.workspace)
            if not root.is_dir():
                raise ConfigurationError(f"the notes workspace {state.workspace!r} no longer exists")
            self._bind(root)

    # ---- hooks

    def init_state(self, task: str, **kwargs: Any) -> NotesState:
        """A fresh state; the workspace is prepared (copied) here if none was configured."""
        workspace = kwargs.pop("workspace", None)
        root = Path(workspace).expanduser().resolve() if workspace else self.workspace
        if root is None:
            root, _ = prepare_workspace()
            self.workspace = root
        if not root.is_dir():
            raise ConfigurationError(f"the notes workspace {str(root)!r} is not a directory")
        self._bind(root)
        return NotesState(task=task, max_steps=kwargs.pop("max_steps", self.max_steps), workspace=str(root), **kwargs)

    def build_system_prompt(self, state: NotesState) -> str | None:
        """The instructions of the model mode."""
        return SYSTEM_PROMPT

    def prepare(self, state: NotesState) -> str:
        """The task as the model's first input."""
        return state.task or f"Index the notes in the workspace and write {INDEX_FILE}."

    def decide(self, state: NotesState, observation: Observation) -> Decision[Action] | None:
        """The next step: the scripted policy (list, read each note, write the index, answer); in model
        mode None (the model's turn) until every note is read, then the same write and answer."""
        self._ensure_bound(state)
        if self.policy == "model" and (not state.listed or state.unread()):
            self._offer_next_tools(state)
            return None
        if not state.listed:
            return Decision.act(
                [Action("list_files", {"path": ".", "recursive": True})], rationale="find the notes in the workspace"
            )
        path = state.next_unread()
        if path is not None:
            return Decision.act([Action("read_file", {"path": path})], rationale=f"read {path}")
        return self._write_and_answer(state)

    def _write_and_answer(self, state: NotesState) -> Decision[Action]:
        # Both policies end here: the index is rendered from the notes that were read.
        if self._offered is not None:
            self.tool_registry = ToolRegistry(self._specs.values())
            self._offered = None
        index = render_index(state.notes)
        if not state.index_written:
            return Decision.act(
                [Action("write_file", {"path": INDEX_FILE, "content": index})],
                rationale=f"save the index of {len(state.notes)} notes",
            )
        return Decision.final(index.rstrip("\n"), rationale="every note is indexed")

    def reduce(self, state: NotesState, observation: Observation, decision: Decision[Action]) -> NotesState:
        """Fold tool results (from either policy) into the state."""
        calls = {a.id: a for a in decision.actions}
        for result in observation.results if isinstance(observation, Observation) else ():
            action = calls.get(result.call_id)
            args = dict(action.args) if action is not None else {}
            path = str(args.get("path", ""))
            if result.name == "list_files" and result.ok:
                state.listed = True
                for line in str(result.output).splitlines():
                    entry = line.strip()  # listings give paths relative to the workspace root
                    if _is_note(entry) and entry not in state.files:
                        state.files.append(entry)
            elif result.name == "list_files":
                state.listed = True
                state.failed["."] = result.as_text()
            elif result.name == "read_file" and path:
                if result.ok and _is_note(path):
                    if all(n.path != path for n in state.notes):
                        state.notes.append(parse_note(path, str(result.output)))
                    if path not in state.files:
                        state.files.append(path)
                elif not result.ok:
                    state.failed[path] = result.as_text()
            elif result.name == "write_file" and path == INDEX_FILE and result.ok:
                state.index_written = True
        return state


def _narrow(spec: ToolSpec, allowed: Mapping[str, Sequence[object]]) -> ToolSpec:
    """``spec`` with only the ``allowed`` arguments, each required and an enum of its values."""
    properties = dict(spec.parameters.get("properties") or {})
    narrowed: dict[str, Any] = {}
    for name, values in allowed.items():
        schema = {k: v for k, v in dict(properties[name]).items() if k != "default"}
        narrowed[name] = {**schema, "enum": list(values)}
    parameters = {
        "type": "object",
        "properties": narrowed,
        "required": list(narrowed),
        "additionalProperties": False,
    }
    return dataclasses.replace(spec, parameters=parameters)


def _spec_key(spec: ToolSpec) -> str:
    """A stable key of a spec's name and schema (to skip rebuilding an unchanged registry)."""
    return f"{spec.name}:{sorted(spec.parameters.get('properties', {}).items())!r}"


# --------------------------------------------------------------------------- a scripted "model"


def scripted_model_responses(workspace: str | os.PathLike[str]) -> list[dict[str, Any] | str]:
    """Responses for :class:`~qitos.models.ScriptedModel` that drive ``policy="model"``
    through the engine's model path over ``workspace``: list, then read each note (in reverse path
    order, to show that the order is the model's choice).

    This is a fixed script computed from the files, not a language model; it exists so the model
    path (requests, budgets, compaction receipts) can be shown and tested offline.
    """
    root = Path(workspace)
    paths = sorted((p.relative_to(root).as_posix() for p in root.rglob("*.md") if p.name != INDEX_FILE), reverse=True)
    responses: list[dict[str, Any] | str] = [
        {"tool_calls": [{"name": "list_files", "arguments": {"path": ".", "recursive": True}}]}
    ]
    responses += [{"tool_calls": [{"name": "read_file", "arguments": {"path": p}}]} for p in paths]
    return responses
