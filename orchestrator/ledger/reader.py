"""The ledger's read path without the ORM: ``gpuq status --no-probe`` answers from bare ``sqlite3``.

Loading SQLAlchemy, SQLModel and the table models costs a read-only command more than reading ten
thousand rows does.  ``LedgerReader`` answers the reads a ledger-only snapshot makes (``api/snapshot.py``:
hosts, sweeps and their parts, jobs, attempts, counts, alerts, and what a budget's standing is reckoned from) in one
read transaction (a consistent snapshot that blocks no writer), from a read-only connection.

There is no second copy of the tables: a row becomes a record whose attributes are the columns the
ledger file has (the schema ``tables.py`` and ``migrate.py`` made), with the row methods of its model
(``rowmethods.py``), and the model's Python types (SQLite keeps booleans as 0/1).  The reader refuses a
ledger it cannot read as it is (none yet, or not at this gpuq's schema version): the caller then opens
the ``Ledger``, which creates or migrates it.  ``tests/unit/test_ledger_reader.py`` holds every answer
to the ``Ledger``'s on the same file, row for row and type for type.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from orchestrator.core.errors import JobNotFound
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger.migrate import SCHEMA_VERSION
from orchestrator.ledger.pricing import PricedAttempt
from orchestrator.ledger.reader_results import ResultReads
from orchestrator.ledger.rowmethods import (
    AttemptMethods,
    EventMethods,
    HostMethods,
    JobMethods,
    PartMethods,
    SweepMethods,
)

if TYPE_CHECKING:
    from orchestrator.ledger.tables import Attempt, Event, HostRow, Job, Sweep, SweepPart

_IN_CHUNK = 500  # ids per IN (...) list, as the Ledger reads them
_LIKE_ESCAPE = "/"


class ReaderUnavailable(Exception):
    """The ledger cannot be read without the ORM as it is (missing, or another schema version)."""


class LedgerReads(Protocol):
    """The reads a ledger-only snapshot makes (``api/snapshot.ledger_status``, ``tick/budget.standings``):
    both ``store.Ledger`` and ``LedgerReader`` answer them."""

    def hosts(self) -> list[HostRow]: ...
    def sweeps(self) -> list[Sweep]: ...
    def sweep_parts(self) -> list[SweepPart]: ...
    def resolve_sweep(self, ref: str | None) -> Sweep: ...
    def jobs(self, *, sweep_id: str | None = None, states: Iterable[JobState] | None = None) -> list[Job]: ...
    def state_counts(self) -> dict[str, dict[str, int]]: ...
    def attempts_of(self, job_ids: Iterable[str]) -> list[Attempt]: ...
    def attempts_on(self, hosts: Iterable[str]) -> list[Attempt]: ...
    def alerts(self, limit: int = 50, *, since: float | None = None) -> list[Event]: ...
    def priced_attempts(self, sweep_ids: Iterable[str]) -> dict[str, list[PricedAttempt]]: ...
    def run_history(self) -> list[tuple[str, str, int, float]]: ...


class Record:
    """One row: its columns as attributes (a read-only view; nothing is written back).

    Slotted: each read makes (once per table and column list) a subclass whose slots are the columns the
    ledger file has, so a row costs its values and a pointer per column, not a dict (a 100,000-job sweep's
    rows are a few hundred thousand records)."""

    __slots__ = ()
    __table__ = ""
    __columns__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}={v!r}" for k, v in record_columns(self).items())
        return f"{type(self).__name__}({cols})"


def record_columns(rec: object) -> dict[str, Any]:
    """{column: value} of a record (typed as its model where it is read), in the file's column order."""
    return {name: getattr(rec, name) for name in cast("Record", rec).__columns__}


_SHAPES: dict[tuple[type, tuple[str, ...], tuple[str, ...], tuple[int, ...]], type[Any]] = {}
_SAMPLE = 256  # rows a read looks at to tell repeating text columns (a state, a host) from unique ones (an id)


def _shaped(cls: type[Record], names: tuple[str, ...], booleans: tuple[str, ...],
            shared: tuple[int, ...]) -> type[Any]:
    """The slotted subclass of ``cls`` for rows of these columns, built from a row tuple in one call; its
    ``_make(*setdefaults)`` gives the ``__init__`` of one read, which passes the ``shared`` columns' values
    through their caches' ``setdefault`` (each repeated text one string object)."""
    key = (cls, names, booleans, shared)
    found = _SHAPES.get(key)
    if found is None:
        if not all(name.isidentifier() for name in names):
            raise ReaderUnavailable(f"table {cls.__table__}: a column name that is no identifier: {names}")
        sets = [f"self.{name} = None if r[{i}] is None else bool(r[{i}])" if name in booleans
                else f"self.{name} = s{i}(r[{i}], r[{i}])" if i in shared
                else f"self.{name} = r[{i}]" for i, name in enumerate(names)]
        code = (f"def make({', '.join(f's{i}' for i in shared)}):\n    def __init__(self, r):\n        "
                + "\n        ".join(sets or ["pass"]) + "\n    return __init__\n")
        space: dict[str, Any] = {}
        exec(code, space)  # the file's own column names, checked to be identifiers above
        found = _SHAPES[key] = type(cls.__name__, (cls,), {"__slots__": names, "__columns__": names,
                                                           "_make": staticmethod(space["make"])})
    return found


