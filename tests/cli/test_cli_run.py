"""``qitos run MODULE:Class "task"``: models, sessions, budgets, failures and usage errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from qitos.trace import open_run

RUN_KEYS = {
    "run_id",
    "session_id",
    "status",
    "stop_reason",
    "steps",
    "session_steps",
    "final_result",
    "tokens",
    "run_dir",
    "error",
}
SECRET = "sk-test-0123456789abcdef"


def _script(workdir: Path, responses: list[Any], name: str = "script.json") -> str:
    (workdir / name).write_text(json.dumps(responses), encoding="utf-8")
    return f"scripted:{name}"


ECHO_THEN_ANSWER = [{"tool_calls": [{"name": "echo", "arguments": {"text": "hi there"}}]}, "all done"]


def test_run_with_a_scripted_model_file_takes_the_model_path(cli: Any, workdir: Path) -> None:
    model = _script(workdir, ECHO_THEN_ANSWER)
    data = cli.json("run", "cli_agents:ModelAgent", "say hi", "--model", model, "--json")
    assert set(data) == RUN_KEYS
    assert (data["status"], data["stop_reason"], data["steps"], data["final_result"]) == (
        "completed",
        "final",
        2,
        "all done",
    )
    assert data["session_id"] is None
    steps = open_run(data["run_dir"]).steps()
    assert steps[0]["results"][0]["output"] == "hi there"
    assert steps[0]["request_view"]["exchanges"]["selected"]


def test_run_human_output_shows_the_call_its_result_and_the_answer(cli: Any, workdir: Path) -> None:
    model = _script(workdir, ECHO_THEN_ANSWER)
    out = cli.run("run", "cli_agents:ModelAgent", "say hi", "--model", model, code=0).stdout
    assert 'echo(text="hi there")' in out
    assert "ok  echo: hi there" in out
    assert "context " in out  # the request's budget use
    assert "answer:\nall done" in out
    assert "trace: " in out


def test_run_prints_tool_output_and_answers_literally_never_as_markup(cli: Any, workdir: Path) -> None:
    out = cli.run("run", "cli_agents:MarkupAgent", "t", code=0).stdout
    assert "[bold red]not markup[/] <script>x()</script>" in out
    assert "[link=http://evil]click[/link]" in out


def test_run_with_a_session_db_creates_a_resumable_session(cli: Any, workdir: Path) -> None:
    data = cli.json("run", "cli_agents:ApprovalAgent", "publish", "--session-db", "s.db", "--json")
    assert data["session_id"].startswith("ses_")
    assert data["stop_reason"] == "awaiting_approval"  # a normal, requested stop: exit 0
    listed = cli.json("sessions", "list", "--db", "s.db", "--json")
    assert [s["session_id"] for s in listed["sessions"]] == [data["session_id"]]
    assert listed["sessions"][0]["agent"] == "cli_agents:ApprovalAgent"


def test_run_that_never_finishes_stops_at_its_step_budget_with_exit_1(cli: Any, workdir: Path) -> None:
    data = cli.json("run", "cli_agents:LoopAgent", "loop", "--max-steps", "3", "--json", code=1)
    assert (data["status"], data["stop_reason"], data["steps"]) == ("stopped", "max_steps_reached", 3)


def test_run_whose_agent_raises_fails_with_exit_1_and_shows_the_error(cli: Any, workdir: Path) -> None:
    result = cli.run("run", "cli_agents:BrokenAgent", "x", code=1)
    assert "reduce exploded" in result.stdout
    assert "failed · unrecoverable_error" in result.stdout
    data = cli.json("run", "cli_agents:BrokenAgent", "x", "--json", code=1)
    assert data["status"] == "failed" and "reduce exploded" in data["error"]


def test_model_path_without_a_model_is_a_usage_error(cli: Any, workdir: Path) -> None:
    result = cli.run("run", "cli_agents:ModelAgent", "t", code=2)
    assert "ModelAgent decides through a model" in result.stderr and "pass --model" in result.stderr
    assert not (workdir / "runs").exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["nocolon", "t"], 2, "module:Class"),
        (["no_such_module_xyz:Agent", "t"], 2, "cannot import agent module"),
        (["cli_agents:Missing", "t"], 2, "has no 'Missing'"),
        (["cli_agents:NotAnAgent", "t"], 2, "not an AgentModule"),
        (["cli_agents:ModelAgent", "t", "--model", "gpt-4"], 2, "unknown --model"),
        (["cli_agents:ModelAgent", "t", "--model", "openai"], 2, "needs a model name"),
        (["cli_agents:ModelAgent", "t", "--model", "scripted"], 2, "scripted needs a file"),
        (["cli_agents:ModelAgent", "t", "--model", "scripted:missing.json"], 3, "no scripted model file"),
        (["cli_agents:ModelAgent", "t", "--base-url", "http://127.0.0.1:9/v1"], 2, "--base-url needs"),
        (["cli_agents:ModelAgent", "t", "--max-steps", "0"], 2, ""),
    ],
)
def test_run_usage_errors_exit_with_one_clear_line(
    cli: Any, workdir: Path, args: list[str], code: int, message: str
) -> None:
    result = cli.run("run", *args, code=code)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    if code != 2 or message:
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_scripted_model_file_that_is_not_a_json_list_is_a_usage_error(cli: Any, workdir: Path) -> None:
    (workdir / "bad.json").write_text("{not json", encoding="utf-8")
    assert (
        "cannot read scripted model file"
        in cli.run("run", "cli_agents:ModelAgent", "t", "--model", "scripted:bad.json", code=2).stderr
    )
    (workdir / "obj.json").write_text('{"a": 1}', encoding="utf-8")
    assert (
        "must hold a JSON list"
        in cli.run("run", "cli_agents:ModelAgent", "t", "--model", "scripted:obj.json", code=2).stderr
    )


# --------------------------------------------------------------------------- a real HTTP model


class _ChatHandler(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]]
    refuses_streaming_with_tools = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization"), "body": body})
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        if body.get("stream") and body.get("tools") and self.refuses_streaming_with_tools:
            self.send_response(200)  # and no event at all: how such a server answered
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in ("the ", "answer"):
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self.wfile.write(f"data: {json.dumps(end)}\n\n".encode())
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        reply = {
            "id": "c1",
            "object": "chat.completion",
            "model": "loop",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "the answer"}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }
        raw = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def chat_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    refuses = bool(getattr(request, "param", False))
    handler = type("Handler", (_ChatHandler,), {"seen": seen, "refuses_streaming_with_tools": refuses})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def _all_text(directory: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in directory.rglob("*") if p.is_file())


@pytest.mark.parametrize("json_out", [True, False])
def test_run_with_an_openai_compatible_model_uses_the_env_key_and_never_writes_it(
    cli: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch, chat_server: Any, json_out: bool
) -> None:
    url, seen = chat_server
    monkeypatch.setenv("QITOS_API_KEY", SECRET)
    args = ["run", "cli_agents:ModelAgent", "answer me", "--model", "openai:loop-model", "--base-url", url]
    result = cli.run(*args, *(["--json"] if json_out else []), code=0)
    assert seen and seen[0]["authorization"] == f"Bearer {SECRET}"
    assert seen[0]["body"]["model"] == "loop-model"
    assert seen[0]["body"].get("stream", False) is (not json_out)  # live output streams the model's text
    if json_out:
        data = json.loads(result.stdout)
        assert (data["final_result"], data["tokens"]) == ("the answer", 18)
    else:
        assert "answer:\nthe answer" in result.stdout
        assert "18 tokens" in result.stdout
    assert SECRET not in result.stdout + result.stderr
    assert SECRET not in _all_text(workdir / "runs")


def test_openai_key_falls_back_to_openai_api_key(
    cli: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch, chat_server: Any
) -> None:
    url, seen = chat_server
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    cli.run("run", "cli_agents:ModelAgent", "t", "--model", "openai:m", "--base-url", url, "--json", code=0)
    assert seen[0]["authorization"] == f"Bearer {SECRET}"


def test_run_request_options_reach_the_server_and_the_run_budget_has_its_own_name(
    cli: Any, workdir: Path, chat_server: Any
) -> None:
    url, seen = chat_server
    args = ["run", "cli_agents:ModelAgent", "answer me", "--model", "openai:loop-model", "--base-url", url]
    options = ["--temperature", "0.25", "--max-output-tokens", "64", "--tool-choice", "echo", "--request-timeout", "5"]
    data = cli.json(*args, *options, "--max-run-tokens", "1000", "--json")
    assert data["status"] == "completed"
    body = seen[0]["body"]
    assert (body["temperature"], body["max_tokens"]) == (0.25, 64)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "echo"}}
    assert "--max-tokens" not in cli.run("run", "--help", code=0).stdout  # no ambiguous name is left
    assert "no such option" in cli.run(*args, "--max-tokens", "5", code=2).stderr.lower()
    assert (
        "--temperature need --model openai:NAME"
        in cli.run("run", "cli_agents:ModelAgent", "t", "--temperature", "0.1", code=2).stderr
    )


@pytest.mark.parametrize("chat_server", [True], indirect=True)
def test_a_server_that_refuses_to_stream_with_tools_gets_a_hint_and_no_stream_skips_the_attempt(
    cli: Any, workdir: Path, chat_server: Any
) -> None:
    url, seen = chat_server
    args = ["run", "cli_agents:ModelAgent", "answer me", "--model", "openai:loop-model", "--base-url", url]
    result = cli.run(*args, code=0)  # live output asks to stream; the server sends nothing back
    assert "answer:\nthe answer" in result.stdout
    assert "stream refused" in result.stdout and "hint: the server did not stream a request with tools" in (
        " ".join(result.stdout.split())
    )
    assert [r["body"].get("stream", False) for r in seen] == [True, False]
    seen.clear()
    quiet = cli.run(*args, "--no-stream", code=0)
    assert "answer:\nthe answer" in quiet.stdout and "stream refused" not in quiet.stdout
    assert [r["body"].get("stream", False) for r in seen] == [False]
    assert "--no-stream need --model openai:NAME" in cli.run(*args[:3], "--no-stream", code=2).stderr


class _ObedientHandler(BaseHTTPRequestHandler):
    """A model that calls echo whenever the request demands a tool, and answers otherwise."""

    seen: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        choice = body.get("tool_choice")
        message: dict[str, Any] = {"role": "assistant", "content": "echoed, done"}
        if choice == "required" or isinstance(choice, dict):
            arguments = json.dumps({"text": "hi"})
            call = {
                "id": f"c{len(self.seen)}",
                "type": "function",
                "function": {"name": "echo", "arguments": arguments},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        reply = {"id": "c", "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        raw = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.mark.parametrize("choice", ["echo", "required"])
def test_tool_choice_holds_until_a_tool_was_used_so_the_agent_still_finishes(
    cli: Any, workdir: Path, choice: str
) -> None:
    seen: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_ObedientHandler,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        args = ["run", "cli_agents:ModelAgent", "say hi", "--model", "openai:m", "--base-url", url, "--json"]
        data = cli.json(*args, "--tool-choice", choice)
        assert (data["status"], data["final_result"], data["steps"]) == ("completed", "echoed, done", 2)
        forced = {"type": "function", "function": {"name": "echo"}} if choice == "echo" else "required"
        assert [body["tool_choice"] for body in seen] == [forced, "auto"]
        seen.clear()
        plain = cli.json(*args)  # the default: the model chooses
        assert plain["steps"] == 1 and [body["tool_choice"] for body in seen] == ["auto"]
        bad = cli.run(*args[:-1], "--tool-choice", "nope", code=2).stderr
        assert "--tool-choice 'nope' is not auto, none, required or one of the agent's tools (echo, publish)" in bad
    finally:
        server.shutdown()
        server.server_close()


def test_an_openai_model_without_a_declared_window_assumes_a_conservative_one() -> None:
    from qitos.cli._models import DEFAULT_OPENAI_WINDOW, resolve_model

    model = resolve_model("openai:m", base_url="http://127.0.0.1:9/v1")
    assert model.max_input_units == DEFAULT_OPENAI_WINDOW == 8_192
    assert resolve_model("openai:m", base_url="http://127.0.0.1:9/v1", max_input_units=4_096).max_input_units == 4_096


class _V1OnlyHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        raw = b'{"error": {"message": "not found"}}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def test_a_404_from_a_base_url_without_v1_gets_a_hint_and_the_error_prints_once(cli: Any, workdir: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _V1OnlyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = ["run", "cli_agents:ModelAgent", "t", "--model", "openai:m", "--base-url", url]
        result = cli.run(*args, code=1)
        assert f"try --base-url {url}/v1" in result.stderr
        assert result.stdout.count("HTTP 404") == 1  # shown once, not again in the summary
        data = cli.json(*args, "--json", code=1)
        assert data["status"] == "failed" and f"{url}/v1" in data["hint"]
    finally:
        server.shutdown()
        server.server_close()


def test_errors_of_a_json_command_are_json(cli: Any, workdir: Path) -> None:
    result = cli.run("sessions", "show", "ses_nope", "--db", "missing.db", "--json", code=3)
    assert json.loads(result.stdout) == {
        "error": "no session store at missing.db: the file does not exist",
        "exit_code": 3,
    }
    assert result.stderr == ""
    usage = cli.run("run", "cli_agents:ModelAgent", "t", "--json", code=2)
    assert "decides through a model" in json.loads(usage.stdout)["error"]
