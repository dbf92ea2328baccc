"""A host's lease and hold, the part of :class:`orchestrator.ledger.store.Ledger` where the money is.

* :meth:`LeaseRecords.lease_transition` is the only writer of a host's lease (``lease_state``,
  ``lease_reason``, ``lease_changed_at``): it refuses an edge not in ``states.LEASE_ALLOWED`` and appends
  the change's event in the same transaction, as ``Ledger.transition`` does for jobs and attempts;
* :meth:`LeaseRecords.change_hold` writes a hold (``states.HoldKind`` and free detail text), only over the
  holds the change names, checked in the writing transaction;
* ``Ledger.update_host`` writes the other columns (``tables.HostFields``), each typed, never these.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sqlmodel import Session

from orchestrator.core.errors import IllegalTransition, LedgerError
from orchestrator.core.specs import clamp_slots
from orchestrator.core.states import HoldChange, LeaseState, lease_may
from orchestrator.ledger.events import add_event
from orchestrator.ledger.tables import HostFields, HostRow
from orchestrator.ledger.txn import Sessions

if TYPE_CHECKING:
    from typing_extensions import Unpack

WRITABLE = frozenset(HostFields.__annotations__)


def write_fields(host: HostRow, fields: HostFields) -> None:
    """Set ``fields`` on ``host`` (in the caller's session); a column outside ``HostFields`` is refused."""
    for key, value in fields.items():
        if key not in WRITABLE:
            raise LedgerError(f"update_host cannot write {key!r}; a lease changes through Ledger.lease_transition, "
                              "a hold through Ledger.change_hold")
        setattr(host, key, clamp_slots(value) if key == "slots_total" else value)  # type: ignore[arg-type]


def _host(s: Session, name: str) -> HostRow:
    host = s.get(HostRow, name)
    if host is None:
        raise LedgerError(f"unknown host {name!r}")
    return host


def _change_hold(host: HostRow, hold: HoldChange) -> bool:
    if host.hold not in hold.over or (host.hold, host.hold_detail) == (hold.kind, hold.detail):
        return False
    host.hold_kind, host.hold_detail = hold.kind.value, hold.detail
    return True


def check_new_lease(row: HostRow) -> None:
    """A row a host is born with starts its lease from NONE (``Ledger.add_host``)."""
    if row.lease is not LeaseState.NONE and not lease_may(LeaseState.NONE, row.lease):
        raise IllegalTransition("lease", row.name, LeaseState.NONE.value, row.lease.value)


class LeaseRecords(Sessions):
    """Lease and hold methods of the ``Ledger`` (which provides ``session`` and ``reading``)."""

    def lease_transition(self, name: str, new: LeaseState, reason: str, *, at: float | None = None,
                         hold: HoldChange | None = None, **fields: Unpack[HostFields]) -> bool:
        """Move host ``name``'s lease to ``new`` with ``reason`` (the provider's words, or gpuq's) as of
        ``at`` (default now), and with it ``hold`` and ``fields``, in one transaction that appends the
        change's event.  Returns False when the lease already was ``new`` (its reason and the rest are
        still written), True when it changed.  Raises IllegalTransition, changing nothing, for an edge
        ``states.LEASE_ALLOWED`` does not permit."""
        with self.session() as s:
            host = _host(s, name)
            old = host.lease
            if old is not new and not lease_may(old, new):
                raise IllegalTransition("lease", name, old.value, new.value)
            write_fields(host, fields)
            if hold is not None:
                _change_hold(host, hold)
            host.lease_state, host.lease_reason = new.value, reason
            host.lease_changed_at = time.time() if at is None else at
            if old is not new:
                add_event(s, "host", name, old.value, new.value, f"lease: {reason}" if reason else "lease")
            return old is not new

    def change_hold(self, name: str, hold: HoldChange, **fields: Unpack[HostFields]) -> bool:
        """Write ``fields`` and, when host ``name``'s current hold is one of ``hold.over``, ``hold``; in one
        transaction.  Returns whether the hold changed."""
        with self.session() as s:
            host = _host(s, name)
            write_fields(host, fields)
            return _change_hold(host, hold)