def _repeating(head: Sequence[tuple[Any, ...]]) -> tuple[int, ...]:
    """The text columns whose values repeat (SQLite hands out a new string per row: a 100,000-job sweep's
    states, hosts, configs and provenance would be that many copies): those whose first ``_SAMPLE`` rows
    hold at most half as many distinct texts as rows."""
    if len(head) < 16:
        return ()
    return tuple(i for i, value in enumerate(head[0]) if isinstance(value, str) and len(value) > 1
                 and len({row[i] for row in head}) * 2 <= len(head))


class HostRecord(Record, HostMethods):
    __slots__ = ()
    __table__ = "host"


class SweepRecord(Record, SweepMethods):
    __slots__ = ()
    __table__ = "sweep"


class PartRecord(Record, PartMethods):
    __slots__ = ()
    __table__ = "sweep_part"


class JobRecord(Record, JobMethods):
    __slots__ = ()
    __table__ = "job"


class AttemptRecord(Record, AttemptMethods):
    __slots__ = ()
    __table__ = "attempt"


class EventRecord(Record, EventMethods):
    __slots__ = ()
    __table__ = "event"


class CheckpointRecord(Record):
    __slots__ = ()
    __table__ = "checkpoint"


class PullRecord(Record):
    __slots__ = ()
    __table__ = "pull"


class StopLookRecord(Record):  # early stopping's looks (the report's stopped cells)
    __slots__ = ()
    __table__ = "stop_look"


def _prefix_pattern(prefix: str) -> str:
    """``LIKE ? ESCAPE '/'``'s pattern for ``prefix`` (SQLAlchemy's ``startswith(autoescape=True)``)."""
    escaped = "".join(_LIKE_ESCAPE + ch if ch in "%_/" else ch for ch in prefix)
    return escaped + "%"


