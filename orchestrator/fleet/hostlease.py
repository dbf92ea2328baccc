"""The lease a rented host holds, as gpuq writes it at rent time (docs/providers.md, "When no gpuq command runs:
the host stops itself"; the host's side is payload/agent/gpuq_serving/gpuq_selfstop.py).

A host whose provider puts a stop of its own inside the instance (RunPod, vast.ai) needs nothing from the
controller but ``lease_timeout_min``, which travels with every ``serve``/``enqueue``.  A host whose provider
has none (Lambda) can only tell the user, so it gets the user's ``webhook_url`` (and ``webhook_format``) in its
``lease.json``: the one secret of the controller's that ever goes to a host, and only to such a host, only
while the lease is on, over the SSH channel's stdin (never a command line), into a 0600 file
(docs/security.md).  The controller's cloud keys never go anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.core.config import Settings
from orchestrator.core.errors import GpuqError
from orchestrator.hosts.base import Host
from orchestrator.money.selfstop import can_stop_itself

LEASE_FILE = "lease.json"  # gpuq_selfstop.LEASE_FILE
# stdin -> lease.json, replaced atomically, 0600; the root may not exist yet (the agent makes it too)
_WRITE = 'umask 077 && mkdir -p "$1" && cat > "$1/.lease.json.tmp" && mv -f "$1/.lease.json.tmp" "$1/lease.json"'


@dataclass(frozen=True)
class HostLease:
    """What ``lease.json`` says on a rented host."""

    timeout_s: float
    notify_url: str | None
    notify_format: str

    def document(self) -> dict[str, object]:
        return {"timeout_s": self.timeout_s, "notify_url": self.notify_url, "notify_format": self.notify_format}


def lease_for(provider: str, settings: Settings) -> HostLease | None:
    """The lease a host of ``provider`` needs written at rent time; None when the agent's own flags suffice (a
    provider that stops itself, the lease off, or no webhook to notify)."""
    if can_stop_itself(provider) or settings.lease_timeout_min <= 0 or not settings.webhook_url:
        return None
    return HostLease(settings.lease_timeout_min * 60.0, settings.webhook_url, settings.webhook_format)


def send_lease(host: Host, lease: HostLease) -> None:
    """Write ``lease`` into the host's root; raises GpuqError (its words never carry the URL) when it fails."""
    result = host.run(["sh", "-c", _WRITE, "sh", host.root], stdin=json.dumps(lease.document()).encode())
    if result.exit_code != 0:
        raise GpuqError(f"{host.name}: could not write its {LEASE_FILE} (exit {result.exit_code})")
