"""The ledger's ``after=`` edges (``tables.Dependency``, v24): written with their sweep's jobs (``add_sweep``), read
by the tick's gate and hand-over and by the dry run (a mixin of ``store.Ledger``)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlmodel import col, select

from orchestrator.ledger.tables import Dependency, Job
from orchestrator.ledger.txn import IN_CHUNK, Sessions


class DependencyRecords(Sessions):
    """Who waits for whom: :class:`orchestrator.ledger.store.Ledger`'s dependency edges."""

    def dependencies(self, job_ids: Iterable[str]) -> dict[str, list[Dependency]]:
        """{job id: the edges it waits on} for the jobs of ``job_ids`` that wait on any (in insertion order)."""
        return self._edges(job_ids, by_needs=False)

    def dependents(self, job_ids: Iterable[str]) -> dict[str, list[Dependency]]:
        """{job id: the edges of the jobs that wait on it} for the jobs of ``job_ids`` that any job waits on."""
        return self._edges(job_ids, by_needs=True)

    def sweep_dependencies(self, sweep_id: str) -> list[Dependency]:
        """Every edge whose waiting job belongs to ``sweep_id``, in insertion order."""
        query = (select(Dependency).join(Job, col(Job.id) == col(Dependency.job_id))
                 .where(Job.sweep_id == sweep_id).order_by(col(Dependency.id)))
        with self.reading() as s:
            return list(s.exec(query))

    def jobs_by_ids(self, job_ids: Iterable[str]) -> list[Job]:
        """The jobs of ``job_ids`` that exist (any order)."""
        ids = list(dict.fromkeys(job_ids))
        out: list[Job] = []
        with self.reading() as s:
            for start in range(0, len(ids), IN_CHUNK):
                out += s.exec(select(Job).where(col(Job.id).in_(ids[start:start + IN_CHUNK])))
        return out

    def _edges(self, job_ids: Iterable[str], *, by_needs: bool) -> dict[str, list[Dependency]]:
        ids = list(dict.fromkeys(job_ids))
        column = col(Dependency.needs_id) if by_needs else col(Dependency.job_id)
        out: dict[str, list[Dependency]] = {}
        with self.reading() as s:
            for start in range(0, len(ids), IN_CHUNK):
                query = select(Dependency).where(column.in_(ids[start:start + IN_CHUNK])).order_by(col(Dependency.id))
                for row in s.exec(query):
                    out.setdefault(row.needs_id if by_needs else row.job_id, []).append(row)
        return out