class LedgerReader(ResultReads):
    """Read-only answers from the ledger file at ``path``; ``ReaderUnavailable`` when it cannot give them."""

    HOST, SWEEP, EVENT, CHECKPOINT, PULL = HostRecord, SweepRecord, EventRecord, CheckpointRecord, PullRecord
    PART, STOP_LOOK = PartRecord, StopLookRecord

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise ReaderUnavailable(f"{path}: no ledger yet")
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise ReaderUnavailable(f"{path}: {exc}") from exc
        try:
            conn.execute("BEGIN")  # one snapshot for every read of this command
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc:
            conn.close()
            raise ReaderUnavailable(f"{path}: {exc}") from exc
        if version != SCHEMA_VERSION:
            conn.close()
            raise ReaderUnavailable(f"{path}: schema v{version}, this gpuq reads v{SCHEMA_VERSION}")
        self._conn = conn
        self._booleans: dict[str, tuple[str, ...]] = {}

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LedgerReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- rows ----------------------------------------------------------------------------------------

    def _booleans_of(self, table: str) -> tuple[str, ...]:
        """The table's BOOLEAN columns (SQLite stores 0/1; the models say True/False)."""
        found = self._booleans.get(table)
        if found is None:
            rows = self._conn.execute("SELECT name, type FROM pragma_table_info(?)", (table,)).fetchall()
            found = self._booleans[table] = tuple(name for name, kind in rows if str(kind).upper() == "BOOLEAN")
        return found

    def _records(self, cls: type[Any], sql: str, params: Sequence[Any] = ()) -> list[Any]:
        cursor = self._conn.execute(sql, params)
        names = tuple(d[0] for d in cursor.description)
        head = cursor.fetchmany(_SAMPLE)
        shared = _repeating(head)
        shaped = _shaped(cls, names, tuple(n for n in self._booleans_of(cls.__table__) if n in names), shared)
        caches: list[dict[Any, Any]] = [{} for _ in shared]  # this read's: dropped with it
        shaped.__init__ = shaped._make(*(cache.setdefault for cache in caches))
        out = list(map(shaped, head))
        out.extend(map(shaped, cursor))
        return out

    # --- the reads of a ledger-only snapshot (each as ``store.Ledger``'s of the same name) -------------

    def hosts(self) -> list[HostRow]:
        return cast("list[HostRow]", self._records(HostRecord, "SELECT * FROM host ORDER BY name"))

    def sweeps(self) -> list[Sweep]:
        return cast("list[Sweep]", self._records(SweepRecord, "SELECT * FROM sweep ORDER BY created_at"))

    def sweep_parts(self) -> list[SweepPart]:
        return cast("list[SweepPart]", self._records(PartRecord, "SELECT * FROM sweep_part ORDER BY sweep_id, number"))

    def resolve_sweep(self, ref: str | None) -> Sweep:
        """A sweep id or unique prefix; None means the newest sweep."""
        if ref is None:
            newest = self._records(SweepRecord, "SELECT * FROM sweep ORDER BY created_at DESC LIMIT 1")
            if not newest:
                raise JobNotFound("no sweeps yet; submit one with `gpuq submit QUEUE`")
            return cast("Sweep", newest[0])
        found = self._records(SweepRecord, f"SELECT * FROM sweep WHERE id LIKE ? ESCAPE '{_LIKE_ESCAPE}'",
                              (_prefix_pattern(ref),))
        if len(found) == 1:
            return cast("Sweep", found[0])
        if not found:
            raise JobNotFound(f"no sweep matches {ref!r}; `gpuq status` lists the sweeps")
        raise JobNotFound(f"sweep prefix {ref!r} is ambiguous: {', '.join(sorted(x.id for x in found))}")

    def jobs(self, *, sweep_id: str | None = None, states: Iterable[JobState] | None = None) -> list[Job]:
        where: list[str] = []
        params: list[Any] = []
        if sweep_id is not None:
            where.append("sweep_id = ?")
            params.append(sweep_id)
        if states is not None:
            values = [st.value for st in states]
            where.append(f"state IN ({', '.join('?' * len(values))})" if values else "0")
            params.extend(values)
        sql = "SELECT * FROM job" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, line"
        return cast("list[Job]", self._records(JobRecord, sql, params))

    def state_counts(self) -> dict[str, dict[str, int]]:
        """{sweep_id: {state: count}} in one query."""
        out: dict[str, dict[str, int]] = {}
        for sweep_id, state, count in self._conn.execute(
                "SELECT sweep_id, state, count(*) FROM job GROUP BY sweep_id, state"):
            out.setdefault(sweep_id, {})[state] = int(count)
        return out

    def attempts_of(self, job_ids: Iterable[str]) -> list[Attempt]:
        """Every attempt of the given jobs, by job then number."""
        ids = sorted(set(job_ids))
        out: list[Any] = []
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start:start + _IN_CHUNK]
            out.extend(self._records(AttemptRecord, f"SELECT * FROM attempt WHERE job_id IN "
                                     f"({', '.join('?' * len(chunk))}) ORDER BY job_id, number", chunk))
        return cast("list[Attempt]", out)

    def attempts_on(self, hosts: Iterable[str]) -> list[Attempt]:
        """Every attempt whose (rank-0) host is one of ``hosts``, by job then number."""
        names = sorted(set(hosts))
        out: list[Any] = []
        for start in range(0, len(names), _IN_CHUNK):
            chunk = names[start:start + _IN_CHUNK]
            out.extend(self._records(AttemptRecord, f"SELECT * FROM attempt WHERE host IN "
                                     f"({', '.join('?' * len(chunk))}) ORDER BY job_id, number", chunk))
        return cast("list[Attempt]", out)

    def alerts(self, limit: int = 50, *, since: float | None = None) -> list[Event]:
        """The newest findings first."""
        sql, params = "SELECT * FROM event WHERE severity != ''", []
        if since is not None:
            sql, params = sql + " AND time >= ?", [since]
        return cast("list[Event]", self._records(EventRecord, sql + " ORDER BY id DESC LIMIT ?", [*params, limit]))

    def priced_attempts(self, sweep_ids: Iterable[str]) -> dict[str, list[PricedAttempt]]:
        """{sweep: its attempts that fixed a price}, by job then number."""
        ids = sorted(set(sweep_ids))
        out: dict[str, list[PricedAttempt]] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start:start + _IN_CHUNK]
            rows = self._conn.execute(
                "SELECT job.sweep_id, attempt.job_id, attempt.state, attempt.started_at, attempt.ended_at, "
                "attempt.price_per_hour, attempt.gpu_share FROM job JOIN attempt ON attempt.job_id = job.id "
                f"WHERE job.sweep_id IN ({', '.join('?' * len(chunk))}) AND attempt.price_per_hour IS NOT NULL "
                "ORDER BY attempt.job_id, attempt.number", chunk)
            for sweep_id, job_id, state, started, ended, price, share in rows:
                out.setdefault(sweep_id, []).append(PricedAttempt(job_id, state, started, ended, price, share))
        return out

    def run_history(self) -> list[tuple[str, str, int, float]]:
        """(config, task, epochs, seconds) of each SUCCEEDED job's successful attempt from scratch, oldest first
        (``Ledger.run_history``)."""
        rows = self._conn.execute(
            "SELECT job.config, job.task, job.epochs, attempt.ended_at - attempt.started_at "
            "FROM job JOIN attempt ON attempt.job_id = job.id "
            "WHERE job.state = ? AND attempt.state = ? AND attempt.exit_code = 0 AND attempt.resume_from = '' "
            "AND attempt.started_at IS NOT NULL AND attempt.ended_at IS NOT NULL "
            "AND attempt.ended_at > attempt.started_at ORDER BY attempt.created_at, attempt.id",
            (JobState.SUCCEEDED.value, AttemptState.EXITED.value))
        return [(config, task, epochs, secs) for config, task, epochs, secs in rows if secs is not None]
