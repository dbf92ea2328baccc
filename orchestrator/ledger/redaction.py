"""Host text is redacted as the ledger writes it (``orchestrator/core/redact.py``, docs/security.md).

Every writing session of the ledger gets a ``before_flush`` hook that passes the text fields that
can carry host text (event messages and actions, an attempt's message, a host's health detail,
hold and lease reasons) through the redactor of the forwarded variables: the names every sweep
forwards (``Sweep.run``'s ``forward_env``), their values from this process's environment.  One
place, so no caller can forget it; the names are read again only when the sweeps change.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import event, text
from sqlmodel import Session

from orchestrator.core import redact
from orchestrator.ledger.sweeprun import parse_run
from orchestrator.ledger.tables import Attempt, Event, HostRow

FIELDS: dict[type, tuple[str, ...]] = {
    Event: ("message", "action"),
    Attempt: ("message",),
    HostRow: ("health_detail", "hold_detail", "lease_reason"),
}


class LedgerRedaction:
    """The redactor of one Ledger, cached until the set of sweeps changes."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._names: tuple[str, ...] = ()
        self._made: tuple[tuple[tuple[str, str], ...], redact.Redactor] | None = None  # (name, value) pairs

    def install(self, session: Session) -> None:
        event.listen(session, "before_flush", self._before_flush)

    def forwarded_names(self, session: Session) -> tuple[str, ...]:
        conn = session.connection()
        key = tuple(conn.execute(text("SELECT count(*), max(created_at) FROM sweep")).one())
        if key != self._key:
            names: set[str] = set()
            for (stored,) in conn.execute(text("SELECT run FROM sweep WHERE run != ''")):
                run = parse_run(stored)
                names.update(run.forward_env if run is not None else ())
            self._key, self._names = key, tuple(sorted(names))
        return self._names

    def redactor(self, session: Session) -> redact.Redactor:
        """The redactor of the forwarded names' current values (rebuilt only when they change)."""
        pairs = tuple((n, os.environ[n]) for n in self.forwarded_names(session) if n in os.environ)
        if self._made is None or self._made[0] != pairs:
            self._made = (pairs, redact.Redactor.of(dict(pairs)))
        return self._made[1]

    def _before_flush(self, session: Session, _context: Any, _instances: Any) -> None:
        pending = [obj for obj in (*session.new, *session.dirty) if type(obj) in FIELDS]
        if not pending:
            return
        with session.no_autoflush:
            redactor = self.redactor(session)
        for obj in pending:
            for name in FIELDS[type(obj)]:
                value = getattr(obj, name, None)
                if isinstance(value, str) and value:
                    cleaned = redactor.text(value)
                    if cleaned != value:
                        setattr(obj, name, cleaned)
