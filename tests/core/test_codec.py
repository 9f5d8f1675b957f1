"""The strict state codec: lossless round-trips, and loud CodecErrors that name the field path."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import pytest

from qitos import StateSchema
from qitos.core._codec import canonical_json, decode_value, digest, encode_value, sha256_hex
from qitos.core._errors import CodecError


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclass
class Source:
    url: str
    seen_at: dt.datetime
    color: Color = Color.RED
    where: Point | None = None


@dataclass
class Base:
    name: str = "b"


@dataclass
class Derived(Base):
    extra: int = 1


@dataclass
class RichState(StateSchema):
    sources: list[Source] = field(default_factory=list)
    by_color: dict[Color, list[str]] = field(default_factory=dict)
    counts: dict[int, float] = field(default_factory=dict)
    pair: tuple[int, str] = (0, "")
    ragged: tuple[Point, ...] = ()
    tags: set[str] = field(default_factory=set)
    frozen_tags: frozenset[int] = frozenset()
    day: dt.date = dt.date(2020, 1, 1)
    maybe: Optional[Point] = None  # noqa: UP045 - exercise the typing.Optional spelling
    either: Union[int, str] = 0  # noqa: UP007 - exercise the typing.Union spelling
    either_pipe: Point | str | None = None
    mode: Literal["fast", "slow"] = "fast"
    color: Color = Color.BLUE
    anything: Any = None
    base: Base = field(default_factory=Base)


@dataclass
class UntypedState(StateSchema):
    anything: Any = None
    table: dict[str, Any] = field(default_factory=dict)


def _full() -> RichState:
    return RichState(
        task="t",
        current_step=2,
        max_steps=5,
        final_result="r",
        stop_reason="final",
        metadata={"k": [1, "two", {"three": None}]},
        metrics={"score": 0.5},
        sources=[
            Source("https://a", dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC), Color.BLUE, Point(1, 2)),
            Source("https://b", dt.datetime(2024, 5, 2, 8, 0)),
        ],
        by_color={Color.BLUE: ["x"], Color.RED: []},
        counts={3: 1.5, -1: 2.0},
        pair=(7, "seven"),
        ragged=(Point(0, 0), Point(3, 4)),
        tags={"b", "a"},
        frozen_tags=frozenset({3, 1}),
        day=dt.date(2025, 12, 31),
        maybe=Point(5, 6),
        either="text",
        either_pipe=Point(9, 9),
        mode="slow",
        color=Color.RED,
        anything={"nested": [1, 2.5, True, None]},
        base=Base("named"),
    )


def test_a_rich_subclass_round_trips_exactly() -> None:
    state = _full()
    data = state.to_dict()
    json.loads(canonical_json(data))  # JSON-native
    back = RichState.from_dict(json.loads(json.dumps(data)))
    assert back == state
    assert type(back.sources[0].seen_at) is dt.datetime and back.sources[0].seen_at.tzinfo is not None
    assert type(back.pair) is tuple and type(back.ragged[1]) is Point
    assert type(back.tags) is set and type(back.frozen_tags) is frozenset
    assert set(back.by_color) == {Color.BLUE, Color.RED} and all(type(k) is Color for k in back.by_color)
    assert all(type(k) is int for k in back.counts)
    assert back.color is Color.RED and back.sources[0].color is Color.BLUE
    assert back.to_dict() == data


def test_int_valued_enum_keys_round_trip() -> None:
    @dataclass
    class Levels(StateSchema):
        by_level: dict[Level, str] = field(default_factory=dict)
        level: Level = Level.LOW

    state = Levels(by_level={Level.HIGH: "h", Level.LOW: "l"}, level=Level.HIGH)
    back = Levels.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state
    assert all(type(k) is Level for k in back.by_level) and back.level is Level.HIGH


def test_defaults_round_trip() -> None:
    assert RichState.from_dict(RichState().to_dict()) == RichState()


def test_encoding_is_deterministic_for_sets() -> None:
    a = RichState(tags={"x", "y", "z"})
    b = RichState(tags={"z", "y", "x"})
    assert canonical_json(a.to_dict()) == canonical_json(b.to_dict())


# --------------------------------------------------------------------------- loud failures


def test_tuple_under_any_fails_naming_the_path() -> None:
    state = UntypedState(anything={"inner": (1, 2)})
    with pytest.raises(CodecError) as info:
        state.to_dict()
    assert info.value.path == "state.anything['inner']"
    assert "tuple" in str(info.value)


def test_object_under_any_fails_naming_the_path() -> None:
    state = UntypedState(table={"when": dt.datetime(2024, 1, 1)})
    with pytest.raises(CodecError) as info:
        state.to_dict()
    assert info.value.path == "state.table['when']"
    assert "datetime" in str(info.value)


def test_a_plain_object_in_metadata_fails_rather_than_becoming_none() -> None:
    state = StateSchema(metadata={"handle": object()})
    with pytest.raises(CodecError, match=r"state\.metadata\['handle'\]"):
        state.to_dict()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_fail_naming_the_path(bad: float) -> None:
    state = RichState(counts={1: bad})
    with pytest.raises(CodecError) as info:
        state.to_dict()
    assert info.value.path == "state.counts[1]"
    with pytest.raises(CodecError, match=r"state\.metrics\['x'\]"):
        StateSchema(metrics={"x": bad}).to_dict()


def test_a_subclass_instance_under_a_declared_base_type_fails() -> None:
    state = RichState(base=Derived("d", 2))
    with pytest.raises(CodecError) as info:
        state.to_dict()
    assert info.value.path == "state.base"
    assert "Derived" in str(info.value) and "Base" in str(info.value)


def test_a_subclass_instance_deep_in_a_list_fails_with_its_index() -> None:
    @dataclass
    class Holder(StateSchema):
        items: list[Base] = field(default_factory=list)

    with pytest.raises(CodecError) as info:
        Holder(items=[Base(), Base(), Derived()]).to_dict()
    assert info.value.path == "state.items[2]"


@pytest.mark.parametrize("key", [1, 2.5, (1, 2), None])
def test_non_string_keys_in_an_untyped_dict_fail(key: Any) -> None:
    with pytest.raises(CodecError, match=r"state\.metadata"):
        StateSchema(metadata={key: "v"}).to_dict()


def test_a_wrong_type_in_a_typed_field_fails_on_decode_with_the_path() -> None:
    data = _full().to_dict()
    data["sources"][1]["seen_at"] = "not a date"
    with pytest.raises(CodecError) as info:
        RichState.from_dict(data)
    assert info.value.path == "state.sources[1].seen_at"


def test_an_unknown_field_fails_on_decode() -> None:
    data = RichState().to_dict()
    data["surprise"] = 1
    with pytest.raises(CodecError, match="surprise"):
        RichState.from_dict(data)


def test_a_literal_outside_its_values_fails_both_ways() -> None:
    with pytest.raises(CodecError, match=r"state\.mode"):
        RichState(mode="medium").to_dict()  # type: ignore[arg-type]
    data = RichState().to_dict()
    data["mode"] = "medium"
    with pytest.raises(CodecError, match=r"state\.mode"):
        RichState.from_dict(data)


def test_a_value_matching_no_union_arm_fails() -> None:
    with pytest.raises(CodecError, match=r"state\.either"):
        RichState(either=1.5).to_dict()  # type: ignore[arg-type]


def test_a_wrong_tuple_length_fails() -> None:
    with pytest.raises(CodecError, match=r"state\.pair"):
        RichState(pair=(1, "a", 2)).to_dict()  # type: ignore[arg-type]


def test_codec_error_pickles_with_its_path() -> None:
    import pickle

    err = CodecError("state.x[1]", "bad")
    back = pickle.loads(pickle.dumps(err))
    assert back.path == "state.x[1]" and str(back) == str(err)


# --------------------------------------------------------------------------- canonical JSON and digests


def test_canonical_json_is_sorted_compact_and_utf8() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'


def test_canonical_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_digest_is_the_sha256_of_the_canonical_form() -> None:
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})
    assert digest({"a": 2, "b": 1}) == sha256_hex('{"a":2,"b":1}')
    assert len(sha256_hex(b"x")) == 64


def test_encode_and_decode_value_work_standalone() -> None:
    value = {"p": Point(1, 2)}
    hint = dict[str, Point]
    assert decode_value(encode_value(value, hint), hint) == value


@dataclass
class TypedState(StateSchema):
    count: int = 0
    ratio: float = 0.0
    name: str = ""
    flag: bool = False
    numbers: list[int] = field(default_factory=list)
    when: dt.datetime = dt.datetime(2020, 1, 1)
    day: dt.date = dt.date(2020, 1, 1)


@pytest.mark.parametrize(
    ("name", "value", "path"),
    [
        ("count", "3", "state.count"),
        ("count", True, "state.count"),
        ("count", 2.5, "state.count"),
        ("ratio", True, "state.ratio"),
        ("name", 5, "state.name"),
        ("flag", 1, "state.flag"),
        ("numbers", [1, "a"], "state.numbers[1]"),
        ("when", dt.date(2024, 1, 1), "state.when"),
        ("day", dt.datetime(2024, 1, 1, 5), "state.day"),
    ],
)
def test_a_value_of_the_wrong_type_fails_when_encoded_not_when_restored(name: str, value: Any, path: str) -> None:
    # Otherwise to_dict() succeeds, the snapshot is stored, and from_dict() fails (or changes the type) later.
    state = TypedState(**{name: value})
    with pytest.raises(CodecError) as info:
        state.to_dict()
    assert info.value.path == path


def test_an_int_in_a_float_field_round_trips_as_an_equal_number() -> None:
    back = TypedState.from_dict(TypedState(ratio=3).to_dict())
    assert back.ratio == 3.0 and type(back.ratio) is float


@pytest.mark.parametrize(
    ("value", "hint", "message"),
    [
        ({3: "x"}, dict, "dict key 3 cannot round-trip"),  # an undeclared key type: "3" would come back as a str
        ({"3": "x"}, dict[int, str], "dict key '3' is not a int"),
        ({Level.HIGH: "x"}, dict[Color, str], "is not a Color"),
        ({Color.RED: "x"}, dict[str, str], "is not a str"),  # a plain Enum key would come back as "red"
        ({1.5: "x"}, dict[float, str], "dict key 1.5 cannot round-trip"),
    ],
)
def test_a_dict_key_that_cannot_come_back_fails_when_encoded(value: Any, hint: Any, message: str) -> None:
    with pytest.raises(CodecError, match=message) as info:
        encode_value(value, hint, "state.table")
    assert info.value.path == "state.table"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        (Color.RED, str),  # a plain Enum member would come back as its value
        (Level.HIGH, Color),
        ("red", Color),
        ({"x": 1}, Point),
        ([1, 2], dict[str, int]),
        (Point(1, 2), list[int]),
        (3.0, int),
    ],
)
def test_a_value_of_another_type_fails_naming_both_types(value: Any, hint: Any) -> None:
    with pytest.raises(CodecError, match=r"declared .* but holds") as info:
        encode_value(value, hint, "state.x")
    assert info.value.path == "state.x"


def test_values_that_decode_back_equal_still_encode() -> None:
    cases: list[tuple[Any, Any]] = [
        (3, float),
        (Level.HIGH, int),
        (True, bool),
        (dt.datetime(2024, 1, 1, 5), Union[dt.date, dt.datetime]),  # noqa: UP007 - the arm order matters here
        (dt.date(2024, 1, 1), dt.datetime | dt.date),
        ({Level.LOW: 1}, dict[int, int]),
    ]
    for value, hint in cases:
        assert decode_value(json.loads(json.dumps(encode_value(value, hint))), hint) == value


def test_enum_keys_with_str_values_round_trip_and_unknown_keys_fail() -> None:
    hint = dict[Color, int]
    assert decode_value(encode_value({Color.BLUE: 1}, hint), hint) == {Color.BLUE: 1}
    with pytest.raises(CodecError, match="'green' is not a valid Color"):
        decode_value({"green": 1}, hint, "state.by_color")
    with pytest.raises(CodecError, match="'3' is not a valid Level"):
        decode_value({"3": 1}, dict[Level, int], "state.by_level")


def test_a_long_list_of_scalars_decodes_to_a_copy_and_still_rejects_a_wrong_item() -> None:
    texts = [f"item {i}" for i in range(1000)]
    decoded = decode_value(texts, list[str])
    assert decoded == texts and decoded is not texts
    assert decode_value([1, 2.5], list[float]) == [1.0, 2.5] and type(decode_value([1], list[float])[0]) is float
    with pytest.raises(CodecError, match=r"value\[1\]"):
        decode_value([1, True], list[int])
    with pytest.raises(CodecError, match=r"value\[2\]"):
        decode_value(["a", "b", 3], list[str])
    assert decode_value(["x", 1], list[Any]) == ["x", 1]


# --------------------------------------------------------------------------- bad input


def test_canonical_json_escapes_lone_surrogates_so_the_text_encodes_and_reads_back_the_same() -> None:
    value = {"a": "x\ud800y", "b": "é", "k\udfff": 1}
    text = canonical_json(value)
    assert "\\ud800" in text and "\\udfff" in text and "é" in text
    text.encode("utf-8")  # no UnicodeEncodeError
    assert json.loads(text) == value
    assert sha256_hex("\ud800") == sha256_hex("\ud800")  # raw text with a surrogate hashes too


def _cyclic() -> dict[str, Any]:
    d: dict[str, Any] = {"name": "loop"}
    d["self"] = d
    return d


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


def test_a_cyclic_value_is_a_codec_error_naming_where_it_closes() -> None:
    with pytest.raises(CodecError) as caught:
        encode_value({"items": [1, _cyclic()]}, path="state.data")
    assert caught.value.path == "state.data['items'][1]['self']" and "cyclic" in caught.value.message
    with pytest.raises(CodecError, match=r"value\['self'\]: the value is cyclic"):
        canonical_json(_cyclic())


@dataclass
class Node:
    children: list[Node] = field(default_factory=list)


def test_a_cyclic_dataclass_is_a_codec_error() -> None:
    node = Node()
    node.children.append(Node(children=[node]))
    with pytest.raises(CodecError, match="cyclic") as caught:
        encode_value(node, Node, path="state.tree")
    assert caught.value.path == "state.tree.children[0].children[0]"


def test_a_too_deeply_nested_value_is_a_codec_error_never_a_recursion_error() -> None:
    deep = _deep(5000)
    with pytest.raises(CodecError, match="nested 5001 levels deep") as caught:
        encode_value({"x": deep}, path="state.data")
    assert caught.value.path.startswith("state.data['x'][0][0]") and caught.value.path.endswith("...")
    with pytest.raises(CodecError, match="levels deep"):
        canonical_json(deep)
    stored: dict[str, Any] = {"children": []}
    for _ in range(3000):
        stored = {"children": [stored]}
    with pytest.raises(CodecError, match="levels deep"):
        decode_value(stored, Node, path="stored")
