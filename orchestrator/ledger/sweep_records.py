"""The ledger's sweeps and their jobs: a sweep inserted with all its jobs in one transaction, and the
reads that find them by id, prefix or name (a mixin of ``store.Ledger``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import func
from sqlmodel import Session, col, select

from orchestrator.core.errors import JobNotFound, LedgerError
from orchestrator.core.specs import DependencyEdge, JobSpec, job_id_for, spec_hash_for
from orchestrator.core.states import JobState
from orchestrator.ledger import refs
from orchestrator.ledger.events import add_event
from orchestrator.ledger.refs import JobRef
from orchestrator.ledger.tables import Dependency, Event, Job, Sweep, SweepPart

if TYPE_CHECKING:
    pass
from orchestrator.ledger.txn import Sessions


class SweepRecords(Sessions):
    """Sweeps and their jobs of :class:`orchestrator.ledger.store.Ledger`: insert, read and find them."""

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
        stop: str = "",
        keys: Mapping[str, str] | None = None,
        reuse: Mapping[str, str] | None = None,
        edges: Sequence[DependencyEdge] = (),
    ) -> list[Job]:
        """Insert a sweep and all its jobs (QUEUED) in one transaction.

        ``hosts``: the hosts the user restricted the sweep to (empty: any registered host).
        ``git``: the project's commit and whether it had uncommitted changes (("", None): unknown).
        ``budget_usd``: the sweep's spending cap (None: none; orchestrator/money/budget.py).
        ``stop``: the sweep's stopping policy as JSON ("": off; orchestrator/stopping/policy.py).
        ``keys``: {job name: content key} (the result cache); ``reuse``: {job name: the SUCCEEDED job whose
        verified results it reuses}: those rows are inserted SUCCEEDED with ``reused_from`` and never run.
        ``edges``: the queue's ``after=`` edges between its jobs (by name), inserted as ``Dependency`` rows.
        """
        now = time.time()
        with self.session() as s:
            if s.get(Sweep, sweep_id) is not None:
                raise LedgerError(f"sweep {sweep_id} already exists")
            s.add(Sweep(id=sweep_id, queue_path=queue_path, workdir=workdir, queue_text=queue_text,
                        bundle_sha=bundle_sha, hosts=",".join(hosts), entry=entry, launcher=launcher,
                        verify=",".join(verify), run=run, git_commit=git[0], git_dirty=git[1],
                        budget_usd=budget_usd, stop=stop, job_count=len(jobs), created_at=now))
            s.flush()
            s.add(SweepPart(sweep_id=sweep_id, number=1, queue_path=queue_path, queue_text=queue_text,
                            bundle_sha=bundle_sha, job_count=len(jobs), created_at=now))
            rows = insert_jobs(s, sweep_id, jobs, default_retries, now, keys=keys or {}, reuse=reuse or {}, part=1)
            s.flush()
            for edge in edges:
                s.add(Dependency(job_id=job_id_for(sweep_id, edge.job), needs_id=job_id_for(sweep_id, edge.needs),
                                 via=edge.via, created_at=now))
            add_event(s, "sweep", sweep_id, "", "submitted", f"{len(jobs)} jobs from {queue_path}")
        return rows

    def add_seeds(self, sweep_id: str, jobs: Sequence[JobSpec], default_retries: int,
                  why: Mapping[str, str]) -> list[Job]:
        """Seeds ``seeds=auto`` adds to a sweep (tick/autoseeds.py): QUEUED rows with one event each (``why``:
        {job name: the verdict that called for it}), in one transaction.  The row is the decision's record;
        a job id the sweep already has is skipped, so a tick that decides again after a crash adds it once
        (ids derive from the sweep and the seed's name, ``job_id_for``)."""
        now = time.time()
        rows: list[Job] = []
        with self.session() as s:
            sweep = s.get(Sweep, sweep_id)
            if sweep is None:
                raise LedgerError(f"no sweep {sweep_id!r}")
            for spec in jobs:
                row = job_row(sweep_id, spec, default_retries, now)
                if s.get(Job, row.id) is not None:
                    continue
                s.add(row)
                rows.append(row)
            sweep.job_count += len(rows)
            s.flush()
            for row in rows:
                add_event(s, "job", row.id, "", JobState.QUEUED.value, f"seeds=auto added {row.name}: {why[row.name]}")
        return rows

    def auto_seed_sweeps(self) -> list[str]:
        """The sweeps with a ``seeds=auto`` line (a job whose ``seeds_max`` is set), oldest first."""
        with self.reading() as s:
            found = s.exec(select(Job.sweep_id, func.min(Job.created_at)).where(Job.seeds_max > 0)
                           .group_by(Job.sweep_id))
            return [sweep_id for sweep_id, _ in sorted(found, key=lambda r: (r[1], r[0]))]

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

    def reusable(self, keys: Iterable[str]) -> dict[str, Job]:
        """{content key: the SUCCEEDED job that ran it and whose newest pull is verified} for the given keys
        (a reused job is never the one pointed at: the job that ran is)."""
        wanted = [k for k in set(keys) if k]
        with self.reading() as s:
            rows = list(s.exec(select(Job).where(col(Job.content_key).in_(wanted), Job.reused_from == "",
                                                 Job.state == JobState.SUCCEEDED.value)
                               .order_by(col(Job.created_at))))
        verified = self.verified_pulls([row.id for row in rows])  # type: ignore[attr-defined]
        return {row.content_key: row for row in rows if row.id in verified}

    def state_counts(self) -> dict[str, dict[str, int]]:
        """{sweep_id: {state: count}} in one query."""
        with self.reading() as s:
            rows = s.exec(select(Job.sweep_id, Job.state, func.count()).group_by(Job.sweep_id, Job.state))
            out: dict[str, dict[str, int]] = {}
            for sweep_id, state, count in rows:
                out.setdefault(sweep_id, {})[state] = int(count)
            return out

    def jobs_on(self, hosts: Iterable[str]) -> list[Job]:
        """Every job whose current or last host is one of ``hosts``."""
        names = sorted(set(hosts))
        with self.reading() as s:
            return list(s.exec(select(Job).where(col(Job.host).in_(names))
                               .order_by(col(Job.created_at), col(Job.line))))

    # --- budgets, retries, history -------------------------------------------------

    def capped_sweeps(self) -> list[Sweep]:
        """The sweeps with a spending cap (``Sweep.budget_usd``), oldest first."""
        with self.reading() as s:
            return list(s.exec(select(Sweep).where(col(Sweep.budget_usd).is_not(None))
                               .order_by(col(Sweep.created_at))))


def insert_jobs(s: Session, sweep_id: str, jobs: Sequence[JobSpec], default_retries: int, now: float, *,
                keys: Mapping[str, str], reuse: Mapping[str, str], part: int) -> list[Job]:
    """Insert the QUEUED rows of ``jobs`` (part ``part`` of the sweep), the ones in ``reuse`` SUCCEEDED pointing at
    the job whose verified results they reuse, each with its event; in the caller's transaction."""
    rows: list[Job] = []
    for spec in jobs:
        row = job_row(sweep_id, spec, default_retries, now)
        row.content_key, row.part = keys.get(spec.name, ""), part
        twin = reuse.get(spec.name, "")
        if twin:
            row.state, row.reused_from = JobState.SUCCEEDED.value, twin
        s.add(row)
        rows.append(row)
    for row in rows:
        if row.reused_from:
            add_event(s, "job", row.id, "", JobState.SUCCEEDED.value,
                      f"reused the verified results of {row.reused_from}; not run")
    return rows


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
        seeds_max=spec.seeds_max,
        state=JobState.QUEUED.value,
        created_at=now,
        updated_at=now,
    )
