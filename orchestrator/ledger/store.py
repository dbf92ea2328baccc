"""The Ledger: every read and write of gpuq's SQLite state goes through here.  Hosts, sweeps, jobs,
attempts and their states live in this module; the events and findings (``events.py``), what finished
jobs left (``results.py``) and the pull outcomes (``pulls.py``) are its mixins, in their own modules.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func
from sqlalchemy import select as columns  # more columns than sqlmodel's select types
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from orchestrator.core.errors import IllegalTransition, JobNotFound, LedgerError
from orchestrator.core.specs import JobSpec, job_id_for, spec_hash_for
from orchestrator.core.states import AttemptState, JobState, attempt_may, job_may
from orchestrator.ledger import refs
from orchestrator.ledger.events import EventRecords, add_event
from orchestrator.ledger.leases import LeaseRecords, check_new_lease, write_fields
from orchestrator.ledger.migrate import migrate
from orchestrator.ledger.pricing import PricedAttempt, attempt_price
from orchestrator.ledger.pulls import PullRecords
from orchestrator.ledger.redaction import LedgerRedaction
from orchestrator.ledger.refs import JobRef
from orchestrator.ledger.results import ResultRecords
from orchestrator.ledger.tables import Attempt, Event, HostFields, HostRow, Job, Sweep
from orchestrator.ledger.txn import BUSY_TIMEOUT_MS, IN_CHUNK, ledger_engine, transaction

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _create_private(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)

SETUP_PHASE = "project_setup"  # orchestrator/health/setup_holds.py: never counts against retries=


class Ledger(EventRecords, ResultRecords, PullRecords, LeaseRecords):
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

    # --- sweeps and jobs -----------------------------------------------------------

    def add_sweep(
        self,
        *,
        sweep_id: str,
        queue_path: str,
        workdir: str,
        queue_text: str,
        jobs: Sequence[JobSpec],
        default_retries: int,
        bundle_sha: str = "",
        hosts: Sequence[str] = (),
        entry: str = "",
        launcher: str = "torchrun",
        verify: Sequence[str] = ("metrics", "best_ckpt"),
        run: str = "",
        git: tuple[str, bool | None] = ("", None),
        budget_usd: float | None = None,
    ) -> list[Job]:
        """Insert a sweep and all its jobs (QUEUED) in one transaction.

        ``hosts``: the hosts the user restricted the sweep to (empty: any registered host).
        ``git``: the project's commit and whether it had uncommitted changes (("", None): unknown).
        ``budget_usd``: the sweep's spending cap (None: none; orchestrator/money/budget.py).
        """
        now = time.time()
        rows: list[Job] = []
        with self.session() as s:
            if s.get(Sweep, sweep_id) is not None:
                raise LedgerError(f"sweep {sweep_id} already exists")
            s.add(Sweep(id=sweep_id, queue_path=queue_path, workdir=workdir, queue_text=queue_text,
                        bundle_sha=bundle_sha, hosts=",".join(hosts), entry=entry, launcher=launcher,
                        verify=",".join(verify), run=run, git_commit=git[0], git_dirty=git[1],
                        budget_usd=budget_usd, job_count=len(jobs), created_at=now))
            s.flush()
            for spec in jobs:
                row = job_row(sweep_id, spec, default_retries, now)
                s.add(row)
                rows.append(row)
            add_event(s, "sweep", sweep_id, "", "submitted", f"{len(jobs)} jobs from {queue_path}")
        return rows

    def sweep_ids(self) -> set[str]:
        with self.reading() as s:
            return set(s.exec(select(Sweep.id)))

    def sweep(self, sweep_id: str) -> Sweep | None:
        with self.reading() as s:
            return s.get(Sweep, sweep_id)

    def set_sweep_hosts(self, sweep_id: str, hosts: Iterable[str]) -> None:
        with self.session() as s:
            row = s.get(Sweep, sweep_id)
            if row is None:
                raise LedgerError(f"no sweep {sweep_id!r}")
            row.hosts = ",".join(sorted(set(hosts)))
            add_event(s, "sweep", sweep_id, "", "", f"may use hosts {row.hosts}")

    def set_sweep_budget(self, sweep_id: str, usd: float | None, *, severity: str, rule: str, message: str) -> None:
        """Set (None: remove) a sweep's spending cap, and the finding that says so, in one transaction."""
        with self.session() as s:
            row = s.get(Sweep, sweep_id)
            if row is None:
                raise LedgerError(f"no sweep {sweep_id!r}")
            row.budget_usd = usd
            s.add(Event(time=time.time(), kind="sweep", subject=sweep_id, message=message, severity=severity,
                        rule=rule))

    def sweeps(self) -> list[Sweep]:
        with self.reading() as s:
            return list(s.exec(select(Sweep).order_by(col(Sweep.created_at))))

    def resolve_sweep(self, ref: str | None) -> Sweep:
        """A sweep id or unique prefix; None means the newest sweep."""
        with self.reading() as s:
            if ref is None:
                newest = s.exec(select(Sweep).order_by(col(Sweep.created_at).desc())).first()
                if newest is None:
                    raise JobNotFound("no sweeps yet; submit one with `gpuq submit QUEUE`")
                return newest
            found = list(s.exec(select(Sweep).where(col(Sweep.id).startswith(ref, autoescape=True))))
        if len(found) == 1:
            return found[0]
        if not found:
            raise JobNotFound(f"no sweep matches {ref!r}; `gpuq status` lists the sweeps")
        raise JobNotFound(f"sweep prefix {ref!r} is ambiguous: {', '.join(sorted(x.id for x in found))}")

    def job(self, job_id: str) -> Job:
        with self.reading() as s:
            row = s.get(Job, job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return row

    def resolve_job(self, ref: str) -> Job:
        """The job ``ref`` names: id, prefix >= 4, SWEEP:NAME or a bare name (``ledger/refs.py``)."""
        return self.resolve_job_ref(ref).job

    def resolve_job_ref(self, ref: str) -> JobRef:
        """Like ``resolve_job``, with a note saying which sweep a bare name picked when several have it."""
        with self.reading() as s:
            return refs.resolve_job(s, ref)

    def jobs(self, *, sweep_id: str | None = None, states: Iterable[JobState] | None = None) -> list[Job]:
        with self.reading() as s:
            query = select(Job)
            if sweep_id is not None:
                query = query.where(Job.sweep_id == sweep_id)
            if states is not None:
                query = query.where(col(Job.state).in_([st.value for st in states]))
            return list(s.exec(query.order_by(col(Job.created_at), col(Job.line))))

    def succeeded_with(self, spec_hashes: Iterable[str]) -> dict[str, Job]:
        """{spec_hash: a SUCCEEDED job with that identity} for the given hashes."""
        hashes = list(spec_hashes)
        with self.reading() as s:
            rows = s.exec(select(Job).where(col(Job.spec_hash).in_(hashes), Job.state == JobState.SUCCEEDED.value))
            return {row.spec_hash: row for row in rows}

    def state_counts(self) -> dict[str, dict[str, int]]:
        """{sweep_id: {state: count}} in one query."""
        with self.reading() as s:
            rows = s.exec(select(Job.sweep_id, Job.state, func.count()).group_by(Job.sweep_id, Job.state))
            out: dict[str, dict[str, int]] = {}
            for sweep_id, state, count in rows:
                out.setdefault(sweep_id, {})[state] = int(count)
            return out

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

    def attempt(self, job_id: str, number: int) -> Attempt | None:
        with self.reading() as s:
            return s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)).first()

    def attempts(self, job_id: str | None = None) -> list[Attempt]:
        with self.reading() as s:
            query = select(Attempt)
            if job_id is not None:
                query = query.where(Attempt.job_id == job_id)
            return list(s.exec(query.order_by(col(Attempt.job_id), col(Attempt.number))))

    def attempts_of(self, job_ids: Iterable[str]) -> list[Attempt]:
        """Every attempt of the given jobs, by job then number."""
        ids = sorted(set(job_ids))
        out: list[Attempt] = []
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                rows = s.exec(select(Attempt).where(col(Attempt.job_id).in_(ids[start:start + 500]))
                              .order_by(col(Attempt.job_id), col(Attempt.number)))
                out.extend(rows)
        return out

    def priced_attempts(self, sweep_ids: Iterable[str]) -> dict[str, list[PricedAttempt]]:
        """{sweep: its attempts that fixed a price} (what a budget counts), by job then number: the columns
        the money is reckoned from, not whole rows (a history of ten thousand priced attempts reads fast)."""
        ids = sorted(set(sweep_ids))
        out: dict[str, list[PricedAttempt]] = {}
        with self.reading() as s:
            for start in range(0, len(ids), IN_CHUNK):
                query = (columns(col(Job.sweep_id), col(Attempt.job_id), col(Attempt.state), col(Attempt.started_at),
                                 col(Attempt.ended_at), col(Attempt.price_per_hour), col(Attempt.gpu_share))
                         .join(Attempt, col(Attempt.job_id) == col(Job.id))
                         .where(col(Job.sweep_id).in_(ids[start:start + IN_CHUNK]),
                                col(Attempt.price_per_hour).is_not(None))
                         .order_by(col(Attempt.job_id), col(Attempt.number)))
                for sweep_id, job_id, state, started, ended, price, share in s.connection().execute(query):
                    out.setdefault(sweep_id, []).append(PricedAttempt(job_id, state, started, ended, price, share))
        return out

    def attempts_on(self, hosts: Iterable[str]) -> list[Attempt]:
        """Every attempt whose (rank-0) host is one of ``hosts``, by job then number (tick/billing.py)."""
        names = sorted(set(hosts))
        with self.reading() as s:
            return list(s.exec(select(Attempt).where(col(Attempt.host).in_(names))
                               .order_by(col(Attempt.job_id), col(Attempt.number))))

    def jobs_on(self, hosts: Iterable[str]) -> list[Job]:
        """Every job whose current or last host is one of ``hosts``."""
        names = sorted(set(hosts))
        with self.reading() as s:
            return list(s.exec(select(Job).where(col(Job.host).in_(names))
                               .order_by(col(Job.created_at), col(Job.line))))

    def newest_provenance(self, host: str) -> Attempt | None:
        """The newest attempt on ``host`` whose host said what it ran with (``Attempt.provenance``)."""
        with self.reading() as s:
            return s.exec(select(Attempt).where(Attempt.host == host, Attempt.provenance != "")
                          .order_by(col(Attempt.created_at).desc(), col(Attempt.id).desc()).limit(1)).first()

    def latest_attempts(self, job_ids: Iterable[str]) -> dict[str, Attempt]:
        """The newest attempt of each given job."""
        ids = list(job_ids)
        out: dict[str, Attempt] = {}
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                rows = s.exec(select(Attempt).where(col(Attempt.job_id).in_(chunk)).order_by(col(Attempt.number)))
                for row in rows:
                    out[row.job_id] = row
        return out

    def update_attempt(self, job_id: str, number: int, **fields: Any) -> None:
        """Progress fields only (step, loss, heartbeat...); never the state."""
        if "state" in fields:
            raise LedgerError("update_attempt cannot change a state; use Ledger.transition")
        with self.session() as s:
            row = s.exec(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)).one()
            for key, value in fields.items():
                setattr(row, key, value)

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
        return True

    # --- budgets, retries, history -------------------------------------------------

    def capped_sweeps(self) -> list[Sweep]:
        """The sweeps with a spending cap (``Sweep.budget_usd``), oldest first."""
        with self.reading() as s:
            return list(s.exec(select(Sweep).where(col(Sweep.budget_usd).is_not(None))
                               .order_by(col(Sweep.created_at))))

    def failed_attempts(self, job_id: str) -> int:
        """Attempts of the job that ended badly and count against ``retries=`` (LOST, or EXITED
        non-zero); stolen (KILLED) and preempted attempts, and a project setup that failed on a host
        (phase ``project_setup``: the host is held, the job waits for another) do not."""
        with self.reading() as s:
            rows = s.exec(select(Attempt).where(Attempt.job_id == job_id))
            return sum(1 for a in rows if a.phase != SETUP_PHASE and (
                a.state == AttemptState.LOST.value
                or (a.state == AttemptState.EXITED.value and a.exit_code not in (None, 0))))

    def run_history(self) -> list[tuple[str, str, int, float]]:
        """(config, task, epochs, seconds) of each SUCCEEDED job's successful attempt, oldest first.

        For ``estimates.estimate_s``.  Only attempts that exited 0 with both
        ``started_at`` and ``ended_at`` known count, and only those that ran
        from scratch: a resumed attempt trained part of the epochs.
        """
        seconds = (col(Attempt.ended_at) - col(Attempt.started_at)).label("seconds")
        query = (
            select(Job.config, Job.task, Job.epochs, seconds)
            .join(Attempt, col(Attempt.job_id) == col(Job.id))
            .where(
                Job.state == JobState.SUCCEEDED.value,
                Attempt.state == AttemptState.EXITED.value,
                Attempt.exit_code == 0,  # protocol.EXIT_OK
                Attempt.resume_from == "",
                col(Attempt.started_at).is_not(None),
                col(Attempt.ended_at).is_not(None),
                col(Attempt.ended_at) > col(Attempt.started_at),
            )
            .order_by(col(Attempt.created_at), col(Attempt.id))
        )
        with self.reading() as s:
            return [(config, task, epochs, secs) for config, task, epochs, secs in s.exec(query) if secs is not None]



