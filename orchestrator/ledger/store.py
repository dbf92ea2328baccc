"""The Ledger: every read and write of gpuq's SQLite state goes through here.  This module opens
the file and holds every change of a job's or an attempt's state; the rest are its mixins, each in its own
module: host rows (``host_records.py``), sweeps and their jobs (``sweep_records.py``), attempt reads and
progress (``attempt_records.py``), events and findings (``events.py``), what finished jobs left
(``results.py``), the pull outcomes (``pulls.py``) and rented hosts' leases (``leases.py``).

Rules this class enforces:

* Only :meth:`Ledger.transition` changes a job's or an attempt's state; it
  refuses changes not in ``states.JOB_ALLOWED``/``ATTEMPT_ALLOWED`` and
  appends an Event for each change, in the same transaction.  A rented host's
  lease changes only through ``lease_transition`` (``leases.py``), the same way.
* :meth:`Ledger.add_sweep` inserts a sweep and all its jobs in one SQLite
  transaction: killing gpuq at any moment leaves all of it or none of it.
* The ledger file is created with mode 0600; it runs in WAL mode with a busy
  timeout so a ``gpuq status`` and a ``gpuq submit`` can overlap.
* Every writing session holds SQLite's write lock from its first read (``BEGIN IMMEDIATE``,
  ``ledger/txn.py``): a check-and-change (``start_attempt`` only from QUEUED, ``move_job`` only of
  the current attempt, ``transition``) is one atomic step across gpuq processes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from orchestrator.core.errors import IllegalTransition, JobNotFound, LedgerError
from orchestrator.core.states import ENDS_AS, AttemptState, JobState, attempt_may, job_may
from orchestrator.ledger.attempt_records import AttemptRecords
from orchestrator.ledger.dependency_records import DependencyRecords
from orchestrator.ledger.events import EventRecords, add_event
from orchestrator.ledger.host_records import HostRecords
from orchestrator.ledger.leases import LeaseRecords
from orchestrator.ledger.migrate import migrate
from orchestrator.ledger.pricing import attempt_price
from orchestrator.ledger.pulls import PullRecords
from orchestrator.ledger.redaction import LedgerRedaction
from orchestrator.ledger.results import ResultRecords
from orchestrator.ledger.stop_records import StopRecords
from orchestrator.ledger.sweep_parts import SweepParts
from orchestrator.ledger.sweep_records import SweepRecords
from orchestrator.ledger.tables import Attempt, HostRow, Job
from orchestrator.ledger.txn import BUSY_TIMEOUT_MS, IN_CHUNK, ledger_engine, transaction

if TYPE_CHECKING:
    pass


def _create_private(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)


class Ledger(HostRecords, SweepRecords, SweepParts, AttemptRecords, EventRecords, ResultRecords, PullRecords,
             LeaseRecords, StopRecords, DependencyRecords):
    """gpuq's SQLite ledger (one file under ``$GPUQ_HOME``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            _create_private(path)
            raw = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            try:
                raw.execute("PRAGMA journal_mode=WAL")
                migrate(raw, str(path))
            finally:
                raw.close()
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"{path}: cannot open the ledger: {exc}") from exc
        self.engine: Engine = ledger_engine(f"sqlite:///{path}")
        self._redaction = LedgerRedaction()  # host text loses forwarded secret values as it is written

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One writing transaction (``BEGIN IMMEDIATE``, ``ledger/txn.py``): what it reads cannot
        change before it writes; committed on success, rolled back on any error."""
        with self._transaction(write=True) as session:
            yield session

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """One read-only transaction: a consistent snapshot that blocks no writer."""
        with self._transaction(write=False) as session:
            yield session

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Session]:
        try:
            with transaction(self.engine, write=write) as session:
                if write:
                    self._redaction.install(session)
                yield session
        except SQLAlchemyError as exc:
            raise LedgerError(f"{self.path}: ledger error: {exc.__class__.__name__}: {exc}") from exc

    def redact(self, value: Any) -> Any:
        """``value`` (text, or JSON-like) without the values the ledger's sweeps forward, as this
        process's environment holds them, nor common token shapes (``orchestrator/core/redact.py``)."""
        with self.reading() as s:
            return self._redaction.redactor(s).value(value)

    # --- attempts ------------------------------------------------------------------

    def start_attempt(self, job_id: str, *, host: str, bundle_sha: str, resume_from: str = "",
                      peers: Sequence[str] = ()) -> Attempt:
        """Create attempt n+1 (STARTING) and move the job to ASSIGNED, in one transaction.

        Only from QUEUED: a job another gpuq command started meanwhile (ASSIGNED, RUNNING, ...)
        raises IllegalTransition, never gets a second live attempt.  The write lock is held from
        the state read on (``BEGIN IMMEDIATE``), so two commands cannot both see it QUEUED.
        ``peers``: the other hosts of a multi-node attempt (node ranks 1..), ``host`` being rank 0."""
        with self.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id!r}")
            return self._start(s, job, host=host, bundle_sha=bundle_sha, resume_from=resume_from, peers=peers)

    def start_attempts(self, job_ids: Sequence[str], *, host: str,
                       bundle_sha: str) -> dict[str, Attempt | IllegalTransition]:
        """``start_attempt`` for every job of one delivery to ``host``, in one transaction: each job's
        new attempt, or the IllegalTransition that left that job untouched (it was no longer QUEUED).
        A job that does not exist raises JobNotFound and nothing is written."""
        with self.session() as s:
            jobs: dict[str, Job] = {}
            for start in range(0, len(job_ids), IN_CHUNK):
                chunk = list(job_ids[start:start + IN_CHUNK])
                jobs.update((job.id, job) for job in s.exec(select(Job).where(col(Job.id).in_(chunk))))
            out: dict[str, Attempt | IllegalTransition] = {}
            rows = {host: s.get(HostRow, host)}
            for job_id in job_ids:
                job = jobs.get(job_id)
                if job is None:
                    raise JobNotFound(f"no job {job_id!r}")
                try:
                    out[job_id] = self._start(s, job, host=host, bundle_sha=bundle_sha, rows=rows)
                except IllegalTransition as exc:  # raised before anything of this job changed
                    out[job_id] = exc
            return out

    def _start(self, s: Session, job: Job, *, host: str, bundle_sha: str, resume_from: str = "",
               peers: Sequence[str] = (), rows: Mapping[str, HostRow | None] | None = None) -> Attempt:
        if job.state != JobState.QUEUED.value:
            raise IllegalTransition("job", job.id, job.state,
                                    f"{JobState.ASSIGNED.value} (attempt {job.attempt_count + 1} on {host}: "
                                    f"only a QUEUED job starts)")
        self._transition_job(s, job, JobState.ASSIGNED, f"attempt {job.attempt_count + 1} on {host}",
                             attempt=job.attempt_count + 1)
        job.attempt_count += 1
        job.host = host
        attempt = Attempt(
            job_id=job.id,
            number=job.attempt_count,
            host=host,
            state=AttemptState.STARTING.value,
            bundle_sha=bundle_sha,
            resume_from=resume_from,
            created_at=time.time(),
            nodes=json.dumps([host, *peers]) if peers else "",
            **_price(s, job.gpus, host, *peers, rows=rows),
        )
        s.add(attempt)
        add_event(s, "attempt", f"{job.id}/a{attempt.number}", "", AttemptState.STARTING.value, host)
        return attempt

    def move_job(self, job_id: str, *, from_attempt: int, to_host: str, bundle_sha: str, message: str) -> Attempt:
        """Work stealing: attempt n (withdrawn unstarted from its host) ends KILLED and attempt n+1
        starts on ``to_host``, in one transaction, so the ledger never shows two live claims."""
        with self.session() as s:
            job = s.get(Job, job_id)
            old = s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == from_attempt)).first()
            if job is None or old is None:
                raise JobNotFound(f"no attempt {from_attempt} of job {job_id!r}")
            if job.state != JobState.ASSIGNED.value or job.attempt_count != from_attempt:
                raise IllegalTransition("job", job_id, job.state, f"moved (attempt {from_attempt} is not current)")
            if not attempt_may(AttemptState(old.state), AttemptState.KILLED):
                raise IllegalTransition("attempt", f"{job_id}/a{from_attempt}", old.state, AttemptState.KILLED.value)
            add_event(s, "attempt", f"{job_id}/a{from_attempt}", old.state, AttemptState.KILLED.value, message)
            old.state = AttemptState.KILLED.value
            old.ended_at = time.time()
            old.message = message
            job.attempt_count += 1
            job.host = to_host
            job.updated_at = time.time()
            attempt = Attempt(job_id=job_id, number=job.attempt_count, host=to_host, state=AttemptState.STARTING.value,
                              bundle_sha=bundle_sha, resume_from=old.resume_from, created_at=time.time(),
                              **_price(s, job.gpus, to_host))
            s.add(attempt)
            add_event(s, "job", job_id, job.state, job.state, message)
            add_event(s, "attempt", f"{job_id}/a{attempt.number}", "", AttemptState.STARTING.value, to_host)
            return attempt

    # --- the one place states change ----------------------------------------------

    def transition(
        self,
        job_id: str,
        new: JobState | AttemptState,
        *,
        attempt: int | None = None,
        message: str = "",
        of_attempt: int | None = None,
        failure_class: str = "",
    ) -> bool:
        """Change a job's (or, with ``attempt``, an attempt's) state; append an Event (a job's carries
        ``failure_class``: the class the settling decision names, "" for none).

        Returns False when the subject is already in ``new`` (idempotent), True
        when it changed.  Raises IllegalTransition for a change not allowed.
        ``of_attempt``: a job change that follows from what attempt ``of_attempt`` did; when the job
        has moved on to a later attempt meanwhile (another gpuq command requeued and restarted it),
        nothing changes and False is returned: news of an old attempt never ends a newer one.
        """
        with self.session() as s:
            if attempt is None:
                if not isinstance(new, JobState):
                    raise LedgerError(f"{new!r} is not a job state")
                job = s.get(Job, job_id)
                if job is None:
                    raise JobNotFound(f"no job {job_id!r}")
                if of_attempt is not None and job.attempt_count != of_attempt:
                    return False
                return self._transition_job(s, job, new, message, failure_class=failure_class)
            if not isinstance(new, AttemptState):
                raise LedgerError(f"{new!r} is not an attempt state")
            row = s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == attempt)).first()
            if row is None:
                raise JobNotFound(f"no attempt {attempt} of job {job_id!r}")
            return self._transition_attempt(s, row, new, message)

    def requeue(
        self,
        job_id: str,
        *,
        message: str,
        of_attempt: int | None = None,
        end_attempt: AttemptState | None = None,
        via: JobState | None = JobState.LOST,
        attempt_fields: Mapping[str, Any] | None = None,
        failure_class: str = "",
    ) -> bool:
        """Put a job whose attempt ended back in the queue, in ONE transaction: the attempt
        (``of_attempt``, else the job's current one) gets ``attempt_fields`` and, with ``end_attempt``,
        ends in that state; the job passes through ``via`` (LOST, or PREEMPTED for a chunk that
        continues; None: the job is already LOST or PREEMPTED) and goes QUEUED.  Every step appends its
        event with ``message``, as ``transition`` would; a step that is not allowed raises
        IllegalTransition and nothing changes.  ``of_attempt``: when the job has moved on to a later
        attempt meanwhile, the job is left alone and False is returned (news of an old attempt never
        requeues a newer one)."""
        attempt_fields = attempt_fields or {}
        if "state" in attempt_fields:
            raise LedgerError("requeue sets the attempt's state only through end_attempt")
        with self.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id!r}")
            if attempt_fields or end_attempt is not None:
                number = of_attempt if of_attempt is not None else job.attempt_count
                row = s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)).first()
                if row is None:
                    raise JobNotFound(f"no attempt {number} of job {job_id!r}")
                for key, value in attempt_fields.items():
                    setattr(row, key, value)
                if end_attempt is not None:
                    self._transition_attempt(s, row, end_attempt, message)
            if of_attempt is not None and job.attempt_count != of_attempt:
                return False
            if via is not None:
                self._transition_job(s, job, via, message, failure_class=failure_class)
            return self._transition_job(s, job, JobState.QUEUED, message, failure_class=failure_class)

    def restart_on_host(self, job_id: str, *, of_attempt: int, host: str, message: str, note: str,
                        failure_class: str = "") -> Attempt | None:
        """The host's agent retried attempt ``of_attempt`` itself (docs/checkpoints.md, "Who retries what"):
        in ONE transaction, the job goes back to the queue as ``requeue`` puts it (via LOST, ``message``)
        and attempt n+1 starts on ``host`` with attempt n's bundle, as ``start_attempt`` starts it, plus an
        event on the new attempt saying the host started it (``note``).  None when the job has moved on
        meanwhile (another command settled and restarted it); IllegalTransition (nothing changed) when it
        ended meanwhile (a cancel)."""
        with self.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id!r}")
            old = s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == of_attempt)).first()
            if old is None or job.attempt_count != of_attempt:
                return None
            if job.state != JobState.QUEUED.value:
                self._transition_job(s, job, JobState.LOST, message, failure_class=failure_class)
                self._transition_job(s, job, JobState.QUEUED, message, failure_class=failure_class)
            attempt = self._start(s, job, host=host, bundle_sha=old.bundle_sha)
            attempt.dispatched_at = old.dispatched_at or old.created_at  # the host started it from that dispatch
            add_event(s, "attempt", f"{job_id}/a{attempt.number}", "", "", note)
            return attempt

    @staticmethod
    def _transition_attempt(s: Session, row: Attempt, new: AttemptState, message: str) -> bool:
        old = AttemptState(row.state)
        if old == new:
            return False
        if not attempt_may(old, new):
            raise IllegalTransition("attempt", f"{row.job_id}/a{row.number}", old.value, new.value)
        row.state = new.value
        if new.terminal:  # gpuq records its end now: an end time, so its cost stops growing
            now = time.time()
            row.ended_at = now if row.ended_at is None else row.ended_at
            row.seen_ended_at = now if row.seen_ended_at is None else row.seen_ended_at
        add_event(s, "attempt", f"{row.job_id}/a{row.number}", old.value, new.value, message)
        return True

    @staticmethod
    def _transition_job(s: Session, job: Job, new: JobState, message: str, *, failure_class: str = "",
                        attempt: int | None = None) -> bool:
        old = JobState(job.state)
        if old == new:
            return False
        if not job_may(old, new):
            raise IllegalTransition("job", job.id, old.value, new.value)
        job.state = new.value
        job.updated_at = time.time()
        add_event(s, "job", job.id, old.value, new.value, message, failure_class=failure_class, attempt=attempt)
        if new.terminal:
            Ledger._end_current_attempt(s, job, new, message)
        return True

    @staticmethod
    def _end_current_attempt(s: Session, job: Job, new: JobState, message: str) -> None:
        """A job that ends ends its current attempt in the same transaction (an attempt always ends:
        docs/cost.md): one the host never reported ended becomes KILLED (cancelled), EXITED (succeeded)
        or LOST (failed), with an end time as every attempt that ends (``_transition_attempt``)."""
        row = s.exec(select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.attempt_count)).first()
        if row is None:
            return
        if not AttemptState(row.state).terminal:
            Ledger._transition_attempt(s, row, ENDS_AS[new], f"the job is {new.value}: {message}"[:500])


def _price(s: Session, gpus: int, *hosts: str, rows: Mapping[str, HostRow | None] | None = None) -> dict[str, Any]:
    """An attempt's share of its host's price, fixed when it starts (prices change; bills do not).
    ``rows``: the hosts' rows already read (one delivery prices a thousand attempts on one host)."""
    found = attempt_price(gpus, [rows[name] if rows is not None and name in rows else s.get(HostRow, name)
                                 for name in hosts])
    return {} if found is None else {"price_per_hour": found[0], "gpu_share": found[1]}


