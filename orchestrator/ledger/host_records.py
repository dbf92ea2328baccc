"""The ledger's host rows: each host gpuq may run on, as registered, audited or rented (a mixin of
``store.Ledger``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sqlmodel import select

from orchestrator.core.errors import LedgerError
from orchestrator.ledger.events import add_event
from orchestrator.ledger.leases import check_new_lease, write_fields
from orchestrator.ledger.tables import HostFields, HostRow

if TYPE_CHECKING:
    from typing_extensions import Unpack
from orchestrator.ledger.txn import Sessions


class HostRecords(Sessions):
    """Host rows of :class:`orchestrator.ledger.store.Ledger`: register, read, update, remove."""

    # --- hosts ----------------------------------------------------------------------

    def ensure_host(self, name: str, *, kind: str, root: str, python: str = "", target: str = "") -> HostRow:
        with self.session() as s:
            host = s.get(HostRow, name)
            if host is None:
                host = HostRow(name=name, kind=kind, root=root, python=python, target=target, created_at=time.time())
                s.add(host)
                add_event(s, "host", name, "", "added", f"{kind} root={root}")
            else:
                host.root, host.python = root, python
            return host

    def add_host(self, row: HostRow) -> HostRow:
        """Register a new host (the name must be free); one event records it."""
        with self.session() as s:
            if s.get(HostRow, row.name) is not None:
                raise LedgerError(f'host "{row.name}" is already registered')
            check_new_lease(row)
            row.created_at = time.time()
            s.add(row)
            add_event(s, "host", row.name, "", "added",
                      f"{row.kind} {row.target} root={row.root} profile={row.profile}")
            return row

    def remove_host(self, name: str, message: str) -> None:
        with self.session() as s:
            row = s.get(HostRow, name)
            if row is not None:
                s.delete(row)
                add_event(s, "host", name, "added", "removed", message)

    def host(self, name: str) -> HostRow | None:
        with self.reading() as s:
            return s.get(HostRow, name)

    def hosts(self) -> list[HostRow]:
        with self.reading() as s:
            return list(s.exec(select(HostRow).order_by(HostRow.name)))

    def update_host(self, name: str, **fields: Unpack[HostFields]) -> None:
        """Write ``fields`` (never the lease, nor the hold: ``leases.py``)."""
        with self.session() as s:
            host = s.get(HostRow, name)
            if host is None:
                raise LedgerError(f"unknown host {name!r}")
            write_fields(host, fields)
