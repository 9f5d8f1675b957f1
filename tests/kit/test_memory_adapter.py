"""MemorySourceAdapter: fresh recall per request, provenance, never touches the borrowed memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextBudget, ContextContributionError, ContextRequest
from qitos.core.memory import MemoryRecord, record_revision
from qitos.core.request_view import RequestView
from qitos.kit.memory.adapter import MemorySourceAdapter
from qitos.kit.memory.markdown_file_memory import MarkdownFileMemory
from qitos.kit.memory.memdir_memory import MemdirMemory

REQUEST = ContextRequest(step_id=0, task="t", log=None)


class TrackingMemory(MarkdownFileMemory):
    """A real memory that also records reset/close calls made on it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.resets = 0
        self.closed = False
        self.retrieves = 0

    def reset(self, run_id: str | None = None) -> None:
        self.resets += 1
        super().reset(run_id)

    def close(self) -> None:
        self.closed = True

    def retrieve(
        self, query: dict[str, Any] | None = None, state: Any = None, observation: Any = None
    ) -> list[MemoryRecord]:
        self.retrieves += 1
        return super().retrieve(query, state, observation)


class BadMemory:
    def retrieve(self, query: dict[str, Any] | None = None) -> object:
        return ["not a record"]


def test_seed_example_required_source(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "remembered-value=17", 0, record_id="fact"))
    source = MemorySourceAdapter(memory, namespace="project", required=True)
    (c,) = source.contribute(REQUEST)
    assert c.contribution_id == "memory:project:fact" and c.source == "memory:project"
    assert c.required and c.requested_placement == "user" and c.persistence_horizon == "request"
    assert c.content == "remembered-value=17"
    assert c.revision == record_revision(memory.retrieve()[0])


def test_every_request_recalls_fresh_data(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    source = MemorySourceAdapter(memory, namespace="project")
    assert source.contribute(REQUEST) == ()
    memory.append(MemoryRecord("user", "v1", 0, record_id="k"))
    first = source.contribute(REQUEST)
    memory.append(MemoryRecord("user", "v2", 0, record_id="k"))
    second = source.contribute(REQUEST)
    assert first[0].content == "v1" and second[0].content == "v2"
    assert first[0].revision != second[0].revision  # revision is provenance, not a suppression cache
    restored = MemorySourceAdapter(MemdirMemory(str(tmp_path / "m")), namespace="project")
    assert restored.contribute(REQUEST)[0].content == "v2"


def test_reset_and_close_never_touch_the_borrowed_memory(tmp_path: Path) -> None:
    memory = TrackingMemory(str(tmp_path / "m.md"))
    memory.append(MemoryRecord("user", "keep me", 0))
    source = MemorySourceAdapter(memory, namespace="notes")
    source.reset("run-1")
    source.close()
    assert memory.resets == 0 and not memory.closed
    assert [c.content for c in source.contribute(REQUEST)] == ["keep me"]
    source.contribute(REQUEST)
    assert memory.retrieves == 2


def test_the_query_is_passed_and_isolated(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "tea", 0))
    memory.append(MemoryRecord("feedback", "coffee", 1))
    query: dict[str, Any] = {"roles": ["feedback"]}
    source = MemorySourceAdapter(memory, namespace="prefs", query=query, priority=7)
    query["roles"] = ["user"]
    (c,) = source.contribute(REQUEST)
    assert c.content == "coffee" and c.priority == 7


def test_recalled_memory_reaches_the_request_with_provenance(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "the user is called Ada", 0, record_id="name"))
    log = ExchangeLog()
    log.open([{"role": "user", "content": "hello"}])
    contributions = MemorySourceAdapter(memory, namespace="people").contribute(REQUEST)
    view = RequestView.from_exchange_log(log, context_budget=ContextBudget(), context_contributions=contributions)
    assert "the user is called Ada" in view.messages()[0]["content"]
    assert view.provenance["contribution_revisions"] == {"memory:people:name": contributions[0].revision}


@pytest.mark.parametrize("namespace", ["", "../x", "/abs", "a b", "x" * 200])
def test_namespace_must_be_a_logical_label(tmp_path: Path, namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        MemorySourceAdapter(MarkdownFileMemory(str(tmp_path / "m.md")), namespace=namespace)


def test_bad_arguments_and_bad_memories_are_reported(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "m.md"))
    with pytest.raises(ValueError, match="required"):
        MemorySourceAdapter(memory, namespace="n", required="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="priority"):
        MemorySourceAdapter(memory, namespace="n", priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retrieve"):
        MemorySourceAdapter(object(), namespace="n")  # type: ignore[arg-type]
    with pytest.raises(ContextContributionError, match="not a MemoryRecord"):
        MemorySourceAdapter(BadMemory(), namespace="n").contribute(REQUEST)  # type: ignore[arg-type]
