"""The trace and session viewer: a small standard-library HTTP server bound to 127.0.0.1.

It serves the hand-written static app (``qitos/viewer/static``: no CDN, no build step, nothing
fetched from the network) and a read-only JSON API over the trace reader and the checkpoint store:

======================================  =====================================================
``GET /api/runs``                       the runs board (``{"logdir", "runs": [summary...], "demo_command"}``)
``GET /api/runs/<id>``                  ``{"run": summary, "manifest", "steps": [...]}``
``GET /api/runs/<id>/events?after=N``   ``{"events": [...], "next": n}`` (poll with ``after``)
``GET /api/runs/<id>/steps/<n>/request`` one step's request: messages sent, reply, failed attempts
``GET /api/sessions``                   ``{"db", "available", "sessions": [summary...]}``
``GET /api/sessions/<id>``              inspection, snapshot ids, fork lineage with integrity
``GET /api/sessions/<id>/steps/<n>/request`` a session's model step: messages sent, reply
``GET /api/evals``                      the evals in the session store, newest first
``GET /api/evals/<eval>``               one eval: report, histograms, metadata groups, samples
``GET /api/evals/<a>/compare/<b>``      two evals compared (``?allow_different_datasets=1``)
``POST /api/sessions/<id>/<action>``    approve / reject (``call_id``, ``reason``), steer (``text``),
                                        pause, resume (see :mod:`qitos.viewer._controls`)
======================================  =====================================================

Shapes are documented in :mod:`qitos.viewer._data` (the eval pages' in :mod:`qitos.viewer._evals`).
Errors are ``{"error": message}`` with 404 (not found), 400 (bad request), 403 (refused), 409 (the
action does not apply now; ``command`` may say what to run), 413, 415 or 500. Requests whose
``Host`` is not this loopback address are refused (a guard against DNS rebinding), every response
forbids framing and sniffing, and the page's Content-Security-Policy allows only its own script
and style.

The controls change sessions, so a POST must show it comes from the viewer's own page, opened at
the address ``qitos trace serve`` prints: that address carries a token made at each start
(:attr:`ViewerServer.control_url`), which the page keeps for its tab and sends in the
``X-Qitos-Token`` header. A POST is refused unless its token matches, its ``Origin`` (and
``Sec-Fetch-Site``, when the browser sends them) is the viewer itself and its body is JSON
(``Content-Type: application/json``). A page on another origin can neither read the token nor
send that header or content type without a CORS preflight, which the viewer never grants.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import shlex
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from qitos.checkpoint._targets import describe_target, open_store, store_exists
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import QitosError, UsageError
from qitos.core._redaction import Redactor
from qitos.trace._reader import TraceError
from qitos.viewer._controls import ConflictError, Controls
from qitos.viewer._data import (
    NotFoundError,
    find_run,
    run_detail,
    run_events,
    run_request,
    runs_board,
    session_detail,
    session_summary,
)
from qitos.viewer._evals import eval_api, session_request

__all__ = ["DEFAULT_PORT", "HOST", "ViewerServer"]

HOST = "127.0.0.1"
DEFAULT_PORT = 8765

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_SHOWN = Redactor()
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


_MAX_BODY = 64 * 1024
TOKEN_HEADER = "X-Qitos-Token"


class ViewerServer:
    """The viewer over a trace directory and (optionally) a session database.

    Args:
        logdir: the directory holding ``<run_id>/`` trace folders.
        db: a SQLite session store file; it is opened (read through the store API) only if it exists.
        port: the TCP port on 127.0.0.1; 0 picks a free one (read it back from :attr:`port`).
    """

    token: str
    """This start's control token (in :attr:`control_url`); a new one each time a viewer starts."""

    def __init__(self, logdir: str = "./runs", *, db: str | None = None, port: int = DEFAULT_PORT) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise UsageError(f"port must be an int between 0 and 65535, got {port!r}")
        self.logdir = logdir
        self.db = db
        self._store: CheckpointStore | None = None
        self._store_lock = threading.Lock()
        self._static: dict[str, bytes] = {}
        self.token = secrets.token_urlsafe(24)
        self.controls = Controls(db=db, logdir=logdir) if db else None
        handler = type("ViewerHandler", (_Handler,), {"viewer": self})
        try:
            self.httpd = ThreadingHTTPServer((HOST, port), handler)
        except OSError as exc:
            raise UsageError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from exc
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port actually bound."""
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        """The viewer's address (read-only: the controls need :attr:`control_url`)."""
        return f"http://{HOST}:{self.port}/"

    @property
    def control_url(self) -> str:
        """The address with this start's token: the page opened here can approve, steer, pause, resume."""
        return f"{self.url}?token={self.token}"

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (or KeyboardInterrupt) in this thread."""
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ViewerServer:
        """Serve from a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="qitos-viewer", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving, close the socket and the store."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None
        if self.controls is not None:
            self.controls.close()

    def __enter__(self) -> ViewerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- data access

    def store(self) -> CheckpointStore | None:
        """The session store (a SQLite file or a postgresql:// URL), opened on first use once it exists."""
        with self._store_lock:
            if self._store is None and self.db and store_exists(self.db):
                self._store = open_store(self.db)
            return self._store

    def static_file(self, name: str) -> bytes:
        """A packaged static file (cached)."""
        data = self._static.get(name)
        if data is None:
            data = resources.files("qitos.viewer").joinpath("static", name).read_bytes()
            self._static[name] = data
        return data

    def api(self, path: str, query: dict[str, list[str]]) -> Any:
        """Answer one API path (without the ``/api`` prefix); raises NotFoundError or UsageError."""
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if parts == ["runs"]:
            # The command an empty board suggests, runnable as shown: it traces to this board's directory.
            demo = ["qitos", "demo", "--policy", "scripted", "--trace-dir", os.path.abspath(self.logdir)]
            if self.db:
                demo += ["--db", self.db]
            return {
                "logdir": os.path.abspath(self.logdir),
                "runs": runs_board(self.logdir),
                "demo_command": shlex.join(demo),
            }
        if len(parts) == 2 and parts[0] == "runs":
            return run_detail(find_run(self.logdir, parts[1]))
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == "events":
            after_text = (query.get("after") or ["0"])[0]
            if not after_text.isdigit():
                raise UsageError(f"after must be a non-negative integer, got {after_text!r}")
            return run_events(find_run(self.logdir, parts[1]), after=int(after_text))
        if len(parts) == 5 and parts[0] == "runs" and parts[2] == "steps" and parts[4] == "request":
            if not parts[3].isdigit():
                raise UsageError(f"a step id is a non-negative integer, got {parts[3]!r}")
            return run_request(find_run(self.logdir, parts[1]), int(parts[3]))
        if parts == ["sessions"]:
            store = self.store()
            sessions = [session_summary(h, store) for h in store.list_sessions()] if store is not None else []
            return {
                "db": describe_target(self.db) if self.db else None,
                "available": store is not None,
                "sessions": sessions,
            }
        if parts and parts[0] == "evals":
            return eval_api(self.store(), parts[1:], query, db=describe_target(self.db) if self.db else None)
        if len(parts) == 5 and parts[0] == "sessions" and parts[2] == "steps" and parts[4] == "request":
            if not parts[3].isdigit():
                raise UsageError(f"a step id is a non-negative integer, got {parts[3]!r}")
            store = self.store()
            if store is None:
                raise NotFoundError(
                    f"no session store at {describe_target(self.db)}" if self.db else "no session store configured"
                )
            return session_request(store, parts[1], int(parts[3]))
        if len(parts) == 2 and parts[0] == "sessions":
            store = self.store()
            if store is None:
                raise NotFoundError(
                    f"no session store at {describe_target(self.db)}" if self.db else "no session store configured"
                )
            return session_detail(store, parts[1], logdir=self.logdir)
        raise NotFoundError(f"no API endpoint /api/{'/'.join(parts)}")

    def act(self, path: str, body: Any) -> Any:
        """Do one control action, ``/sessions/<id>/<action>`` (without ``/api``), with a checked request."""
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if len(parts) != 3 or parts[0] != "sessions":
            raise NotFoundError(f"no API endpoint /api/{'/'.join(parts)} for POST")
        if not isinstance(body, dict):
            raise UsageError("the request body must be a JSON object")
        store = self.store()
        if store is None or self.controls is None:
            raise NotFoundError(
                f"no session store at {describe_target(self.db)}" if self.db else "no session store configured"
            )
        # Shown in the page, so redacted like every view (a URL password in a resume command).
        return _SHOWN.redact_value(self.controls.act(store, parts[1], parts[2], body))


