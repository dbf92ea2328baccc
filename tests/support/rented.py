"""Rented hosts' rows for tests, written as gpuq writes them: born PROVISIONING, then moved along the lease's
edge table (``states.LEASE_ALLOWED``) by ``Ledger.lease_transition``, never set to a state directly."""

from __future__ import annotations

from orchestrator.core.states import LEASE_ALLOWED, LeaseState
from orchestrator.ledger import HostRow, Ledger


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
