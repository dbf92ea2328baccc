"""Notifications: a JSON POST to the configured webhook on escalations and sweep completion.

The URL is a secret in practice (Slack and Discord webhooks carry their token in the path): it
comes from settings (``GPUQ_WEBHOOK_URL`` or a config file) and is never written to the ledger or
a log; a failed delivery is recorded without it.  The body's text is redacted first (the ledger's
``redact``: forwarded secret values and common token shapes, ``orchestrator/redact.py``), since
findings quote host text.  Delivery never breaks a tick: every error is
swallowed after one event.  Standard library only (urllib), with a short timeout.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

from orchestrator import redact
from orchestrator.config import Settings

TIMEOUT_S = 5.0


class _Events(Protocol):
    def record_event(self, kind: str, subject: str, message: str, *, unless_repeated: bool = False) -> None: ...

    def redact(self, value: Any) -> Any: ...


def send(settings: Settings, ledger: _Events | None, message: dict[str, Any]) -> bool:
    """POST ``message`` (plus ``source`` and ``time``) as JSON; True when the hook answered 2xx."""
    url = settings.webhook_url
    if not url:
        return False
    body = {"source": "gpuq", "host": socket.gethostname(), "time": time.time(),
            **(ledger.redact(message) if ledger is not None else redact.Redactor().value(message))}
    request = urllib.request.Request(url, data=json.dumps(body, sort_keys=True, default=str).encode(),
                                     headers={"Content-Type": "application/json", "User-Agent": "gpuq"},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            ok = 200 <= int(response.status) < 300
            why = f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        ok, why = False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        ok, why = False, type(reason).__name__ if not isinstance(reason, str) else "unreachable"
    if not ok and ledger is not None:
        ledger.record_event("notify", "webhook", f"webhook delivery failed ({why}); the tick went on",
                            unless_repeated=True)
    return ok
