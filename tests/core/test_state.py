"""StateSchema: built-in fields, validation, set_stop, and incremental change tracking."""

from __future__ import annotations

import copy
import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qitos import StateSchema, StopReason
from qitos.core._errors import CodecError, StateValidationError
from qitos.core._state import apply_changes


@dataclass
class ResearchState(StateSchema):
    scratchpad: list[str] = field(default_factory=list)
    sources_visited: list[str] = field(default_factory=list)
    confidence: float = 0.0


@dataclass
class TrackedState(StateSchema):
    items: list[Any] = field(default_factory=list)
    table: dict[str, Any] = field(default_factory=dict)
    count: int = 0


# --------------------------------------------------------------------------- built-in fields


def test_builtin_fields_and_defaults_match_the_seed() -> None:
    names = [(f.name, f.default) for f in dataclasses.fields(StateSchema)]
    assert names == [
        ("schema_version", 1),
        ("task", ""),
        ("current_step", 0),
        ("max_steps", 10),
        ("final_result", None),
        ("stop_reason", None),
        ("metadata", dataclasses.MISSING),
        ("metrics", dataclasses.MISSING),
    ]
    state = StateSchema()
    assert state.metadata == {} and state.metrics == {}
    assert StateSchema().metadata is not state.metadata  # default_factory, not a shared dict


def test_subclass_adds_fields_after_the_builtin_ones() -> None:
    state = ResearchState(task="t", max_steps=20)
    assert state.scratchpad == [] and state.sources_visited == [] and state.confidence == 0.0
    assert [f.name for f in dataclasses.fields(state)][-3:] == ["scratchpad", "sources_visited", "confidence"]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [0, -1])
def test_max_steps_not_positive_is_rejected_naming_the_field(bad: int) -> None:
    with pytest.raises(StateValidationError, match="max_steps") as info:
        StateSchema(max_steps=bad)
    assert info.value.field == "max_steps"
    assert isinstance(info.value, ValueError)


def test_max_steps_below_current_step_is_rejected_at_construction() -> None:
    with pytest.raises(StateValidationError) as info:
        StateSchema(current_step=5, max_steps=4)
    assert info.value.field == "max_steps"
    assert "current_step" in str(info.value)


def test_max_steps_below_current_step_is_rejected_on_assignment() -> None:
    state = StateSchema(current_step=3, max_steps=10)
    with pytest.raises(StateValidationError, match="max_steps"):
        state.max_steps = 2
    with pytest.raises(StateValidationError, match="max_steps"):
        state.current_step = 11


def test_max_steps_equal_to_current_step_is_allowed() -> None:
    state = StateSchema(current_step=4, max_steps=4)
    assert state.max_steps == state.current_step == 4


# --------------------------------------------------------------------------- set_stop


def test_set_stop_accepts_the_enum_and_stores_its_string() -> None:
    state = StateSchema()
    state.set_stop(StopReason.MAX_STEPS_REACHED, final_result="Done.")
    assert state.stop_reason == "max_steps_reached"
    assert type(state.stop_reason) is str
    assert state.final_result == "Done."


def test_set_stop_accepts_the_equivalent_string() -> None:
    state = StateSchema()
    state.set_stop("agent_stop")
    assert state.stop_reason == StopReason.AGENT_STOP
    assert state.final_result is None


def test_set_stop_with_an_unknown_string_names_the_valid_reasons() -> None:
    state = StateSchema()
    with pytest.raises(StateValidationError, match="stop_reason") as info:
        state.set_stop("finished")
    assert "'finished'" in str(info.value)
    assert "max_steps_reached" in str(info.value)
    assert state.stop_reason is None


def test_stop_reason_is_a_str_enum_with_every_spec_value() -> None:
    expected = {
        "final",
        "max_steps_reached",
        "budget_time",
        "budget_tokens",
        "agent_stop",
        "critic_stop",
        "env_terminal",
        "paused",
        "awaiting_approval",
        "cancelled",
        "cancelled_immediate",
        "task_validation_failed",
        "context_budget_exceeded",
        "unrecoverable_error",
    }
    assert expected <= {r.value for r in StopReason}
    assert StopReason.FINAL == "final" and isinstance(StopReason.FINAL, str)  # type: ignore[comparison-overlap]


def test_running_out_of_steps_has_one_name_and_the_old_one_still_reads() -> None:
    assert StopReason.BUDGET_STEPS is StopReason.MAX_STEPS_REACHED  # type: ignore[comparison-overlap]  # the name stays importable
    assert "budget_steps" not in {r.value for r in StopReason}
    assert StopReason("budget_steps") is StopReason.MAX_STEPS_REACHED  # as earlier versions stored it
    state = StateSchema()
    state.set_stop("budget_steps")
    assert state.stop_reason == "max_steps_reached"
    with pytest.raises(ValueError):
        StopReason("budget_step")


