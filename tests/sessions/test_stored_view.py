"""The last request view of a durable session is stored with its exchange items by reference."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import session_agents as sa
from qitos.checkpoint._packing import unpack
from qitos.core._codec import canonical_json
from qitos.core._exchange import ExchangeLog
from qitos.core.request_view import RequestView
from qitos.engine._composition import Composition
from qitos.models._scripted import ScriptedModel
from qitos.sessions._payload import SnapshotPayload
from qitos.sessions._stored_view import view_from_record, view_record


def _model_session(tmp_path: Path, target: int = 6) -> tuple[Composition, str, ScriptedModel]:
    model = ScriptedModel(sa.model_script(target, note_bytes=64))
    composition = sa.make_composition(str(tmp_path / "s.db"), str(tmp_path / "side.log"), agent="model", model=model)
    session = composition.session("Index notes", target=target)
    session.run()
    return composition, session.session_id.value, model


def _stored_view(composition: Composition, sid: str, db: Path) -> tuple[dict[str, Any], int]:
    """The last request view's stored record and its stored size in bytes."""
    store = composition.runtime.checkpoint_store
    head = store.get_session_head(sid)
    assert head is not None
    chain = store.load_chain(head.snapshot_id)
    view_id = next(p.request_view for s in reversed(chain) if (p := SnapshotPayload.of(s)).request_view)
    with sqlite3.connect(db) as con:
        raw = con.execute("SELECT data FROM blobs WHERE digest = ?", (view_id,)).fetchone()[0]
    return json.loads(unpack(raw)), len(raw)


def test_inspect_returns_the_view_last_sent_while_the_store_holds_segments_of_ids(tmp_path: Path) -> None:
    composition, sid, model = _model_session(tmp_path)
    sent = model.requests[-1]

    shown = composition.restore(sid).inspect().last_request_view

    assert shown is not None and shown.to_dict() == sent.to_dict()
    stored, _ = _stored_view(composition, sid, tmp_path / "s.db")
    assert stored["selected_items"][0] == ["ex-000001", sent.selection.selected_exchange_ids[-2]]
    assert not any(isinstance(item, dict) for item in stored["selected_items"])  # no item text stored again
    assert stored["selection"]["selected_exchange_ids"][0][0] == "ex-000001"


def test_the_stored_view_does_not_grow_with_the_history(tmp_path: Path) -> None:
    short, long = tmp_path / "short", tmp_path / "long"
    short.mkdir()
    long.mkdir()
    sizes = []
    for root, target in ((short, 5), (long, 60)):
        composition, sid, model = _model_session(root, target)
        assert len(model.requests[-1].selected_items_json) > 2 * target  # the whole transcript is sent
        sizes.append(_stored_view(composition, sid, root / "s.db")[1])
    assert sizes[1] < 1.2 * sizes[0], sizes


def _log_with_one_exchange() -> ExchangeLog:
    log = ExchangeLog("log-test")
    exchange = log.open([{"role": "user", "content": "hello"}])
    log.record_output(exchange.exchange_id, {"role": "assistant", "content": "hi"})
    log.close(exchange.exchange_id)
    return log


def test_items_the_log_does_not_hold_are_stored_inline_and_read_back(tmp_path: Path) -> None:
    _, _, model = _model_session(tmp_path)
    sent = model.requests[-1]
    other_log = _log_with_one_exchange()  # holds ex-000001/0 and /1 with other texts

    record = view_record(sent, other_log)

    assert all(isinstance(item, dict) for item in record["selected_items"])
    assert view_from_record(record, other_log).to_dict() == sent.to_dict()


def test_a_stored_view_naming_an_item_the_log_lacks_fails_naming_it(tmp_path: Path) -> None:
    _, _, model = _model_session(tmp_path)
    record = view_record(model.requests[-1], None)
    record["selected_items"] = ["ex-000999/0"]

    with pytest.raises(ValueError, match="ex-000999/0"):
        view_from_record(record, _log_with_one_exchange())


