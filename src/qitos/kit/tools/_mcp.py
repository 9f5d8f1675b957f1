"""``MCPToolset``: the tools of a Model Context Protocol server as qitos ToolSpecs (extra ``qitos-kernel[mcp]``).

Uses the official ``mcp`` SDK (2.x, ``mcp.Client``). Connect to a server launched as a subprocess
over stdio, or to a streamable-HTTP endpoint::

    with MCPToolset.stdio("python", ["my_server.py"]) as toolset:
        registry = ToolRegistry(toolset.tools())
        registry.call("add", {"a": 1, "b": 2})          # a real tools/call over the protocol

Each server tool becomes a :class:`~qitos.core._tool.ToolSpec` whose ``parameters`` are the tool's
``inputSchema`` as the server declared it, so :class:`~qitos.core._tool.ToolRegistry` validates
arguments before anything is sent. A tool annotated ``readOnlyHint`` or ``idempotentHint`` is
marked idempotent. A call that the server answers with ``isError`` raises :class:`MCPToolError`
(the registry turns it into a failed observation). Text content comes back as text (several blocks
joined by newlines); a result with only structured content returns that object; other content
kinds are described in brackets (``[image image/png, 1234 base64 chars]``).

``ToolRegistry`` calls tools synchronously, while the SDK is asyncio-based: the toolset runs the
client session on a private event-loop thread and submits each call to it. ``close()`` (or leaving
the ``with`` block) ends the session on that thread, which closes the stdio pipes and stops the
server process (terminate, then kill), and then stops the thread. A stdio server's stderr is
captured; :attr:`MCPToolset.server_stderr` returns it and connection errors quote its tail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from qitos.core._errors import ConfigurationError, RunError
from qitos.core._install import install_command
from qitos.core._tool import DEFAULT_MAX_OUTPUT_CHARS, ToolSpec

__all__ = ["MCPConnectionError", "MCPToolError", "MCPToolset"]


class MCPConnectionError(RunError):
    """The MCP server could not be started, reached or initialized, or the session is closed."""


class MCPToolError(RunError):
    """An MCP tool call returned an error result (``isError``) or failed in transport."""


def _import_mcp() -> Any:
    try:
        import mcp
        import mcp.client.stdio
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"MCPToolset needs the mcp SDK: {install_command('mcp')}") from exc
    return mcp


class MCPToolset:
    """The tools of one MCP server; see the module docstring.

    ``server`` is a URL (``http://127.0.0.1:8000/mcp``: streamable HTTP) or a command line as a
    list (``["python", "server.py"]``: stdio). Prefer the :meth:`stdio` and :meth:`http`
    constructors. ``timeout`` bounds each tool call, ``connect_timeout`` the start-up;
    ``prefix`` is prepended to every tool name (``"fs."`` -> ``fs.read``); ``needs_approval``
    marks every tool as needing approval.
    """

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 30.0,
        prefix: str = "",
        needs_approval: bool = False,
        max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        if isinstance(server, str):
            if not server.startswith(("http://", "https://")):
                raise ConfigurationError(
                    f"MCP server {server!r}: give a http(s) URL, or the command line as a list for stdio"
                )
        elif not server or not all(isinstance(part, str) for part in server):
            raise ConfigurationError("MCP stdio server: the command line must be a non-empty list of strings")
        if timeout <= 0 or connect_timeout <= 0:
            raise ConfigurationError("MCPToolset timeout and connect_timeout must be > 0")
        self.server: str | tuple[str, ...] = server if isinstance(server, str) else tuple(server)
        self.env = dict(env) if env is not None else None
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.prefix = prefix
        self.needs_approval = needs_approval
        self.max_output_chars = max_output_chars
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._client: Any = None
        self._tools: list[Any] = []
        self._errlog: Any = None
        self._lock = threading.Lock()

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> MCPToolset:
        """A server started as ``command args...`` and spoken to over its stdin/stdout.

        The server gets the SDK's safe default environment (PATH, HOME...) plus ``env``.
        """
        return cls([command, *args], env=env, cwd=cwd, **options)

    @classmethod
    def http(cls, url: str, **options: Any) -> MCPToolset:
        """A server reached over streamable HTTP at ``url`` (e.g. ``http://127.0.0.1:8000/mcp``)."""
        return cls(url, **options)

    # ------------------------------------------------------------------ lifecycle

    @property
    def connected(self) -> bool:
        """True between a successful :meth:`open` and :meth:`close`."""
        return self._client is not None

    def open(self) -> MCPToolset:
        """Start the session (and the server process, for stdio) and list the server's tools."""
        mcp = _import_mcp()
        with self._lock:
            if self._client is not None:
                return self
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="qitos-mcp", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
            self._main = asyncio.run_coroutine_threadsafe(self._session(mcp, ready), loop)
            try:
                self._tools = ready.result(timeout=self.connect_timeout)
            except BaseException as exc:
                self._shutdown()
                raise MCPConnectionError(self._connect_failure(exc)) from exc
        return self

    def close(self) -> None:
        """End the session, stop the server process (stdio) and the event-loop thread. Idempotent."""
        with self._lock:
            self._shutdown()

    def __enter__(self) -> MCPToolset:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server_stderr(self) -> str:
        """What a stdio server wrote to its stderr so far ("" for HTTP servers)."""
        errlog = self._errlog
        if errlog is None or errlog.closed:
            return ""
        errlog.flush()
        errlog.seek(0)
        text: str = errlog.read()
        errlog.seek(0, os.SEEK_END)
        return text

    # ------------------------------------------------------------------ tools

    def tools(self) -> list[ToolSpec]:
        """The server's tools as ToolSpecs (opens the session if needed)."""
        if self._client is None:
            self.open()
        specs = []
        for t in self._tools:
            annotations = t.annotations
            idempotent = bool(annotations and (annotations.read_only_hint or annotations.idempotent_hint))
            specs.append(
                ToolSpec(
                    name=self.prefix + t.name,
                    description=t.description or t.title or t.name,
                    parameters=dict(t.input_schema or {"type": "object", "properties": {}}),
                    func=self._caller(t.name),
                    timeout=None,
                    idempotent=idempotent,
                    needs_approval=self.needs_approval,
                    max_output_chars=self.max_output_chars,
                )
            )
        return specs

    def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call the server tool ``name`` (without prefix) over the protocol; see the module docstring."""
        loop, client = self._loop, self._client
        if loop is None or client is None:
            raise MCPConnectionError("the MCP session is not open (use open() or a with block)")
        future = asyncio.run_coroutine_threadsafe(
            client.call_tool(name, dict(arguments or {}), read_timeout_seconds=self.timeout), loop
        )
        try:
            result = future.result(timeout=self.timeout + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"MCP tool {name!r} did not answer within {self.timeout:g} s") from None
        except Exception as exc:
            if getattr(exc, "code", None) == _request_timeout_code():
                # Raised as the builtin TimeoutError so ToolRegistry reports error_kind="timeout".
                raise TimeoutError(f"MCP tool {name!r} did not answer within {self.timeout:g} s") from exc
            raise MCPToolError(f"MCP tool {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return _result_value(name, result)

    def _caller(self, name: str) -> Any:
        def call_tool(**arguments: object) -> Any:
            return self.call(name, arguments)

        call_tool.__name__ = name
        return call_tool

    # ------------------------------------------------------------------ private

    async def _session(self, mcp: Any, ready: concurrent.futures.Future[list[Any]]) -> None:
        try:
            self._stop = asyncio.Event()
            async with mcp.Client(self._transport(mcp), read_timeout_seconds=self.timeout) as client:
                tools: list[Any] = []
                cursor = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self._client = client
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._client = None

    def _transport(self, mcp: Any) -> Any:
        if isinstance(self.server, str):
            return self.server
        self._errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        params = mcp.client.stdio.StdioServerParameters(
            command=self.server[0], args=list(self.server[1:]), env=self.env, cwd=self.cwd
        )
        return mcp.client.stdio.stdio_client(params, errlog=self._errlog)

    def _shutdown(self) -> None:
        loop, thread, main = self._loop, self._thread, self._main
        if loop is None:
            return
        stop = self._stop
        if stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if main is not None:
            try:
                main.result(timeout=15.0)
            except concurrent.futures.TimeoutError:
                main.cancel()
            except BaseException:  # the session already failed; its error was reported by open()
                pass
        if not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5.0)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = self._main = self._stop = None
        self._client = None

    def _connect_failure(self, exc: BaseException) -> str:
        target = self.server if isinstance(self.server, str) else " ".join(self.server)
        if isinstance(exc, concurrent.futures.TimeoutError):
            reason = f"no answer within {self.connect_timeout:g} s"
        else:
            reason = f"{type(exc).__name__}: {exc}"
        message = f"could not connect to MCP server {target!r}: {reason}"
        stderr = self.server_stderr.strip()
        if stderr:
            message += f"\nserver stderr (last lines):\n{stderr[-2000:]}"
        return message


def _request_timeout_code() -> int:
    import mcp_types

    code: int = mcp_types.REQUEST_TIMEOUT
    return code


def _result_value(name: str, result: Any) -> Any:
    texts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind in ("image", "audio"):
            texts.append(f"[{kind} {block.mime_type}, {len(block.data)} base64 chars]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            texts.append(text if isinstance(text, str) else f"[resource {resource.uri}]")
        elif kind == "resource_link":
            texts.append(f"[resource link {block.uri}]")
        else:
            texts.append(f"[{kind} content]")
    if result.is_error:
        raise MCPToolError(f"MCP tool {name!r} returned an error: " + ("\n".join(texts) or "(no details)"))
    if not texts and result.structured_content is not None:
        return result.structured_content
    return "\n".join(texts)
