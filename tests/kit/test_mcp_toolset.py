"""MCPToolset against a real MCP server process written with the SDK (stdio and streamable HTTP)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qitos.core._errors import ConfigurationError
from qitos.core._tool import ToolRegistry
from qitos.kit.tools._mcp import MCPConnectionError, MCPToolset

pytest.importorskip("mcp", reason="the mcp SDK (qitos[mcp]) is not installed")

# Every MCP server process takes several seconds to start on a 2-core machine.
pytestmark = pytest.mark.slow


FIXTURE = str(Path(__file__).with_name("mcp_server_fixture.py"))
PID_FILE = "QITOS_MCP_PID_FILE"


@pytest.fixture(scope="module")
def pid_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "server.pid"


@pytest.fixture(scope="module")
def toolset(pid_file: Path) -> Iterator[MCPToolset]:
    with MCPToolset.stdio(sys.executable, [FIXTURE], env={PID_FILE: str(pid_file)}, timeout=20.0) as ts:
        yield ts


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_server_tools_appear_with_their_input_schemas(toolset: MCPToolset) -> None:
    specs = {s.name: s for s in toolset.tools()}
    assert sorted(specs) == ["add", "fail", "greet", "slow"]
    add = specs["add"]
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer" and add.parameters["required"] == ["a", "b"]
    assert add.idempotent is True  # readOnlyHint
    assert specs["greet"].idempotent is False and specs["greet"].needs_approval is False


def test_calls_go_over_the_protocol_and_come_back_as_results(toolset: MCPToolset) -> None:
    registry = ToolRegistry(toolset.tools())
    assert registry.call("add", {"a": 2, "b": 40}).output == "42"
    assert registry.call("greet", {"name": "Ann", "excited": True}).output == "Hello, Ann!"
    assert toolset.call("greet", {"name": "Bo"}) == "Hello, Bo."


def test_arguments_are_validated_against_the_servers_schema_before_sending(toolset: MCPToolset) -> None:
    registry = ToolRegistry(toolset.tools())
    result = registry.call("add", {"a": "two", "b": 3})
    assert result.error_kind == "invalid_arguments" and "arguments.a: expected integer" in (result.error or "")
    result = registry.call("greet", {})
    assert result.error_kind == "invalid_arguments" and "missing required argument 'name'" in (result.error or "")


def test_a_tool_error_from_the_server_becomes_a_failed_observation(toolset: MCPToolset) -> None:
    result = ToolRegistry(toolset.tools()).call("fail", {"reason": "disk is full"})
    assert not result.ok and result.error_kind == "tool_error"
    assert "MCPToolError" in (result.error or "") and "disk is full" in (result.error or "")


def test_prefix_approval_and_a_call_slower_than_the_timeout() -> None:
    with MCPToolset.stdio(sys.executable, [FIXTURE], timeout=0.5, prefix="calc.", needs_approval=True) as ts:
        specs = ts.tools()
        assert {s.name for s in specs} == {"calc.add", "calc.fail", "calc.greet", "calc.slow"}
        assert all(s.needs_approval for s in specs)
        registry = ToolRegistry(specs)
        result = registry.call("calc.slow", {"seconds": 5})
        assert not result.ok and result.error_kind == "timeout"
        assert registry.call("calc.add", {"a": 1, "b": 2}).output == "3"  # the session survives the timeout


def test_closing_the_toolset_stops_the_server_process(tmp_path: Path) -> None:
    pid_path = tmp_path / "pid"
    ts = MCPToolset.stdio(sys.executable, [FIXTURE], env={PID_FILE: str(pid_path)}).open()
    pid = int(pid_path.read_text())
    assert _alive(pid) and ts.connected
    ts.close()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the MCP server process outlived close()"
    assert not ts.connected
    with pytest.raises(MCPConnectionError, match="not open"):
        ts.call("add", {"a": 1, "b": 1})
    ts.close()  # idempotent


def test_a_server_that_dies_at_start_is_reported_with_its_stderr() -> None:
    crash = "import sys; sys.stderr.write('fixture exploded: missing config\\n'); sys.exit(2)"
    with pytest.raises(MCPConnectionError) as info:
        MCPToolset.stdio(sys.executable, ["-c", crash], connect_timeout=20).open()
    assert "could not connect to MCP server" in str(info.value)
    assert "fixture exploded: missing config" in str(info.value)


def test_an_unreachable_http_server_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MCPConnectionError, match="could not connect"):
        MCPToolset.http(f"http://127.0.0.1:{port}/mcp", connect_timeout=10).open()


def test_bad_server_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="http"):
        MCPToolset("server.py")
    with pytest.raises(ConfigurationError, match="non-empty list"):
        MCPToolset([])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, FIXTURE, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("the streamable-HTTP MCP fixture server exited at start")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_streamable_http_server_tools_work_over_the_protocol(http_server: str) -> None:
    with MCPToolset.http(http_server) as ts:
        registry = ToolRegistry(ts.tools())
        assert registry.names() == ["add", "greet", "fail", "slow"]
        assert registry.call("add", {"a": 20, "b": 22}).output == "42"
        assert ts.server_stderr == ""