def _log_of(closed: int) -> ExchangeLog:
    """``closed`` closed exchanges with 1, 2 or 3 items each, then one open exchange."""
    log = ExchangeLog("log-segments")
    for i in range(closed):
        exchange = log.open([{"role": "user", "content": f"question {i}"}])
        if i % 3 == 1:
            log.record_output(exchange.exchange_id, {"role": "assistant", "content": f"answer {i}"})
        elif i % 3 == 2:
            call = {"id": f"c{i}", "name": "look", "arguments": {"q": i}}
            log.record_output(exchange.exchange_id, {"role": "assistant", "content": None, "tool_calls": [call]})
            log.record_tool_result(exchange.exchange_id, f"c{i}", f"result {i}")
        log.close(exchange.exchange_id)
    log.open([{"role": "user", "content": "still open"}, {"role": "user", "content": "and more"}])
    return log


def _view_selecting(log: ExchangeLog, item_ids: list[str], texts: dict[str, str] | None = None) -> RequestView:
    """A real request view of ``log`` whose selection is rewritten to ``item_ids``."""
    view = RequestView.from_exchange_log(log)
    by_id = {f"{e.exchange_id}/{k}": m.json_text for e in log.exchanges for k, m in enumerate(e.items)}
    chosen = [(texts or {}).get(item_id, by_id[item_id]) for item_id in item_ids]
    exchanges = list(dict.fromkeys(item_id.rsplit("/", 1)[0] for item_id in item_ids))
    selection = dataclasses.replace(
        view.selection,
        selected_item_ids=tuple(item_ids),
        selected_exchange_ids=tuple(exchanges),
        omitted_exchange_ids=tuple(e.exchange_id for e in log.exchanges if e.exchange_id not in exchanges),
    )
    return dataclasses.replace(view, selected_items_json=tuple(chosen), selection=selection)


def _items(log: ExchangeLog, *numbers: int) -> list[str]:
    return [f"ex-{n:06d}/{k}" for n in numbers for k in range(len(log.exchange(f"ex-{n:06d}").items))]


@pytest.mark.parametrize(
    ("numbers", "expected"),
    [
        (range(1, 13), [["ex-000001", "ex-000011"], "ex-000012/0", "ex-000012/1"]),
        ([3, 4, 5, 7, 8, 9, 10, 11], [["ex-000003", "ex-000005"], ["ex-000007", "ex-000011"]]),
        ([11], [["ex-000011", "ex-000011"]]),
        ([], []),
    ],
)
def test_selections_fold_into_segments_of_closed_exchanges_and_read_back_exactly(
    numbers: range | list[int], expected: list[Any]
) -> None:
    log = _log_of(11)
    view = _view_selecting(log, _items(log, *numbers))

    record = view_record(view, log)

    assert record["selected_items"] == expected
    assert view_from_record(json.loads(json.dumps(record)), log).to_dict() == view.to_dict()


def test_a_partly_selected_or_altered_exchange_breaks_the_run_and_is_stored_item_by_item() -> None:
    log = _log_of(11)
    ids = _items(log, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    ids.remove("ex-000005/1")  # exchange 5 is only partly selected
    altered = {"ex-000008/0": canonical_json({"role": "user", "content": "not what the log holds"})}
    view = _view_selecting(log, ids, altered)

    record = view_record(view, log)

    assert record["selected_items"] == [
        ["ex-000001", "ex-000004"],
        "ex-000005/0",
        ["ex-000006", "ex-000007"],
        {"role": "user", "content": "not what the log holds"},
        "ex-000008/1",
        ["ex-000009", "ex-000009"],
    ]
    assert record["selection"]["selected_exchange_ids"] == [["ex-000001", "ex-000009"]]
    assert record["selection"]["omitted_exchange_ids"] == [["ex-000010", "ex-000011"], "ex-000012"]
    assert view_from_record(json.loads(json.dumps(record)), log).to_dict() == view.to_dict()
