"""The ledger's record of ``gpuq pull`` outcomes (one row per outcome; the newest is a job's pull state)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlmodel import col, select

from orchestrator.core.errors import JobNotFound
from orchestrator.ledger.tables import Event, Job, Pull
from orchestrator.ledger.txn import Sessions


class PullRecords(Sessions):
    """Pull methods of :class:`orchestrator.ledger.store.Ledger` (which provides ``session`` and ``reading``)."""

    def record_pull(
        self,
        job_id: str,
        *,
        attempt: int,
        host: str,
        state: str,
        manifest_sha256: str = "",
        files: int = 0,
        total_bytes: int = 0,
        local_dir: str = "",
        reason: str = "",
    ) -> Pull:
        """Append one pull outcome of a job ("verified", "quarantined", "incomplete") and an event.

        Written only after the files it describes are in place, so a controller killed before this
        call leaves a state the next pull repairs, never a verified mark without a verified copy.
        """
        with self.session() as s:
            if s.get(Job, job_id) is None:
                raise JobNotFound(f"no job {job_id!r}")
            row = Pull(job_id=job_id, attempt=attempt, host=host, state=state, manifest_sha256=manifest_sha256,
                       files=files, bytes=total_bytes, local_dir=local_dir, reason=reason, created_at=time.time())
            s.add(row)
            detail = f"{files} files, {total_bytes} bytes, manifest {manifest_sha256[:12]}"
            s.add(Event(time=time.time(), kind="job", subject=job_id, old="", new=f"pull {state}",
                        message=f"{detail}; {reason}" if reason else detail))
            return row

    def pulls(self, job_ids: Iterable[str]) -> list[Pull]:
        """Every pull outcome of the given jobs, oldest first."""
        ids = list(job_ids)
        out: list[Pull] = []
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                out.extend(s.exec(select(Pull).where(col(Pull.job_id).in_(chunk))))
        return sorted(out, key=lambda p: (p.created_at, p.id or 0))

    def verified_pulls(self, job_ids: Iterable[str]) -> dict[str, Pull]:
        """{job_id: its newest pull} for the given jobs whose newest pull is "verified"."""
        newest: dict[str, Pull] = {}
        for row in self.pulls(job_ids):
            newest[row.job_id] = row
        return {job_id: row for job_id, row in newest.items() if row.state == "verified"}

    def verified_jobs(self, sweep_id: str) -> dict[str, Pull]:
        """The sweep's jobs whose results are verified locally (for teardown gates and `gpuq results`)."""
        with self.reading() as s:
            ids = list(s.exec(select(Job.id).where(Job.sweep_id == sweep_id)))
        return self.verified_pulls(ids)

    def verified_job_ids(self) -> set[str]:
        """Every job whose newest pull is verified (a host holding none of their only copies may go)."""
        with self.reading() as s:
            rows = list(s.exec(select(Pull).order_by(col(Pull.created_at), col(Pull.id))))
        newest: dict[str, str] = {}
        for row in rows:
            newest[row.job_id] = row.state
        return {job_id for job_id, state in newest.items() if state == "verified"}
