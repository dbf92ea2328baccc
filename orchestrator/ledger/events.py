"""The ledger's events: the history of every state change, plain notes, and the patrol's findings (an
event with a severity, the rule that fired and a suggested action); read by subject as ranges of the
subject index, so a tick costs the same with a million events in the table as with a thousand."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import func
from sqlmodel import Session, col, select

from orchestrator.ledger.eventsql import NEWEST_EVENTS as _NEWEST_EVENTS
from orchestrator.ledger.eventsql import past_prefix
from orchestrator.ledger.tables import Event
from orchestrator.ledger.txn import IN_CHUNK, Sessions

__all__ = ["EventRecords", "add_event", "past_prefix"]


def add_event(s: Session, kind: str, subject: str, old: str, new: str, message: str, *, failure_class: str = "",
              attempt: int | None = None) -> None:
    """One event, in the session that makes the change it records (``failure_class``: the class a settling
    decision names; ``attempt``: the attempt it speaks of)."""
    s.add(Event(time=time.time(), kind=kind, subject=subject, old=old, new=new, message=message,
                failure_class=failure_class, attempt=attempt))


class EventRecords(Sessions):
    """Event methods of :class:`orchestrator.ledger.store.Ledger` (which provides ``session`` and ``reading``)."""

    def record_event(self, kind: str, subject: str, message: str, *, unless_repeated: bool = False) -> None:
        """Append an event.  ``unless_repeated``: skip it when the subject's latest event says the
        same (conditions that every tick re-discovers, e.g. a job that still cannot be placed)."""
        with self.session() as s:
            if unless_repeated:
                last = s.exec(select(Event).where(Event.subject == subject).order_by(col(Event.id).desc())).first()
                if last is not None and last.message == message:
                    return
            add_event(s, kind, subject, "", "", message)

    def record_events(self, kind: str, messages: Mapping[str, str]) -> int:
        """``record_event(kind, subject, message, unless_repeated=True)`` for each {subject: message}, in one
        transaction (a tick that holds ten thousand queued jobs says why in a few reads); how many it wrote."""
        ids = sorted(messages)
        written = 0
        with self.session() as s:
            for start in range(0, len(ids), IN_CHUNK):
                chunk = ids[start:start + IN_CHUNK]
                newest = select(func.max(Event.id)).where(col(Event.subject).in_(chunk)).group_by(col(Event.subject))
                last = {e.subject: e.message for e in s.exec(select(Event).where(col(Event.id).in_(newest)))}
                for subject in chunk:
                    if last.get(subject) != messages[subject]:
                        add_event(s, kind, subject, "", "", messages[subject])
                        written += 1
        return written

    def record_finding(self, kind: str, subject: str, *, severity: str, rule: str, message: str,
                       action: str = "", at: float | None = None, reason: str = "", failure_class: str = "",
                       attempt: int | None = None, signatures: Sequence[str] = ()) -> Event:
        """A patrol finding: an event with a severity, the rule that fired and a suggested action; what a
        reader needs of it in fields (``reason``: its words without the subject's name; ``failure_class``:
        the class of an attempt that ended badly; ``attempt``: the attempt it speaks of; ``signatures``: a
        crash finding's signature names).
        ``at``: its time (default now; a stage run on an injected clock passes its own)."""
        with self.session() as s:
            row = Event(time=time.time() if at is None else at, kind=kind, subject=subject, message=message,
                        severity=severity, rule=rule, action=action, reason=reason, failure_class=failure_class,
                        attempt=attempt, signatures=json.dumps(list(signatures)) if signatures else "")
            s.add(row)
            s.flush()
            s.refresh(row)
            return row

    def open_findings(self, subjects: Iterable[str]) -> dict[tuple[str, str], Event]:
        """The newest finding per (subject, rule) of these subjects, where it is still a warning or
        an escalation (a rule that stops firing is closed by an "info" finding)."""
        ids = sorted(set(subjects))
        latest: dict[tuple[str, str], Event] = {}
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                rows = s.exec(select(Event).where(col(Event.subject).in_(ids[start:start + 500]), Event.rule != "")
                              .order_by(col(Event.id)))
                for row in rows:
                    latest[(row.subject, row.rule)] = row
        return {key: row for key, row in latest.items() if row.severity in ("warn", "escalate")}

    def latest_finding(self, subject: str, rule: str) -> Event | None:
        """The newest finding of ``rule`` about exactly ``subject``, whatever its severity."""
        with self.reading() as s:
            return s.exec(select(Event).where(Event.subject == subject, Event.rule == rule)
                          .order_by(col(Event.id).desc()).limit(1)).first()

    def alerts(self, limit: int = 50, *, since: float | None = None) -> list[Event]:
        """The newest findings first."""
        with self.reading() as s:
            query = select(Event).where(Event.severity != "")
            if since is not None:
                query = query.where(Event.time >= since)
            return list(s.exec(query.order_by(col(Event.id).desc()).limit(limit)))

    def events(self, subject: str | None = None, limit: int = 200, *, exact: bool = False) -> list[Event]:
        """The newest ``limit`` events, oldest first.  ``subject``: those whose subject starts with it (a
        job's own and its attempts', ``JOB/a1``...), read as a range of the subject index: a tick's read
        costs the same with a million events in the table as with a thousand.  Case-sensitive.
        ``exact``: only the subject itself (a host's: ``gpu1`` is no prefix of ``gpu10``'s)."""
        with self.reading() as s:
            query = select(Event)
            if subject and exact:
                query = query.where(col(Event.subject) == subject)
            elif subject:  # "" starts every subject: the newest events of all
                upper = past_prefix(subject)
                query = query.where(col(Event.subject) >= subject)
                query = query.where(col(Event.subject) < upper) if upper is not None else query
            return list(s.exec(query.order_by(col(Event.id).desc()).limit(limit)))[::-1]

    def events_of(self, subjects: Iterable[str], limit: int = 200) -> dict[str, list[Event]]:
        """``events(subject, limit)`` of each of ``subjects``, in a few reads; a subject without events
        is left out."""
        owners: dict[int, list[str]] = {}
        for subject, event_id in self._newest_events(subjects, limit):
            owners.setdefault(event_id, []).append(subject)
        ids = sorted(owners)
        out: dict[str, list[Event]] = {}
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                for row in s.exec(select(Event).where(col(Event.id).in_(ids[start:start + 500]))
                                  .order_by(col(Event.id))):
                    for subject in owners[row.id or 0]:
                        out.setdefault(subject, []).append(row)
        return out

    def rule_counts(self, subjects: Iterable[str], rule: str, limit: int = 200) -> dict[str, int]:
        """How many of ``events(subject, limit)`` are findings of ``rule``, for each of ``subjects`` (a
        subject with none is left out), without reading the events themselves."""
        out: dict[str, int] = {}
        for subject, _ in self._newest_events(subjects, limit, rule):
            out[subject] = out.get(subject, 0) + 1
        return out

    def _newest_events(self, subjects: Iterable[str], limit: int, rule: str | None = None) -> list[tuple[str, int]]:
        """(subject, event id) of the newest ``limit`` events of each subject, as ``events`` picks them,
        those findings of ``rule`` only when given: one windowed range join per 400 subjects."""
        wanted = sorted(set(subjects))
        ranged = [(subject, upper) for subject in wanted if (upper := past_prefix(subject)) is not None]
        out = [(subject, e.id or 0) for subject in wanted if past_prefix(subject) is None
               for e in self.events(subject, limit) if rule is None or e.rule == rule]  # "": no range to join on
        with self.reading() as s:
            raw = s.connection().exec_driver_sql
            for start in range(0, len(ranged), 400):
                chunk = ranged[start:start + 400]
                sql = _NEWEST_EVENTS.format(values=", ".join(["(?, ?)"] * len(chunk)),
                                            rule="" if rule is None else " AND rule = ?")
                params = (*(v for pair in chunk for v in pair), limit, *(() if rule is None else (rule,)))
                out += [(str(subject), int(event_id)) for subject, event_id in raw(sql, params)]
        return out
