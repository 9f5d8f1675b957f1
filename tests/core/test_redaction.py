"""The one redaction policy: configured values, token shapes and secret fields, in text and in data."""

from __future__ import annotations

import json

from qitos.core._redaction import REDACTED, Redactor, model_credentials, redact_text


def test_token_shapes_are_redacted_without_any_configuration() -> None:
    text = (
        "key sk-proj-abcdefghij12345 and Bearer abcdefgh.ijklmnop, gh ghp_"
        + "a" * 36
        + " pat github_pat_"
        + "B" * 30
        + " db postgresql://app:pg-pass-42@db/app"
    )
    out = redact_text(text)
    for secret in ("sk-proj", "abcdefgh.ijklmnop", "ghp_", "github_pat_", "pg-pass-42"):
        assert secret not in out, out
    assert "postgresql://app:[REDACTED]@db/app" in out and out.count(REDACTED) == 5


def test_configured_values_are_redacted_even_when_shaped_like_nothing() -> None:
    redactor = Redactor(["qk-live-7f3a9c2b1d8e6f40", "abc"])  # too short values are ignored
    assert redactor("use qk-live-7f3a9c2b1d8e6f40 abc") == f"use {REDACTED} abc"
    redactor.add_all(["second-secret"])
    assert redactor.secrets == ("qk-live-7f3a9c2b1d8e6f40", "second-secret")


def test_redact_value_walks_data_and_replaces_secret_fields_copying_only_what_changed() -> None:
    redactor = Redactor(["hunter2hunter2"])
    untouched = {"a": [1, "plain", {"b": None}], "n": 3}
    assert redactor.redact_value(untouched) is untouched
    value = {
        "task": "log in with hunter2hunter2",
        "headers": {"Authorization": "Basic xyz", "Accept": "json"},
        "args": ({"api_key": "anything", "count": 2},),
        "nested_json": json.dumps({"password": "p@ss"}),
        "kept": untouched,
    }
    out = redactor.redact_value(value)
    assert out["task"] == f"log in with {REDACTED}"
    assert out["headers"] == {"Authorization": REDACTED, "Accept": "json"}
    assert out["args"] == ({"api_key": REDACTED, "count": 2},)
    assert json.loads(out["nested_json"]) == {"password": REDACTED}
    assert out["kept"] is untouched and value["task"] == "log in with hunter2hunter2"


class _Model:
    api_key = "configured-key-1"

    def secrets(self) -> tuple[str, ...]:
        return ("configured-key-1", "header-secret-2", "x")


def test_model_credentials_reads_api_key_and_secrets() -> None:
    assert model_credentials(_Model()) == ("configured-key-1", "header-secret-2")
    assert model_credentials(object()) == ()


def test_a_password_in_a_urls_query_or_an_empty_user_is_redacted_in_any_scheme() -> None:
    keys = ("password", "passwd", "pwd", "secret", "token", "api_key", "apikey", "access_token")
    for key in keys:
        for scheme in ("postgresql", "https", "mysql+pymysql", "amqp"):
            url = f"{scheme}://app@/appdb?host=/tmp&{key.upper() if key == 'pwd' else key}=S3cret-{key}&schema=qitos"
            out = redact_text(f"connect to {url} now")
            assert f"S3cret-{key}" not in out, out
            assert "&schema=qitos now" in out and "?host=/tmp&" in out  # the rest stays readable
        assert redact_text(f"https://h/p?{key}=first-{key}")[-len(REDACTED) :] == REDACTED
    assert redact_text("redis://:R3disPw-991@cache:6379/0") == f"redis://:{REDACTED}@cache:6379/0"
    # Near misses keep their text: another key that starts like one, a key outside a URL's query.
    for plain in ("https://h/p?tokenizer=bpe&passwords_seen=3", "pwd=here in a shell", "http://h/p#token=x"):
        assert redact_text(plain) == plain, plain
    # Inside JSON text (tool arguments, stored payloads), the JSON stays valid.
    doc = json.dumps({"dsn": "postgresql://u@/db?password=pw-in-json&x=1", "n": [1]})
    out = redact_text(doc)
    assert "pw-in-json" not in out and json.loads(out)["dsn"] == f"postgresql://u@/db?password={REDACTED}&x=1"