# --------------------------------------------------------------------------- change tracking


def test_appends_are_recorded_as_an_extend_op() -> None:
    state = TrackedState.from_dict(TrackedState(items=["a"]).to_dict())
    state.items.append("b")
    state.items.extend(["c", "d"])
    assert state.drain_changes() == [{"op": "extend", "field": "items", "start": 1, "items": ["b", "c", "d"]}]
    assert state.drain_changes() == []


def test_dict_key_writes_are_recorded_as_a_keys_op() -> None:
    state = TrackedState.from_dict(TrackedState(table={"a": 1, "b": 2}).to_dict())
    state.table["c"] = 3
    del state.table["a"]
    assert state.drain_changes() == [{"op": "keys", "field": "table", "put": {"c": 3}, "delete": ["a"]}]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class KeyedState(StateSchema):
    by_color: dict[Color, int] = field(default_factory=dict)
    by_number: dict[int, str] = field(default_factory=dict)


def test_key_ops_encode_keys_as_to_dict_does() -> None:
    state = KeyedState(by_color={Color.BLUE: 0}, by_number={1: "one"})
    state.drain_changes()
    before = state.to_dict()
    state.by_color[Color.RED] = 1
    del state.by_color[Color.BLUE]
    state.by_number[3] = "three"
    ops = state.drain_changes()
    assert (
        apply_changes(copy.deepcopy(before), ops)
        == state.to_dict()
        == {
            **before,
            "by_color": {"red": 1},
            "by_number": {"1": "one", "3": "three"},
        }
    )


@dataclass
class OptionalContainers(StateSchema):
    numbers: list[int] | None = None
    table: dict[str, float] | None = None
    either: list[int] | dict[str, int] = field(default_factory=list)


def test_changes_to_optional_containers_are_encoded_with_their_item_types() -> None:
    state = OptionalContainers(numbers=[1], table={"a": 1.5}, either=[1])
    state.drain_changes()
    before = state.to_dict()
    state.numbers.append(2)  # type: ignore[union-attr]
    state.table["b"] = 2.5  # type: ignore[index]
    state.either.append(2)  # type: ignore[union-attr]
    ops = state.drain_changes()
    assert apply_changes(copy.deepcopy(before), ops) == state.to_dict()
    assert {op["field"]: op["op"] for op in ops} == {"numbers": "extend", "table": "keys", "either": "set"}


def test_a_wrong_typed_item_fails_when_drained_naming_its_path() -> None:
    state = OptionalContainers(numbers=[1])
    state.drain_changes()
    state.numbers.append("2")  # type: ignore[union-attr,arg-type]
    with pytest.raises(CodecError) as info:
        state.drain_changes()
    assert info.value.path == "state.numbers[1]"


def test_a_key_that_was_put_and_deleted_between_drains_is_not_an_error() -> None:
    state = KeyedState()
    state.drain_changes()
    state.by_number["x"] = "bad key"  # type: ignore[index]
    del state.by_number["x"]  # type: ignore[arg-type]
    assert state.drain_changes() == [{"op": "keys", "field": "by_number", "put": {}, "delete": []}]


def test_other_list_mutations_mark_the_field_replaced() -> None:
    state = TrackedState.from_dict(TrackedState(items=[3, 1, 2]).to_dict())
    state.items.sort()
    assert state.drain_changes() == [{"op": "set", "field": "items", "value": [1, 2, 3]}]


def test_a_change_inside_a_nested_container_marks_its_top_level_field() -> None:
    state = TrackedState.from_dict(TrackedState(items=[{"tags": []}], table={"inner": {"x": 1}}).to_dict())
    state.items[0]["tags"].append("new")
    state.table["inner"]["y"] = 2
    ops = {op["field"]: op for op in state.drain_changes()}
    assert ops["items"] == {"op": "set", "field": "items", "value": [{"tags": ["new"]}]}
    assert ops["table"] == {"op": "set", "field": "table", "value": {"inner": {"x": 1, "y": 2}}}


def test_containers_added_later_are_tracked_too() -> None:
    state = TrackedState()
    state.drain_changes()
    state.items.append([])
    state.drain_changes()
    state.items[0].append("deep")
    assert state.drain_changes() == [{"op": "set", "field": "items", "value": [["deep"]]}]


def test_from_dict_starts_with_an_empty_journal() -> None:
    state = TrackedState.from_dict(TrackedState(items=[1], count=2).to_dict())
    assert state.drain_changes() == []


