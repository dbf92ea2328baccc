"""A sweep's parts: ``submit --into`` adds jobs to a sweep as its next part, in one transaction, and the reads of
every sweep's parts (a mixin of ``store.Ledger``; docs/queue.md, "Growing a sweep")."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from sqlalchemy import func
from sqlmodel import col, select

from orchestrator.core.errors import LedgerError
from orchestrator.core.specs import JobSpec
from orchestrator.ledger.events import add_event
from orchestrator.ledger.sweep_records import insert_jobs
from orchestrator.ledger.tables import Job, Sweep, SweepPart
from orchestrator.ledger.txn import Sessions


class SweepParts(Sessions):
    """The parts of sweeps of :class:`orchestrator.ledger.store.Ledger`: a join recorded, every sweep's parts read."""

    def join_sweep(self, *, sweep_id: str, queue_path: str, queue_text: str, bundle_sha: str,
                   jobs: Sequence[JobSpec], default_retries: int, keys: Mapping[str, str],
                   reuse: Mapping[str, str]) -> tuple[SweepPart | None, list[Job]]:
        """Add ``jobs`` to sweep ``sweep_id`` as its next part (QUEUED; those in ``reuse`` SUCCEEDED, reused), the
        part's record and the sweep's event in one transaction (the write lock held from its first read).

        A job whose name the sweep already has (a concurrent join added it) is left out: every name is in a sweep
        once.  Returns (the part, the rows inserted); (None, []) when nothing was left to add: no part is recorded.
        Raises LedgerError for an unknown sweep."""
        now = time.time()
        with self.session() as s:
            sweep = s.get(Sweep, sweep_id)
            if sweep is None:
                raise LedgerError(f"no sweep {sweep_id!r}")
            taken = {name.casefold() for name in s.exec(select(Job.name).where(Job.sweep_id == sweep_id))}
            fresh = [spec for spec in jobs if spec.name.casefold() not in taken]
            if not fresh:
                return None, []
            last = s.exec(select(func.max(SweepPart.number)).where(SweepPart.sweep_id == sweep_id)).one()
            number = int(last or 1) + 1
            part = SweepPart(sweep_id=sweep_id, number=number, queue_path=queue_path, queue_text=queue_text,
                             bundle_sha=bundle_sha, job_count=len(fresh), created_at=now)
            s.add(part)
            sweep.job_count += len(fresh)
            s.add(sweep)
            rows = insert_jobs(s, sweep_id, fresh, default_retries, now, keys=keys, reuse=reuse, part=number)
            add_event(s, "sweep", sweep_id, "", "joined", f"part {number}: {len(fresh)} jobs from {queue_path}")
        return part, rows

    def sweep_parts(self) -> list[SweepPart]:
        """Every sweep's parts, by sweep then number."""
        with self.reading() as s:
            return list(s.exec(select(SweepPart).order_by(col(SweepPart.sweep_id), col(SweepPart.number))))

    def parts_of(self, sweep_id: str) -> list[SweepPart]:
        """One sweep's parts, by number."""
        with self.reading() as s:
            return list(s.exec(select(SweepPart).where(SweepPart.sweep_id == sweep_id)
                               .order_by(col(SweepPart.number))))

    def part_bundles(self, sweep_id: str) -> dict[int, str]:
        """{part number: the bundle its jobs run with} of one sweep."""
        return {p.number: p.bundle_sha for p in self.parts_of(sweep_id)}

