"""Redactor: secret field values are removed at any JSON nesting depth and the text around them is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qitos.trace._redact import REDACTED, Redactor

SECRETS = {
    "api_key": "plain-value-123",
    "Authorization": "Basic dXNlcjpwYXNz",
    "x-api-key": "xk-0987654321",
    "access_token": "tok-abcdef",
    "secret": 'has "quotes" and \\ backslash',
    "password": "ends with a backslash \\",
}


def _nest(value: Any, depth: int) -> str:
    text = json.dumps(value)
    for _ in range(depth):
        text = json.dumps({"output": text})
    return text


def _unnest(text: str, depth: int) -> Any:
    value = json.loads(text)
    for _ in range(depth):
        value = json.loads(value["output"])
    return value


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_secret_fields_are_redacted_at_any_json_depth_and_the_json_stays_valid(depth: int) -> None:
    record = {"model": "m", **SECRETS, "after": "kept"}
    out = Redactor()(_nest(record, depth))
    assert _unnest(out, depth) == {"model": "m", **{k: REDACTED for k in SECRETS}, "after": "kept"}


def test_a_value_cut_off_before_its_closing_quote_is_redacted_to_the_end() -> None:
    assert Redactor()('{"api_key": "cut-off-secr') == f'{{"api_key": "{REDACTED}'


def test_other_fields_and_empty_values_are_left_alone() -> None:
    text = json.dumps({"api_key_hint": "visible", "secret": "", "note": "password: not json"})
    out = Redactor()(text)
    assert json.loads(out) == {"api_key_hint": "visible", "secret": REDACTED, "note": "password: not json"}


def test_known_secret_values_are_replaced_anywhere() -> None:
    redactor = Redactor(["hunter2hunter2"])
    redactor.add("another-secret")
    assert redactor("a hunter2hunter2 b another-secret") == f"a {REDACTED} b {REDACTED}"
