"""``OutputSpec``: an output type's JSON schema, validation and codec round-trip (dataclasses and
pydantic models; pydantic is never imported by qitos itself)."""

from __future__ import annotations

import datetime as dt
import enum
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest
from pydantic import BaseModel

from qitos.core._codec import decode_value, encode_value
from qitos.core._errors import CodecError, ConfigurationError
from qitos.core._output import FINAL_ANSWER_TOOL, OutputSpec, OutputValidationError
from qitos.core._state import StateSchema


class Sky(enum.Enum):
    CLEAR = "clear"
    RAIN = "rain"


@dataclass(frozen=True)
class Place:
    city: str
    country: str = "FR"


@dataclass(frozen=True)
class Weather:
    place: Place
    celsius: float
    sky: Sky
    unit: Literal["C", "F"] = "C"
    notes: list[str] = field(default_factory=list)
    seen_at: dt.datetime | None = None


class Forecast(BaseModel):
    city: str
    days: list[int]


def test_a_dataclass_schema_is_an_object_of_its_fields_with_nested_dataclasses_inline() -> None:
    spec = OutputSpec.of(Weather)
    schema = spec.schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["place", "celsius", "sky"]
    props = schema["properties"]
    assert props["place"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    assert props["sky"] == {"enum": ["clear", "rain"]} and props["unit"] == {"enum": ["C", "F"]}
    assert props["seen_at"] == {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]}
    tool = spec.tool_schema()
    assert tool["name"] == FINAL_ANSWER_TOOL and tool["parameters"] == schema and "Weather" in tool["description"]
    assert OutputSpec.of(Weather) is spec  # one spec per type


def test_a_valid_answer_becomes_the_typed_value() -> None:
    data = {"place": {"city": "Paris"}, "celsius": 21, "sky": "clear", "seen_at": "2025-06-01T12:00:00"}
    value = OutputSpec.of(Weather).validate(data)
    assert value == Weather(Place("Paris"), 21.0, Sky.CLEAR, seen_at=dt.datetime(2025, 6, 1, 12))
    assert OutputSpec.of(Weather).parse(
        "```json\n" + '{"place": {"city": "Lyon"}, "celsius": 3.5, "sky": "rain"}\n```'
    ) == (Weather(Place("Lyon"), 3.5, Sky.RAIN))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"celsius": 1, "sky": "clear"}, "answer: missing required argument 'place'"),
        ({"place": {"city": "Paris"}, "celsius": "warm", "sky": "clear"}, "answer.celsius: expected number"),
        ({"place": {"city": "Paris"}, "celsius": 1, "sky": "snow"}, "answer.sky: 'snow' is not one of"),
        ({"place": {"town": "Paris"}, "celsius": 1, "sky": "clear"}, "answer.place: unexpected argument 'town'"),
        ({"place": {"city": "Paris"}, "celsius": 1, "sky": "clear", "seen_at": "noon"}, "is not an ISO datetime"),
        (["Paris", 21], "answer: expected object"),
    ],
)
def test_an_answer_that_does_not_validate_names_each_problem(data: object, problem: str) -> None:
    with pytest.raises(OutputValidationError) as info:
        OutputSpec.of(Weather).validate(data)
    assert any(problem in p for p in info.value.problems), info.value.problems
    assert "not a valid Weather" in OutputSpec.of(Weather).feedback(info.value.problems)


def test_text_that_is_not_json_is_a_problem_too() -> None:
    with pytest.raises(OutputValidationError, match="the answer is not JSON"):
        OutputSpec.of(Weather).parse("It is sunny in Paris.")


def test_a_pydantic_model_brings_its_own_schema_and_validation() -> None:
    spec = OutputSpec.of(Forecast)
    assert spec.schema == Forecast.model_json_schema()
    assert spec.validate({"city": "Oslo", "days": [1, 2]}) == Forecast(city="Oslo", days=[1, 2])
    with pytest.raises(OutputValidationError) as info:
        spec.validate({"city": "Oslo", "days": ["soon"]})
    assert info.value.problems[0].startswith("days.0: ")


@dataclass
class Loop:
    next: Loop | None = None


@pytest.mark.parametrize(
    ("output_type", "match"),
    [
        (int, "must be a dataclass or a pydantic model class"),
        (Weather(Place("x"), 1.0, Sky.RAIN), "must be a dataclass or a pydantic model class"),
        (Loop, "contains itself"),
    ],
)
def test_an_output_type_that_cannot_be_one_is_a_configuration_error(output_type: object, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        OutputSpec.of(output_type)


@dataclass
class Report(StateSchema):
    forecast: Forecast | None = None
    weather: Weather | None = None


def test_typed_values_round_trip_the_codec_in_a_state() -> None:
    state = Report(task="t", forecast=Forecast(city="Oslo", days=[3]), weather=Weather(Place("Nice"), 30.0, Sky.CLEAR))
    data = state.to_dict()
    assert data["forecast"] == {"city": "Oslo", "days": [3]}
    again = Report.from_dict(data)
    assert again.forecast == state.forecast and isinstance(again.forecast, Forecast)
    assert again.weather == state.weather
    assert decode_value(encode_value(Forecast(city="A", days=[]), Forecast), Forecast) == Forecast(city="A", days=[])


def test_the_codec_refuses_what_would_not_come_back() -> None:
    class Extended(Forecast):
        note: str = ""

    with pytest.raises(CodecError, match="subclass instance cannot round-trip"):
        encode_value(Extended(city="A", days=[]), Forecast, "state.forecast")
    with pytest.raises(CodecError, match=r"state.forecast: not a valid Forecast"):
        decode_value({"city": "A"}, Forecast, "state.forecast")


def test_qitos_never_imports_pydantic_itself() -> None:
    code = "import sys, qitos, qitos.core._output; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
