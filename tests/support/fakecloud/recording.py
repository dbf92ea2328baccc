"""Record provider exchanges into JSON fixtures and replay them with an httpx MockTransport.

A fixture (``tests/fixtures/providers/<provider>/<source>/<name>.json``) holds an ordered list of
request/response pairs.  Requests are stored relative to the adapter's base URL, without any
credential (the auth *scheme* is kept: replay checks that a Bearer header was sent and that no key
travels in the URL).  Replay serves the responses in order and fails the test on any request that
differs from the recorded one, on any request beyond the recording and, via :meth:`Replay.assert_done`,
on recorded requests that were never made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "providers"
KEPT_HEADERS = ("content-type", "retry-after")


class ReplayMismatch(AssertionError):
    """The adapter sent a request the recording does not have at this point."""


def describe_request(request: httpx.Request, base_path: str) -> dict[str, Any]:
    path = request.url.path
    if base_path and path.startswith(base_path):
        path = path[len(base_path):]
    query = parse_qs(request.url.query.decode() if isinstance(request.url.query, bytes) else request.url.query)
    auth = request.headers.get("authorization", "")
    body: Any = None
    if request.content:
        try:
            body = json.loads(request.content)
        except ValueError:
            body = request.content.decode("utf-8", "replace")
    return {"method": request.method, "path": path, "query": query,
            "auth": auth.split(" ", 1)[0].lower() if auth else "none", "json": body}


def describe_response(response: httpx.Response) -> dict[str, Any]:
    headers = {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers}
    try:
        body: dict[str, Any] = {"json": response.json()}
    except ValueError:
        body = {"text": response.text}
    return {"status": response.status_code, "headers": headers, **body}


class Recorder(httpx.BaseTransport):
    """Wraps a real transport and keeps every exchange (credentials never stored)."""

    def __init__(self, inner: httpx.BaseTransport, base_path: str) -> None:
        self.inner = inner
        self.base_path = base_path
        self.exchanges: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        response.read()
        self.exchanges.append({"request": describe_request(request, self.base_path),
                               "response": describe_response(response)})
        return response

    def close(self) -> None:
        self.inner.close()


class Replay:
    """Serves recorded responses in order; ``transport`` goes into the adapter."""

    def __init__(self, exchanges: list[dict[str, Any]], base_path: str, label: str, *,
                 missing: Path | None = None) -> None:
        self.pending = list(exchanges)
        self.missing = missing  # no recording exists: the first request fails and says how to make one
        self.base_path = base_path
        self.label = label
        self.failures: list[str] = []
        self.transport = httpx.MockTransport(self._handle)

    def _fail(self, message: str) -> ReplayMismatch:
        self.failures.append(message)
        return ReplayMismatch(f"{self.label}: {message}")

    def _handle(self, request: httpx.Request) -> httpx.Response:
        actual = describe_request(request, self.base_path)
        if actual["auth"] != "bearer":
            raise self._fail(f"request without a Bearer Authorization header: {actual['method']} {actual['path']}")
        if "api_key" in actual["query"]:
            raise self._fail("an API key travelled in the URL")
        if self.missing is not None:
            raise self._fail(f"no recording {self.missing}; run: python scripts/fakecloud.py record")
        if not self.pending:
            raise self._fail(f"unexpected request beyond the recording: {json.dumps(actual)[:400]}")
        expected = self.pending.pop(0)
        if expected["request"] != actual:
            raise self._fail("request differs from the recording (re-record with scripts/fakecloud.py record if "
                             f"the change is intended):\n  expected {json.dumps(expected['request'])[:600]}\n"
                             f"  actual   {json.dumps(actual)[:600]}")
        reply = expected["response"]
        if "json" in reply:
            return httpx.Response(reply["status"], headers=reply.get("headers", {}), json=reply["json"])
        return httpx.Response(reply["status"], headers=reply.get("headers", {}), text=reply.get("text", ""))

    def assert_done(self) -> None:
        assert not self.failures, self.failures[0]
        assert not self.pending, (f"{self.label}: {len(self.pending)} recorded request(s) never made, first: "
                                  f"{json.dumps(self.pending[0]['request'])[:400]}")


def fixture_path(provider: str, name: str, source: str = "fake") -> Path:
    return FIXTURES / provider / source / f"{name}.json"


def save(path: Path, provider: str, exchanges: list[dict[str, Any]], *, checked: str, note: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"provider": provider, "source": "tests/support/fakecloud (the local fake, not the real API)",
           "fake_checked": checked, "note": note, "exchanges": exchanges}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def load(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    exchanges = doc["exchanges"]
    assert isinstance(exchanges, list)
    return exchanges


def assert_secret_free(exchanges: list[dict[str, Any]], secrets: list[str]) -> None:
    """Fail if any of ``secrets`` appears anywhere in ``exchanges`` (checked before saving a fixture)."""
    text = json.dumps(exchanges)
    for secret in secrets:
        assert secret not in text, "an API key would be written into a fixture"
