"""Rented hosts' rows for tests, written as gpuq writes them: born PROVISIONING, then moved along the lease's
edge table (``states.LEASE_ALLOWED``) by ``Ledger.lease_transition``, never set to a state directly."""

from __future__ import annotations

from typing import Any

from orchestrator.core.states import LEASE_ALLOWED, LeaseState
from orchestrator.ledger import HostRow, Ledger

T0 = 1_800_000_000.0  # a fixed "now" for rows built in memory


def rented_row(name: str = "rp-a", **kw: Any) -> HostRow:
    """A RunPod pod's row, running, down-when-done, at $0.79/h since ``T0``; ``kw`` overrides any field."""
    values: dict[str, Any] = {"name": name, "kind": "ssh", "target": "root@h", "root": "/r", "provider": "runpod",
                              "instance_id": "pod1", "lease_state": "running", "down_when_done": True,
                              "health": "pass", "price_per_hour": 0.79, "created_at": T0, "lease_changed_at": T0}
    values.update(kw)
    return HostRow(**values)


def add_rented(ledger: Ledger, row: HostRow) -> HostRow:
    """Register ``row`` with its lease in ``row.lease_state`` (with ``row.lease_reason``): recorded
    PROVISIONING as `gpuq up` records it, then RUNNING when that is on the way, then the state itself."""
    want, reason, at = row.lease, row.lease_reason, row.lease_changed_at
    row.lease_state, row.lease_reason = LeaseState.PROVISIONING.value, ""
    added = ledger.add_host(row)
    at = added.created_at if at is None else at  # it changed as it was added
    path = [] if want is LeaseState.PROVISIONING else [want]
    if want not in LEASE_ALLOWED[LeaseState.PROVISIONING] | {LeaseState.PROVISIONING}:
        path.insert(0, LeaseState.RUNNING)
    for state in path:
        ledger.lease_transition(row.name, state, reason if state is want else "", at=at)
    found = ledger.host(row.name)
    assert found is not None and found.lease is want
    return found
