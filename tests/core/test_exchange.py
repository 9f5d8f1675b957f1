"""ExchangeLog: items, exchange lifecycle, event sourcing and the digest chain."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import UsageError
from qitos.core._exchange import (
    EXCHANGE_LOG_SCHEMA,
    ExchangeIdRange,
    ExchangeLog,
    ExchangeLogError,
    ItemIdRange,
    LoggedToolCall,
    Message,
)


def tool_turn(log: ExchangeLog, question: str, calls: int = 1, *, close: bool = True) -> str:
    exchange = log.open([{"role": "user", "content": question}])
    eid = exchange.exchange_id
    log.record_output(
        eid,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"{eid}-c{k}", "name": "lookup", "arguments": {"k": k}} for k in range(calls)],
        },
    )
    for k in range(calls):
        log.record_tool_result(eid, f"{eid}-c{k}", f"result {k}")
    if close:
        log.close(eid)
    return eid


def test_exchange_ids_are_sequential_and_deterministic() -> None:
    log = ExchangeLog("log-a")
    ids = [tool_turn(log, f"q{i}") for i in range(3)]
    assert ids == ["ex-000001", "ex-000002", "ex-000003"]
    assert [e.index for e in log.exchanges] == [0, 1, 2]


def test_an_exchange_holds_inputs_output_and_tool_results_in_order() -> None:
    log = ExchangeLog()
    eid = tool_turn(log, "what is 2+2?", calls=2)
    exchange = log.exchange(eid)
    assert exchange.closed
    assert [m.role for m in exchange.items] == ["user", "assistant", "tool", "tool"]
    assert exchange.output is not None
    assert exchange.output.tool_calls[1] == LoggedToolCall(id=f"{eid}-c1", name="lookup", arguments={"k": 1})
    assert exchange.digest == sha256_hex("\n".join(m.json_text for m in exchange.items))


def test_message_objects_and_plain_mappings_are_equivalent() -> None:
    a, b = ExchangeLog("x"), ExchangeLog("x")
    a.open([Message(role="user", content="hi")])
    b.open([{"role": "user", "content": "hi"}])
    assert a.digest == b.digest
    assert a.exchanges[0].inputs == b.exchanges[0].inputs


def test_tool_call_arguments_given_as_json_text_become_an_object() -> None:
    log = ExchangeLog()
    eid = log.open([{"role": "user", "content": "go"}]).exchange_id
    out = log.record_output(
        eid, {"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": '{"path": "a.txt"}'}]}
    )
    assert out.tool_calls[0].arguments == {"path": "a.txt"}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"role": "robot", "content": "x"}, "role"),
        ({"role": "user", "content": 5}, "content"),
        ({"role": "user", "content": "x", "extra": 1}, "unknown key"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "tool_call_id"),
        ({"role": "tool", "content": "x", "tool_call_id": "c"}, "record_tool_result"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": {}}]},
            "without tool calls",
        ),
        ("just text", "expected a message or mapping"),
    ],
)
def test_invalid_input_items_raise_a_clear_error(item: Any, message: str) -> None:
    log = ExchangeLog()
    with pytest.raises(ExchangeLogError, match=message):
        log.open([item])
    assert log.exchange_count == 0 and log.position == 0  # nothing half-applied


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ({"role": "user", "content": "x"}, "assistant"),
        ({"role": "assistant", "tool_calls": [{"id": "", "name": "f"}]}, r"tool_calls\[0\]\.id"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": "[1]"}]}, "JSON object"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": "{nope"}]}, "valid JSON"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "name": "f"}, {"id": "c", "name": "g"}]},
            "duplicate tool call id",
        ),
        ({"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": {"x": {1, 2}}}]}, "JSON-native"),
    ],
)
def test_invalid_outputs_raise_a_clear_error(output: Any, message: str) -> None:
    log = ExchangeLog()
    eid = log.open([{"role": "user", "content": "q"}]).exchange_id
    with pytest.raises(ExchangeLogError, match=message):
        log.record_output(eid, output)
    assert log.exchange(eid).output is None


def test_tool_result_for_an_unknown_call_id_is_rejected() -> None:
    log = ExchangeLog()
    eid = tool_turn(log, "q", close=False)
    with pytest.raises(ExchangeLogError, match="declares no tool call 'nope'"):
        log.record_tool_result(eid, "nope", "x")


def test_a_tool_result_recorded_twice_is_rejected() -> None:
    log = ExchangeLog()
    eid = tool_turn(log, "q", close=False)
    with pytest.raises(ExchangeLogError, match="already has a result"):
        log.record_tool_result(eid, f"{eid}-c0", "again")
    assert log.exchange(eid).tool_results[0].content == "result 0"


def test_closing_with_missing_tool_results_raises_and_keeps_the_exchange_open() -> None:
    log = ExchangeLog()
    eid = log.open([{"role": "user", "content": "q"}]).exchange_id
    log.record_output(eid, {"role": "assistant", "tool_calls": [{"id": "a", "name": "f"}, {"id": "b", "name": "f"}]})
    log.record_tool_result(eid, "a", "ok")
    with pytest.raises(ExchangeLogError, match=r"\['b'\] have no result"):
        log.close(eid)
    assert log.open_exchange is not None and log.open_exchange.pending_tool_call_ids == ("b",)


def test_closed_exchanges_never_change() -> None:
    log = ExchangeLog()
    eid = tool_turn(log, "q")
    with pytest.raises(ExchangeLogError, match="closed"):
        log.record_output(eid, {"role": "assistant", "content": "late"})
    with pytest.raises(ExchangeLogError, match="closed"):
        log.close(eid)


def test_only_one_exchange_may_be_open() -> None:
    log = ExchangeLog()
    log.open([{"role": "user", "content": "q"}])
    with pytest.raises(ExchangeLogError, match="still open"):
        log.open([{"role": "user", "content": "q2"}])


def test_output_recorded_twice_is_rejected() -> None:
    log = ExchangeLog()
    eid = log.open([{"role": "user", "content": "q"}]).exchange_id
    log.record_output(eid, {"role": "assistant", "content": "a"})
    with pytest.raises(ExchangeLogError, match="already has an output"):
        log.record_output(eid, {"role": "assistant", "content": "b"})


def test_unknown_exchange_id_is_named_in_the_error() -> None:
    with pytest.raises(ExchangeLogError, match="unknown exchange 'ex-999999'"):
        ExchangeLog().close("ex-999999")


def test_non_string_tool_results_are_stored_as_canonical_json() -> None:
    log = ExchangeLog()
    eid = tool_turn(log, "q", close=False)
    log.exchange(eid)
    log2 = ExchangeLog()
    eid2 = log2.open([{"role": "user", "content": "q"}]).exchange_id
    log2.record_output(eid2, {"role": "assistant", "tool_calls": [{"id": "c", "name": "f"}]})
    log2.record_tool_result(eid2, "c", {"b": 1, "a": [1, 2]})
    assert log2.exchange(eid2).tool_results[0].content == '{"a":[1,2],"b":1}'


def test_digest_is_a_hash_chain_over_canonical_entries() -> None:
    log = ExchangeLog()
    tool_turn(log, "q")
    expected = sha256_hex(EXCHANGE_LOG_SCHEMA)
    for entry in log.entries():
        expected = sha256_hex(expected + canonical_json(entry))
    assert log.digest == expected
    assert log.position == 4


def test_the_hash_chain_holds_for_every_kind_of_tool_result_content() -> None:
    # Each op hashes a canonical text it assembles itself: it must equal canonical_json(entry).
    log = ExchangeLog()
    eid = log.open([{"role": "user", "content": 'quote " back\\slash\nnew line — ü \x01'}]).exchange_id
    contents: list[Any] = [None, "", 'a "quoted"\ttab', "naïve — 日本 \u2028", {"z": [1, 2.5], "a": None}, [True]]
    calls: list[dict[str, Any]] = [
        {"id": f'call "{k}" ü', "name": "lookup", "arguments": {}} for k in range(len(contents))
    ]
    log.record_output(eid, {"role": "assistant", "content": None, "tool_calls": calls})
    for call, content in zip(calls, contents, strict=True):
        log.record_tool_result(eid, call["id"], content)
    log.close(eid)
    expected = sha256_hex(EXCHANGE_LOG_SCHEMA)
    for entry in log.entries():
        expected = sha256_hex(expected + canonical_json(entry))
    assert log.digest == expected
    assert ExchangeLog.replay(log.entries(), log_id="copy").digest == log.digest


def test_replay_rebuilds_an_identical_log() -> None:
    log = ExchangeLog("session-log")
    for i in range(5):
        tool_turn(log, f"q{i}", calls=i % 3)
    log.open([{"role": "user", "content": "still open"}])
    wire = json.loads(json.dumps(log.entries()))  # through real JSON, as a store would
    copy = ExchangeLog.replay(wire, log_id="session-log")
    assert copy.digest == log.digest
    assert copy.exchanges == log.exchanges
    assert copy.entries() == log.entries()


def test_incremental_persistence_with_extend_entries() -> None:
    log = ExchangeLog("s")
    tool_turn(log, "one")
    saved = log.entries()
    mark = log.position
    tool_turn(log, "two")
    restored = ExchangeLog.replay(saved, log_id="s")
    restored.extend_entries(log.entries(mark))
    assert restored.digest == log.digest and restored.position == log.position


def test_replay_rejects_entries_out_of_order() -> None:
    log = ExchangeLog()
    tool_turn(log, "q")
    entries = log.entries()
    entries[0]["exchange_id"] = "ex-000007"
    with pytest.raises(ExchangeLogError, match=r"entries\[0\].*next exchange is 'ex-000001'"):
        ExchangeLog.replay(entries, log_id="x")


def test_replay_rejects_an_unknown_op() -> None:
    with pytest.raises(ExchangeLogError, match="unknown op 'delete'"):
        ExchangeLog.replay([{"op": "delete", "exchange_id": "ex-000001"}], log_id="x")


def test_entries_are_copies() -> None:
    log = ExchangeLog()
    tool_turn(log, "q")
    entries = log.entries()
    entries[0]["inputs"][0]["content"] = "tampered"
    assert log.exchanges[0].inputs[0].content == "q"
    with pytest.raises(ExchangeLogError, match="outside"):
        log.entries(99)


def test_digest_does_not_depend_on_the_log_id() -> None:
    a, b = ExchangeLog("a"), ExchangeLog("b")
    tool_turn(a, "q")
    tool_turn(b, "q")
    assert a.digest == b.digest


def test_exchange_log_error_is_a_usage_error_and_pickles() -> None:
    err = ExchangeLogError("bad")
    assert isinstance(err, UsageError)
    assert str(pickle.loads(pickle.dumps(err))) == "bad"


def test_the_projection_index_covers_closed_exchanges_only() -> None:
    log = ExchangeLog()
    tool_turn(log, "a", calls=2)
    tool_turn(log, "b", close=False)
    proj = log.projection()
    assert proj.closed_count == 1
    assert proj.item_ids == ["ex-000001/0", "ex-000001/1", "ex-000001/2", "ex-000001/3"]
    assert proj.item_offsets == [0, 4]


def test_exchange_id_ranges_behave_like_tuples_of_ids() -> None:
    ids = ExchangeIdRange(2, 6)
    expected = ("ex-000003", "ex-000004", "ex-000005", "ex-000006")
    assert ids == expected and expected == ids and list(ids) == list(expected)
    assert ids != expected[:-1] and len(ids) == 4
    assert ids[0] == "ex-000003" and ids[-1] == "ex-000006" and ids[1:3] == expected[1:3]
    assert "ex-000004" in ids and "ex-000002" not in ids and "ex-4" not in ids and 4 not in ids  # type: ignore[comparison-overlap]
    assert ids + ("x",) == (*expected, "x") and ("x",) + ids == ("x", *expected)  # noqa: RUF005
    assert hash(ids) == hash(expected)
    assert ExchangeIdRange(0, 0) == () and repr(ExchangeIdRange(0, 0)) == "()"
    assert "ex-000003..ex-000006 (4)" in repr(ids)
    with pytest.raises(IndexError):
        ids[4]


def test_item_id_ranges_match_the_projection() -> None:
    log = ExchangeLog()
    for calls in (0, 2, 1, 3):
        tool_turn(log, "q", calls=calls) if calls else _plain_turn(log)
    proj = log.projection()
    lazy = ItemIdRange(proj.item_offsets, 0, len(proj.item_ids))
    assert list(lazy) == proj.item_ids and lazy == tuple(proj.item_ids)
    assert [lazy[i] for i in range(len(lazy))] == proj.item_ids
    assert lazy[3:7] == tuple(proj.item_ids[3:7]) and list(lazy[3:7]) == proj.item_ids[3:7]
    assert ItemIdRange(proj.item_offsets, 5, 5) == ()


def _plain_turn(log: ExchangeLog) -> None:
    eid = log.open([{"role": "user", "content": "hi"}]).exchange_id
    log.record_output(eid, {"role": "assistant", "content": "hello"})
    log.close(eid)


def test_entries_json_is_the_canonical_text_of_the_entries_from_a_position() -> None:
    log = ExchangeLog()
    tool_turn(log, "q — ü")
    mark = log.position
    tool_turn(log, "second", calls=2)
    assert log.entries_json() == canonical_json(log.entries())
    assert log.entries_json(mark) == canonical_json(log.entries(mark))
    assert log.entries_json(log.position) == "[]"
    with pytest.raises(ExchangeLogError, match="outside"):
        log.entries_json(log.position + 1)
