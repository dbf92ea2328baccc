"""Notifications: one POST to the configured webhook on escalations (a failed or lost job, a stall,
a preemption, an unreachable host, ...), a finished sweep, and the billing and budget alerts.

Each message is a :class:`Notice`: the JSON form's fields (the same fields as ever) and one line a
person reads, built where the message is made: the job or sweep, the host, what happened and the
next command to run.  ``webhook_format`` chooses the body (docs/health.md, "Notifications"):

- ``json`` (default): the fields, plus ``source``, ``host``, ``time`` and the line as ``text``;
- ``slack``: ``{"text": line, "mrkdwn": false}`` (``&``, ``<``, ``>`` escaped: no ``<!channel>`` or link
  from host text; no mrkdwn: ``*``, ``_``, ``~`` and backticks show as typed);
- ``discord``: ``{"content": line}``, every markdown character escaped with a backslash (no masked link,
  spoiler or heading from host text), cut to Discord's 2000 characters, with no mention parsed;
- ``ntfy``: the line as a plain-text body (at most ntfy's 4096 bytes) and a short ``Title`` header
  (``gpuq: job failed``), with ``Priority`` and ``Tags`` from the severity.

The URL is a secret in practice (Slack and Discord webhooks carry their token in the path): it
comes from settings (``GPUQ_WEBHOOK_URL`` or a config file) and is never written to the ledger or
a log; a failed delivery is recorded without it.  Every form is redacted first (the ledger's
``redact``: forwarded secret values and common token shapes, ``orchestrator/core/redact.py``), since
findings quote host text, and the line and title carry no control character.  Delivery never breaks
a tick: every error is swallowed after one event.  Standard library only (urllib), with a short timeout.

Redirects are never followed: a 3xx is a failed delivery, said so in its event.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.client import HTTPMessage
from typing import IO, Any, Literal, Protocol

from orchestrator.core import redact
from orchestrator.core.config import Settings

TIMEOUT_S = 5.0
FORMATS = ("json", "slack", "discord", "ntfy")
LINE_MAX = 4000  # characters of the human line in any form: longer is noise (the JSON fields keep the rest)
DISCORD_MAX = 2000  # Discord refuses a longer "content"
NTFY_MAX_BYTES = 4096  # ntfy turns a longer body into an attachment
TITLE_MAX = 120
Severity = Literal["info", "warn", "escalate"]
_PRIORITY = {"info": "low", "warn": "default", "escalate": "high"}
_TAG = {"info": "information_source", "warn": "warning", "escalate": "rotating_light"}
_COMMAND = re.compile(r"`(gpuq [^`]+)`")
_DISCORD_MARKUP = re.compile(r"[\\*_~`|<>\[\]()#@-]")  # each shown as typed after a backslash
_WHITESPACE = "\t\n\r\v\f\x1c\x1d\x1e\x1f\x85\u2028\u2029"


@dataclass(frozen=True)
class Notice:
    """One notification: its ``event`` and JSON ``fields`` (the JSON form's body, as it always was),
    the ``line`` a person reads in every form, a short ``title`` (what happened, in a few words) and
    its ``severity`` (ntfy's priority)."""

    event: str
    line: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    title: str = ""
    severity: Severity = "info"

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> Notice:
        """A notice from a bare JSON message (its ``message`` and ``action`` make the line)."""
        fields = {k: v for k, v in message.items() if k != "event"}
        event = str(message.get("event", "notice"))
        what = str(message.get("message") or event)
        return cls(event, line(what, job=str(message.get("job") or ""), sweep=str(message.get("sweep") or ""),
                               host=str(message.get("host") or ""),
                               next_step=next_command(str(message.get("action") or ""))),
                   fields, title=event.replace("_", " "), severity="escalate" if event == "escalation" else "info")


def line(what: str, *, job: str = "", sweep: str = "", host: str = "", next_step: str = "") -> str:
    """The human line: ``job NAME (ID) of sweep S on HOST: what happened; next: gpuq ...``.  ``job``
    is the job as a person names it (``lr3 (3f2a9c1b)``); without one, the sweep or the host leads."""
    if job:
        subject = f"job {job}" + (f" of sweep {sweep}" if sweep else "") + (f" on {host}" if host else "")
    elif sweep:
        subject = f"sweep {sweep}" + (f" on {host}" if host else "")
    else:
        subject = f"host {host}" if host else "gpuq"
    return f"{subject}: {what}" + (f"; next: {next_step}" if next_step else "")


def next_command(action: str) -> str:
    """The first ``gpuq ...`` command an action quotes in backticks ("" when it quotes none)."""
    found = _COMMAND.search(action)
    return found.group(1) if found else ""


def job_label(name: str, job_id: str) -> str:
    return f"{name} ({job_id})" if name and name != job_id else job_id


class _Events(Protocol):
    def record_event(self, kind: str, subject: str, message: str, *, unless_repeated: bool = False) -> None: ...

    def redact(self, value: Any) -> Any: ...


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is the hook's answer, never followed: urllib would re-send the notice as a GET to wherever it
    points (another address) and count that one's 2xx as delivered."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: HTTPMessage, newurl: str) -> urllib.request.Request | None:
        return None  # urllib then raises HTTPError with the 3xx


_OPENER = urllib.request.build_opener(_NoRedirect)


def send(settings: Settings, ledger: _Events | None, notice: Notice | Mapping[str, Any]) -> bool:
    """POST ``notice`` in the configured ``webhook_format``; True when the hook answered 2xx."""
    url = settings.webhook_url
    if not url:
        return False
    if not isinstance(notice, Notice):
        notice = Notice.of(notice)
    redactor = ledger.redact if ledger is not None else redact.Redactor().value
    data, headers = render(settings.webhook_format, notice, redactor)
    request = urllib.request.Request(url, data=data, headers={**headers, "User-Agent": "gpuq"}, method="POST")
    try:
        with _OPENER.open(request, timeout=TIMEOUT_S) as response:
            ok = 200 <= int(response.status) < 300
            why = f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        redirect = 300 <= exc.code < 400
        ok, why = False, f"HTTP {exc.code}" + (", a redirect: gpuq does not follow one" if redirect else "")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        ok, why = False, type(reason).__name__ if not isinstance(reason, str) else "unreachable"
    if not ok and ledger is not None:
        ledger.record_event("notify", "webhook", f"webhook delivery failed ({why}); the tick went on",
                            unless_repeated=True)
    return ok


def render(fmt: str, notice: Notice, redactor: Callable[[Any], Any]) -> tuple[bytes, dict[str, str]]:
    """The request body and headers of ``notice`` in form ``fmt`` (one of ``FORMATS``), redacted."""
    # controls out before redacting: a secret split by an escape must not join up again after it
    fields, text, title = redactor([{"event": notice.event, **notice.fields}, _one_line(notice.line),
                                    _one_line(notice.title)])
    text = clip(str(text), LINE_MAX)
    if fmt == "slack":  # no mrkdwn (*bold*, _x_, `code`), and no <!channel> or <url|link> from host text
        slack = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return _json({"text": slack, "mrkdwn": False}), _JSON_HEADERS
    if fmt == "discord":  # no markdown (masked links, spoilers), and no @everyone, role or user ping
        content = clip(_DISCORD_MARKUP.sub(r"\\\g<0>", text), DISCORD_MAX)
        return _json({"content": content, "allowed_mentions": {"parse": []}}), _JSON_HEADERS
    if fmt == "ntfy":
        short = str(title) or notice.event.replace("_", " ")
        headers = {"Content-Type": "text/plain; charset=utf-8",
                   "Title": clip(f"gpuq: {short}", TITLE_MAX).encode("ascii", "replace").decode("ascii"),
                   "Priority": _PRIORITY[notice.severity],
                   "Tags": f"{_TAG[notice.severity]},{re.sub(r'[^a-z0-9_]', '', notice.event.lower())}"}
        return clip_bytes(text, NTFY_MAX_BYTES), headers
    body = {"source": "gpuq", "host": socket.gethostname(), "time": time.time(), **fields, "text": text}
    return _json(body), _JSON_HEADERS


_JSON_HEADERS = {"Content-Type": "application/json"}


def _json(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, default=str).encode()


def _one_line(text: str) -> str:
    """``text`` on one line with no control or format character (a host's text may carry escapes)."""
    kept = "".join(c if c.isprintable() else " " if c in _WHITESPACE else "" for c in text)
    return " ".join(kept.split())


def clip(text: str, limit: int) -> str:
    """``text`` of at most ``limit`` characters (its end replaced by "…" when cut)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def clip_bytes(text: str, limit: int) -> bytes:
    """``text`` as UTF-8 of at most ``limit`` bytes, never cut inside a character ("…" marks a cut)."""
    data = text.encode()
    if len(data) <= limit:
        return data
    return data[:limit - 3].decode("utf-8", "ignore").encode() + "…".encode()
