"""Webhook notifications: delivered as JSON, and a failure never breaks the tick or leaks the URL."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

from orchestrator.core.config import load_settings
from orchestrator.tick import notify


class Events:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def record_event(self, kind: str, subject: str, message: str, *, unless_repeated: bool = False) -> None:
        self.messages.append(message)

    def redact(self, value: object) -> object:
        return value


def _settings(tmp_path: Path, url: str):  # type: ignore[no-untyped-def]
    return load_settings(env={"GPUQ_HOME": str(tmp_path), "GPUQ_WEBHOOK_URL": url})


def test_no_url_sends_nothing(tmp_path: Path) -> None:
    events = Events()
    assert notify.send(load_settings(env={"GPUQ_HOME": str(tmp_path)}), events, {"event": "x"}) is False
    assert events.messages == []


def test_a_dead_endpoint_is_recorded_without_the_url(tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/T0KEN-secret-path"
    events = Events()
    assert notify.send(_settings(tmp_path, url), events, {"event": "escalation"}) is False
    assert len(events.messages) == 1 and "secret" not in events.messages[0] and "webhook" in events.messages[0]


def test_an_error_status_is_a_failed_delivery_and_a_2xx_is_not(tmp_path: Path) -> None:
    bodies: list[dict[str, object]] = []
    status = {"code": 500}

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        events = Events()
        assert notify.send(_settings(tmp_path, url), events, {"event": "escalation", "rule": "stalled"}) is False
        assert events.messages == ["webhook delivery failed (HTTP 500); the tick went on"]
        status["code"] = 200
        assert notify.send(_settings(tmp_path, url), events, {"event": "sweep_done"}) is True
    finally:
        server.shutdown()
        server.server_close()
    assert [b["event"] for b in bodies] == ["escalation", "sweep_done"]
    assert bodies[0]["rule"] == "stalled" and bodies[0]["source"] == "gpuq"


def test_a_redirect_is_a_failed_delivery_and_is_never_followed(tmp_path: Path) -> None:
    """issue 43 #8: a hook answering 302 got the POST re-sent as a GET to another address, counted delivered."""
    elsewhere: list[str] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            elsewhere.append(f"GET {self.path}")
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    target = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Elsewhere)  # another loopback address
    where = f"http://127.0.0.2:{target.server_address[1]}/collect"

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(int(self.path.rsplit("/", 1)[1]))
            self.send_header("Location", where)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    for server in (target, hook):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for code in (301, 302, 303, 307, 308):
            events = Events()
            url = f"http://127.0.0.1:{hook.server_address[1]}/hook/{code}"
            assert notify.send(_settings(tmp_path, url), events, {"event": "escalation"}) is False, code
            assert events.messages == [f"webhook delivery failed (HTTP {code}, a redirect: gpuq does not follow "
                                       "one); the tick went on"]
    finally:
        for server in (target, hook):
            server.shutdown()
            server.server_close()
    assert elsewhere == []
