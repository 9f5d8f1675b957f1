"""A real MCP server written with the official SDK, for MCPToolset tests.

Run over stdio: ``python mcp_server_fixture.py``; over streamable HTTP:
``python mcp_server_fixture.py --http PORT``. If ``QITOS_MCP_PID_FILE`` is set, the server writes
its process id there on start (so a test can check that closing the toolset stopped it).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

app = MCPServer("qitos-fixture", log_level="WARNING")


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def greet(name: str, excited: bool = False) -> str:
    """Greet someone by name."""
    return f"Hello, {name}{'!' if excited else '.'}"


@app.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason."""
    raise ToolError(reason)


@app.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


def main() -> None:
    pid_file = os.environ.get("QITOS_MCP_PID_FILE")
    if pid_file:
        with open(pid_file, "w") as fh:
            fh.write(str(os.getpid()))
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()


if __name__ == "__main__":
    main()
