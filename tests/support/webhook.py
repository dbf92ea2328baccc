"""A webhook receiver on this machine (loopback only): what gpuq's notifications POSTed to it.

``webhook()`` gives the JSON bodies (gpuq's own form); ``receiver()`` gives every request as it came,
headers and raw body, for the forms that are not gpuq's JSON (Slack, Discord, ntfy).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Delivery:
    """One request the receiver got: its path, headers (names in lower case) and body as sent."""

    path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


@contextlib.contextmanager
def _serve(on_post: Callable[[Delivery], None], address: str = "127.0.0.1") -> Iterator[str]:
    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            on_post(Delivery(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Hook)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def receiver() -> Iterator[tuple[str, list[Delivery]]]:
    """(its URL, every request it received so far); stopped and closed on exit."""
    got: list[Delivery] = []
    with _serve(got.append) as url:
        yield url, got


@contextlib.contextmanager
def receiver_at(address: str, got: list[Delivery]) -> Iterator[str]:
    """Another door to the same list: a receiver on ``address`` (a namespace host's gateway, which the
    host reaches as "the internet"), appending to ``got``."""
    with _serve(got.append, address) as url:
        yield url


@contextlib.contextmanager
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(its URL, the JSON bodies it received so far); stopped and closed on exit."""
    received: list[dict[str, Any]] = []
    with _serve(lambda d: received.append(d.json())) as url:
        yield url, received