def _price(s: Session, gpus: int, *hosts: str, rows: Mapping[str, HostRow | None] | None = None) -> dict[str, Any]:
    """An attempt's share of its host's price, fixed when it starts (prices change; bills do not).
    ``rows``: the hosts' rows already read (one delivery prices a thousand attempts on one host)."""
    found = attempt_price(gpus, [rows[name] if rows is not None and name in rows else s.get(HostRow, name)
                                 for name in hosts])
    return {} if found is None else {"price_per_hour": found[0], "gpu_share": found[1]}


def job_row(sweep_id: str, spec: JobSpec, default_retries: int, now: float) -> Job:
    """The QUEUED row of one expanded queue line of sweep ``sweep_id``."""
    return Job(
        id=job_id_for(sweep_id, spec.name),
        sweep_id=sweep_id,
        name=spec.name,
        line=spec.line,
        raw=spec.raw,
        config=spec.config,
        config_sha256=spec.config_sha256,
        task=spec.task,
        epochs=spec.epochs or 0,  # 0: not given (specs.known_epochs)
        gpus=spec.gpus,
        nodes=spec.nodes,
        est_min=spec.est_min,
        seed=spec.seed,
        host_pin=spec.host,
        retries=default_retries if spec.retries is None else spec.retries,
        spec_hash=spec_hash_for(spec),
        args=json.dumps(list(spec.args)),
        cell=spec.cell or spec.name,
        gpu="|".join(spec.gpu),
        gpu_mem=spec.gpu_mem,
        state=JobState.QUEUED.value,
        created_at=now,
        updated_at=now,
    )
