"""The shared machinery of the fake clouds: a threaded stdlib HTTP server on 127.0.0.1, a request log,
a controllable clock, injected 429s and a test-only control API under ``/_fake/``.

Control API (no auth, loopback only; for demos via scripts/fakecloud.py and for tests in other
processes; tests in-process call the methods directly)::

    GET  /_fake/log            the request log (method, path, operation, auth kind, status); never keys
    GET  /_fake/state          the fake's resources, as JSON
    POST /_fake/<control>      JSON object of keyword arguments → {"ok": true, "result": ...}
                               (<control> is one of the fake's ``controls``)
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from tests.support.fakecloud.backend import AddressBackend, HostBackend

_Cloud = TypeVar("_Cloud", bound="FakeCloud")

EPOCH = 1767225600.0  # 2026-01-01T00:00:00Z: fixed, so recordings do not change from run to run


class FakeClock:
    """Seconds since the epoch, moved only by :meth:`advance`."""

    def __init__(self, start: float = EPOCH) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        if not self.body:
            return None
        return json.loads(self.body.decode("utf-8"))


@dataclass
class Reply:
    status: int
    body: Any = None  # JSON-serialisable, or str (sent as text/plain)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # sent this long after the request was handled (outside the state lock)


class FakeCloud:
    """Base class: subclasses set ``api_prefix`` and ``controls`` and implement ``authorize``,
    ``auth_failure``, ``rate_limited``, ``describe`` and ``handle``."""

    provider = "fake"
    api_prefix = ""
    checked = "2026-11"  # when the shapes were last compared with the vendors' API references (no real recording yet)
    controls: tuple[str, ...] = ("rate_limit", "advance", "set_api_key")

    def __init__(self, *, api_key: str = "fake-api-key", backend: HostBackend | None = None,
                 clock: FakeClock | None = None, port: int = 0) -> None:
        self.api_key = api_key
        self.backend: HostBackend = backend if backend is not None else AddressBackend()
        self.clock = clock or FakeClock()
        self.lock = threading.RLock()
        self.log: list[dict[str, Any]] = []
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._throttle: list[float | None] = []  # one Retry-After per injected 429
        self._fail_after_create: list[tuple[int, float | None, float]] = []  # status, Retry-After, listing lag
        self._serial = 0
        self._inside: dict[str, ThreadingHTTPServer] = {}  # address -> the listener instances reach (listen_on)
        self._inside_lock = threading.Lock()
        self.instance_calls: list[dict[str, Any]] = []  # calls made with an instance's own key (in_instance_auth)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self: _Cloud) -> _Cloud:
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fake-{self.provider}", daemon=True)
        self._thread.start()
        return self

    def listen_on(self, address: str) -> str:
        """The API also on ``address`` (a namespace host's gateway: what its instance reaches as the
        provider's API, from inside), started once per address; returns that root URL."""
        with self._inside_lock:
            server = self._inside.get(address)
            if server is None:
                server = ThreadingHTTPServer((address, 0), _make_handler(self))
                server.daemon_threads = True
                threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                 name=f"fake-{self.provider}-{address}").start()
                self._inside[address] = server
            return f"http://{address}:{server.server_address[1]}"

    def stop(self) -> None:
        with self._inside_lock:
            for server in self._inside.values():
                server.shutdown()
                server.server_close()
            self._inside.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self: _Cloud) -> _Cloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake is not started")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The base URL an adapter is pointed at (GPUQ_RUNPOD_URL: RunPod's REST base / GPUQ_LAMBDA_API_URL)."""
        return self.root_url + self.api_prefix

    # -- common controls ------------------------------------------------------------------------------

    def rate_limit(self, count: int = 1, retry_after: float | None = 1.0) -> None:
        """Answer the next ``count`` authenticated API calls with HTTP 429 (``Retry-After`` unless None)."""
        with self.lock:
            self._throttle.extend([retry_after] * count)

    def advance(self, seconds: float) -> float:
        return self.clock.advance(seconds)

    def fail_after_create(self, count: int = 1, status: int = 429, retry_after: float | None = 1.0,
                          listing_lag_s: float = 0.0) -> None:
        """The next ``count`` creates succeed server-side but answer ``status`` (a leaked machine unless the
        client finds it by name; SkyPilot #2261), and no read lists such a machine for ``listing_lag_s`` real
        seconds (a listing that lags behind the create)."""
        with self.lock:
            self._fail_after_create.extend([(status, retry_after, listing_lag_s)] * count)

    def failure_after_create(self) -> tuple[int, float | None, float] | None:
        """The armed failure for the create just made, if any: (status, Retry-After, the time.monotonic() until
        which its machine is unlisted)."""
        if not self._fail_after_create:
            return None
        status, retry_after, lag = self._fail_after_create.pop(0)
        return status, retry_after, time.monotonic() + lag

    def set_api_key(self, api_key: str) -> None:
        with self.lock:
            self.api_key = api_key

    def new_id(self, length: int, alphabet: str) -> str:
        """A deterministic id (same sequence every run, so recordings are stable)."""
        with self.lock:
            self._serial += 1
            digest = int(hashlib.sha256(f"{self.provider}-{self._serial}".encode()).hexdigest(), 16)
        out = []
        for _ in range(length):
            digest, rem = divmod(digest, len(alphabet))
            out.append(alphabet[rem])
        return "".join(out)

    def requests(self, op: str | None = None) -> list[dict[str, Any]]:
        """Logged API requests, optionally only those of one operation."""
        with self.lock:
            return [dict(e) for e in self.log if op is None or e.get("op") == op]

    # -- subclass hooks ---------------------------------------------------------------------------------

    def auth_kind(self, req: Request) -> str:
        """How the request authenticated, for the log ("bearer", "basic", "query", "none"); never the key."""
        auth = req.headers.get("authorization", "")
        if auth:
            return auth.split(" ", 1)[0].lower()
        return "query" if "api_key" in req.query else "none"

    def authorize(self, req: Request) -> bool:
        raise NotImplementedError

    def auth_failure(self, req: Request) -> Reply:
        raise NotImplementedError

    def rate_limited(self, retry_after: float | None) -> Reply:
        headers = {} if retry_after is None else {"Retry-After": format(retry_after, "g")}
        return Reply(429, {"error": "Too Many Requests"}, headers)

    def describe(self, req: Request) -> str:
        return f"{req.method} {req.path}"

    def handle(self, req: Request) -> Reply:
        raise NotImplementedError

    def state(self) -> Any:
        return {}

    # -- dispatch ---------------------------------------------------------------------------------------

    def serve(self, req: Request) -> Reply:
        if req.path.startswith("/_fake/"):
            return self._control(req)
        with self.lock:
            try:
                op = self.describe(req)
            except Exception:  # an unparsable body is the handler's to report
                op = "?"
            query = {k: v for k, v in req.query.items() if k != "api_key"}
            entry: dict[str, Any] = {"method": req.method, "path": req.path, "query": query, "op": op,
                                     "auth": self.auth_kind(req)}
            self.log.append(entry)
            if not self.authorize(req):
                reply = self.auth_failure(req)
            elif self._throttle:
                reply = self.rate_limited(self._throttle.pop(0))
            else:
                try:
                    reply = self.handle(req)
                except Exception:
                    traceback.print_exc(file=sys.stderr)
                    reply = Reply(500, {"error": "internal error in the fake (see stderr)"})
            entry["status"] = reply.status
            return reply

    def _control(self, req: Request) -> Reply:
        name = req.path[len("/_fake/"):]
        if req.method == "GET" and name == "log":
            return Reply(200, self.requests())
        if req.method == "GET" and name == "state":
            with self.lock:
                return Reply(200, self.state())
        if req.method != "POST" or name not in self.controls:
            return Reply(404, {"error": f"unknown control {name!r}", "controls": list(self.controls)})
        try:
            kwargs = req.json() or {}
            if not isinstance(kwargs, dict):
                raise TypeError("the body must be a JSON object of keyword arguments")
            result = getattr(self, name)(**kwargs)
        except (TypeError, ValueError, KeyError) as exc:
            return Reply(400, {"error": f"{name}: {exc}"})
        return Reply(200, {"ok": True, "result": result})


def _make_handler(cloud: FakeCloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body leave in one segment: no 40 ms delayed-ACK stalls
        wbufsize = 1 << 16
        server_version = f"fake-{cloud.provider}"

        def _handle(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            req = Request(self.command, parts.path, parse_qs(parts.query),
                          {k.lower(): v for k, v in self.headers.items()}, body)
            reply = cloud.serve(req)
            if reply.delay_s > 0:  # the work is done server-side; only the answer is late
                time.sleep(reply.delay_s)
            if isinstance(reply.body, str):
                payload, ctype = reply.body.encode(), "text/plain; charset=utf-8"
            else:
                payload, ctype = json.dumps(reply.body).encode(), "application/json"
            ctype = reply.headers.get("Content-Type", ctype)  # RunPod v2's errors: application/problem+json
            self.send_response(reply.status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for key, value in reply.headers.items():
                if key != "Content-Type":
                    self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