class _Handler(BaseHTTPRequestHandler):
    viewer: ViewerServer
    server_version = "qitos-viewer"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the viewer does not log every request."""

    def do_GET(self) -> None:
        """Serve a static file or an API answer."""
        if not self._host_allowed():
            self._send_json(HTTPStatus.FORBIDDEN, {"error": "the viewer only answers requests for its own address"})
            return
        parts = urlsplit(self.path)
        if parts.path.startswith("/api/"):
            self._api(parts.path[len("/api") :], parse_qs(parts.query))
            return
        entry = _STATIC.get(parts.path)
        if entry is None:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such page {parts.path}"})
            return
        name, content_type = entry
        self._send(HTTPStatus.OK, self.viewer.static_file(name), content_type)

    def do_HEAD(self) -> None:
        """Refuse HEAD politely (pages and data are GET; controls are POST)."""
        self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "use GET (or POST for a control)"})

    def do_POST(self) -> None:
        """A control action, from the viewer's own page only (see the module docstring)."""
        if not self._host_allowed():
            self._send_json(HTTPStatus.FORBIDDEN, {"error": "the viewer only answers requests for its own address"})
            return
        refusal = self._refusal()
        if refusal is not None:
            status, message = refusal
            self._send_json(status, {"error": message})
            return
        path = urlsplit(self.path).path
        if not path.startswith("/api/"):
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint {path}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self._send_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"a body of 0 to {_MAX_BODY} bytes"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": "the request body is not JSON"})
            return
        self._api_call(lambda: self.viewer.act(path[len("/api") :], body))

    def _refusal(self) -> tuple[HTTPStatus, str] | None:
        """Why a POST is not from the viewer's own page, or None when it is."""
        own = self._own_origins()
        origin = self.headers.get("Origin")
        if origin is not None and origin.lower() not in own:
            return HTTPStatus.FORBIDDEN, f"a control request from {origin} is refused: only the viewer's page may act"
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return HTTPStatus.FORBIDDEN, f"a {site} control request is refused: only the viewer's page may act"
        token = self.headers.get(TOKEN_HEADER) or ""
        if not hmac.compare_digest(token.encode(), self.viewer.token.encode()):
            return HTTPStatus.FORBIDDEN, (
                "the control token is missing or wrong: open the viewer at the address qitos trace serve printed"
            )
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return (
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                "a control request's body is JSON (Content-Type: application/json)",
            )
        return None

    def _own_origins(self) -> set[str]:
        port = self.viewer.port
        return {f"http://{HOST}:{port}", f"http://localhost:{port}"}

    def _host_allowed(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        port = self.viewer.port
        return host in (f"{HOST}:{port}", f"localhost:{port}") or (port == 80 and host in (HOST, "localhost"))

    def _api(self, path: str, query: dict[str, list[str]]) -> None:
        self._api_call(lambda: self.viewer.api(path, query))

    def _api_call(self, answer: Callable[[], object]) -> None:
        try:
            payload = answer()
        except NotFoundError as exc:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except ConflictError as exc:
            self._send_json(HTTPStatus.CONFLICT, {"error": str(exc), "command": exc.command})
        except UsageError as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (QitosError, TraceError, OSError) as exc:
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
        else:
            self._send_json(HTTPStatus.OK, payload)

    def _send_json(self, status: HTTPStatus, payload: object) -> None:
        if status != HTTPStatus.OK:  # an error message may quote what it failed on (views redact themselves)
            payload = _SHOWN.redact_value(payload)
        body = json.dumps(payload, ensure_ascii=False, default=repr).encode("utf-8")
        self._send(status, body, "application/json; charset=utf-8")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", _CSP)
        self.end_headers()
        self.wfile.write(body)
