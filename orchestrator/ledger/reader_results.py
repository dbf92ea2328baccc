"""The reads of ``gpuq results``, ``report``, ``logs`` and ``explain`` without the ORM: a mixin of
``LedgerReader`` (``reader.py``), each read answering what the ``Ledger``'s method of the same name answers
(``results.py``, ``events.py``, ``pulls.py``, ``sweep_parts.py``, ``stop_records.py``, ``store.redact``), row
for row, in the same order (``tests/unit/test_ledger_reader.py``, ``test_reader_results.py``)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from orchestrator.core import redact
from orchestrator.ledger.eventsql import NEWEST_EVENTS, past_prefix
from orchestrator.ledger.sweeprun import parse_run

if TYPE_CHECKING:
    from orchestrator.ledger.tables import Checkpoint, Event, HostRow, Pull, StopLook, Sweep, SweepPart

_IN_CHUNK = 500


def _marks(n: int) -> str:
    return ", ".join("?" * n)


class ResultReads:
    """Reads of finished jobs' results; ``LedgerReader`` provides ``_conn`` and ``_records``."""

    _conn: sqlite3.Connection
    HOST: type  # the record classes of the rows (``reader.py``)
    SWEEP: type
    EVENT: type
    CHECKPOINT: type
    PULL: type
    PART: type
    STOP_LOOK: type

    if TYPE_CHECKING:
        def _records(self, cls: type[Any], sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def _chunks(self, cls: type, sql: str, ids: Sequence[str], *more: Any) -> list[Any]:
        """``sql`` (with ``{marks}`` for the ids) run per 500 ids, the rows of every chunk in turn."""
        out: list[Any] = []
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start:start + _IN_CHUNK]
            out.extend(self._records(cls, sql.format(marks=_marks(len(chunk))), (*chunk, *more)))
        return out

    def host(self, name: str) -> HostRow | None:
        found = self._records(self.HOST, "SELECT * FROM host WHERE name = ?", (name,))
        return cast("HostRow", found[0]) if found else None

    def sweep(self, sweep_id: str) -> Sweep | None:
        found = self._records(self.SWEEP, "SELECT * FROM sweep WHERE id = ?", (sweep_id,))
        return cast("Sweep", found[0]) if found else None

    def parts_of(self, sweep_id: str) -> list[SweepPart]:
        """``Ledger.parts_of``: one sweep's parts (``submit --into``), by number."""
        return cast("list[SweepPart]", self._records(self.PART, "SELECT * FROM sweep_part WHERE sweep_id = ? "
                                                                "ORDER BY number", (sweep_id,)))

    def stop_looks(self, sweep_ids: Iterable[str]) -> list[StopLook]:
        """``Ledger.stop_looks``: the sweeps' early-stopping looks, oldest first (per 500 sweeps, as it reads)."""
        sql = "SELECT * FROM stop_look WHERE sweep_id IN ({marks}) ORDER BY id"
        return cast("list[StopLook]", self._chunks(self.STOP_LOOK, sql, sorted(set(sweep_ids))))

    def metric_values(self, job_ids: Iterable[str], scopes: Sequence[str] = ("final", "best"),
                      names: Sequence[str] | None = None) -> list[tuple[str, str, str, float, int | None]]:
        ids = sorted(set(job_ids))
        out: list[tuple[str, str, str, float, int | None]] = []
        also = f" AND name IN ({_marks(len(names))})" if names is not None else ""
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start:start + _IN_CHUNK]
            sql = (f"SELECT job_id, scope, name, value, step FROM metric WHERE job_id IN ({_marks(len(chunk))})"
                   f" AND scope IN ({_marks(len(scopes))}){also} ORDER BY id")
            out += self._conn.execute(sql, (*chunk, *scopes, *(names or ()))).fetchall()
        return out

    def with_metrics(self, job_ids: Iterable[str]) -> set[str]:
        ids = sorted(set(job_ids))
        found: set[str] = set()
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start:start + _IN_CHUNK]
            found.update(job for (job,) in self._conn.execute(
                f"SELECT DISTINCT job_id FROM metric WHERE job_id IN ({_marks(len(chunk))}) "
                "AND scope IN ('final', 'best')", chunk))
        return found

    def curves(self, job_ids: Iterable[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
        out: dict[str, dict[str, list[tuple[int, float]]]] = {}
        ids = list(dict.fromkeys(job_ids))
        rows: list[tuple[int, str, str, int | None, float]] = []
        for start in range(0, len(ids), _IN_CHUNK):  # one ORDER BY id over all of them, as the Ledger's one read
            chunk = ids[start:start + _IN_CHUNK]
            rows += self._conn.execute(f"SELECT id, job_id, name, step, value FROM metric WHERE job_id IN "
                                       f"({_marks(len(chunk))}) AND scope = 'curve'", chunk).fetchall()
        rows.sort(key=lambda r: r[0])
        for _, job_id, name, step, value in rows:
            out.setdefault(job_id, {}).setdefault(name, []).append((step or 0, value))
        for by_name in out.values():
            for points in by_name.values():
                points.sort(key=lambda p: p[0])
        return out

    def checkpoints_of(self, job_ids: Iterable[str]) -> dict[str, list[Checkpoint]]:
        out: dict[str, list[Checkpoint]] = {}
        sql = "SELECT * FROM checkpoint WHERE job_id IN ({marks}) ORDER BY job_id, step"
        for row in self._chunks(self.CHECKPOINT, sql, sorted(set(job_ids))):
            out.setdefault(row.job_id, []).append(row)
        return out

    def pulls(self, job_ids: Iterable[str]) -> list[Pull]:
        rows = self._chunks(self.PULL, "SELECT * FROM pull WHERE job_id IN ({marks})", list(job_ids))
        return sorted(rows, key=lambda p: (p.created_at, p.id or 0))

    def verified_pulls(self, job_ids: Iterable[str]) -> dict[str, Pull]:
        newest: dict[str, Pull] = {}
        for row in self.pulls(job_ids):
            newest[row.job_id] = row
        return {job_id: row for job_id, row in newest.items() if row.state == "verified"}

    def open_findings(self, subjects: Iterable[str]) -> dict[tuple[str, str], Event]:
        latest: dict[tuple[str, str], Event] = {}
        sql = "SELECT * FROM event WHERE subject IN ({marks}) AND rule != '' ORDER BY id"
        for row in self._chunks(self.EVENT, sql, sorted(set(subjects))):
            latest[(row.subject, row.rule)] = row
        return {key: row for key, row in latest.items() if row.severity in ("warn", "escalate")}

    def events(self, subject: str | None = None, limit: int = 200, *, exact: bool = False) -> list[Event]:
        sql, params = "SELECT * FROM event", []
        if subject and exact:
            sql, params = sql + " WHERE subject = ?", [subject]
        elif subject:
            upper = past_prefix(subject)
            sql, params = sql + " WHERE subject >= ?", [subject]
            if upper is not None:
                sql, params = sql + " AND subject < ?", [subject, upper]
        rows = self._records(self.EVENT, sql + " ORDER BY id DESC LIMIT ?", [*params, limit])
        return cast("list[Event]", rows[::-1])

    def events_of(self, subjects: Iterable[str], limit: int = 200) -> dict[str, list[Event]]:
        owners: dict[int, list[str]] = {}
        for subject, event_id in self._newest_events(subjects, limit):
            owners.setdefault(event_id, []).append(subject)
        out: dict[str, list[Event]] = {}
        for row in self._chunks(self.EVENT, "SELECT * FROM event WHERE id IN ({marks}) ORDER BY id",
                                cast("list[str]", sorted(owners))):
            for subject in owners[row.id or 0]:
                out.setdefault(subject, []).append(row)
        return out

    def rule_counts(self, subjects: Iterable[str], rule: str, limit: int = 200) -> dict[str, int]:
        out: dict[str, int] = {}
        for subject, _ in self._newest_events(subjects, limit, rule):
            out[subject] = out.get(subject, 0) + 1
        return out

    def _newest_events(self, subjects: Iterable[str], limit: int, rule: str | None = None) -> list[tuple[str, int]]:
        wanted = sorted(set(subjects))
        ranged = [(subject, upper) for subject in wanted if (upper := past_prefix(subject)) is not None]
        out = [(subject, e.id or 0) for subject in wanted if past_prefix(subject) is None
               for e in self.events(subject, limit) if rule is None or e.rule == rule]
        for start in range(0, len(ranged), 400):
            chunk = ranged[start:start + 400]
            sql = NEWEST_EVENTS.format(values=", ".join(["(?, ?)"] * len(chunk)),
                                       rule="" if rule is None else " AND rule = ?")
            params = (*(v for pair in chunk for v in pair), limit, *(() if rule is None else (rule,)))
            out += [(str(subject), int(event_id)) for subject, event_id in self._conn.execute(sql, params)]
        return out

    def redact(self, value: Any) -> Any:
        """``Ledger.redact``: ``value`` without the values the ledger's sweeps forward, as this process's
        environment holds them, nor common token shapes (``orchestrator/core/redact.py``)."""
        names: set[str] = set()
        for (stored,) in self._conn.execute("SELECT run FROM sweep WHERE run != ''"):
            run = parse_run(stored)
            names.update(run.forward_env if run is not None else ())
        pairs = {n: os.environ[n] for n in sorted(names) if n in os.environ}
        return redact.Redactor.of(pairs).value(value)