# A mutation is (kind, payload); applied with hypothesis-generated sequences below.
_scalars = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans(), st.none())
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=6,
)
_keys = st.sampled_from(["a", "b", "c", "d"])
_mutations = st.one_of(
    st.tuples(st.just("append"), _values),
    st.tuples(st.just("extend"), st.lists(_values, max_size=3)),
    st.tuples(st.just("insert0"), _values),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("setitem0"), _values),
    st.tuples(st.just("reverse"), st.none()),
    st.tuples(st.just("nested_append"), _values),
    st.tuples(st.just("put"), st.tuples(_keys, _values)),
    st.tuples(st.just("del"), _keys),
    st.tuples(st.just("update"), st.dictionaries(_keys, _values, max_size=2)),
    st.tuples(st.just("nested_put"), st.tuples(_keys, _values)),
    st.tuples(st.just("count"), st.integers(0, 100)),
    st.tuples(st.just("replace_items"), st.lists(_values, max_size=3)),
    st.tuples(st.just("drain"), st.none()),
)


def _mutate(state: TrackedState, kind: str, payload: Any) -> None:
    if kind == "append":
        state.items.append(payload)
    elif kind == "extend":
        state.items.extend(payload)
    elif kind == "insert0":
        state.items.insert(0, payload)
    elif kind == "pop" and state.items:
        state.items.pop()
    elif kind == "setitem0" and state.items:
        state.items[0] = payload
    elif kind == "reverse":
        state.items.reverse()
    elif kind == "nested_append":
        for item in state.items:
            if isinstance(item, list):
                item.append(payload)
                break
    elif kind == "put":
        state.table[payload[0]] = payload[1]
    elif kind == "del" and payload in state.table:
        del state.table[payload]
    elif kind == "update":
        state.table.update(payload)
    elif kind == "nested_put":
        for value in state.table.values():
            if isinstance(value, dict):
                value[payload[0]] = payload[1]
                break
    elif kind == "count":
        state.count = payload
    elif kind == "replace_items":
        state.items = payload


@settings(max_examples=100, deadline=None)
@given(
    initial=st.lists(_values, max_size=3), table=st.dictionaries(_keys, _values, max_size=3), ops=st.lists(_mutations)
)
def test_applying_drained_changes_reproduces_the_state(
    initial: list[Any], table: dict[str, Any], ops: list[tuple[str, Any]]
) -> None:
    state = TrackedState(items=copy.deepcopy(initial), table=copy.deepcopy(table))
    state.drain_changes()
    stored = state.to_dict()
    for kind, payload in ops:
        if kind == "drain":
            stored = apply_changes(stored, state.drain_changes())
            assert stored == state.to_dict()
        else:
            _mutate(state, kind, copy.deepcopy(payload))
    before = copy.deepcopy(stored)
    changes = state.drain_changes()
    assert apply_changes(before, changes) == state.to_dict()
    assert TrackedState.from_dict(before).to_dict() == state.to_dict()


def test_apply_changes_refuses_an_extend_that_does_not_follow_the_stored_value() -> None:
    state = TrackedState.from_dict(TrackedState(items=[1, 2]).to_dict())
    state.items.append(3)
    changes = state.drain_changes()
    with pytest.raises(Exception, match=r"state\.items"):
        apply_changes({"items": [1]}, changes)


def test_str_of_a_state_is_a_readable_rendering_task_first() -> None:
    @dataclass
    class Shelf(StateSchema):
        books: list[str] = field(default_factory=list)
        shelves: dict[str, int] = field(default_factory=dict)
        empty: list[int] = field(default_factory=list)
        label: str | None = None

    state = Shelf(task="sort the shelf", books=["Dune", "Emma"], shelves={"top": 2})
    assert str(state) == "Task: sort the shelf\nBooks:\n- Dune\n- Emma\nShelves:\n- top: 2"
    state.final_result = "sorted"
    assert str(state).endswith("\nFinal result: sorted")
    assert "Shelf(schema_version=1" in repr(state)  # repr stays the dataclass repr


def test_assigning_a_cyclic_or_too_deep_container_is_a_codec_error_naming_the_field() -> None:
    @dataclass
    class Holder(StateSchema):
        data: Any = None
        items: list[Any] = field(default_factory=list)

    state = Holder()
    loop: dict[str, Any] = {}
    loop["again"] = loop
    with pytest.raises(CodecError, match="cyclic") as caught:
        state.data = loop
    assert caught.value.path == "state.data['again']"
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(CodecError, match="levels deep") as caught:
        state.items.append(deep)
    assert caught.value.path.startswith("state.items")
