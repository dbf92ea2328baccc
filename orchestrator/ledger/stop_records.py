"""The ledger's record of early stopping (docs/stopping.md): each look of a sweep's policy at a cell and
rung (``stop_look``, written before anything is stopped), and the running jobs' learning curves so far,
which the looks read (``status --curves-for``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import delete, func, insert
from sqlmodel import Session, col, select

from orchestrator.ledger.tables import Metric, StopLook
from orchestrator.ledger.txn import IN_CHUNK, Sessions


class StopRecords(Sessions):
    """Stopping methods of :class:`orchestrator.ledger.store.Ledger` (which provides ``session`` and ``reading``)."""

    def record_looks(self, looks: Sequence[StopLook]) -> int:
        """Append the looks in one transaction; a (sweep, cell, rung) already looked at keeps its first
        look (another gpuq command's tick made it: a cell is looked at once per rung).  Returns how many
        were new."""
        if not looks:
            return 0
        rows = [look.model_dump(exclude={"id"}) for look in looks]
        sweeps = sorted({look.sweep_id for look in looks})

        def count(s: Session) -> int:
            return int(s.exec(select(func.count()).select_from(StopLook)
                              .where(col(StopLook.sweep_id).in_(sweeps))).one())

        with self.session() as s:
            before = count(s)
            s.execute(insert(StopLook).prefix_with("OR IGNORE"), rows)
            return count(s) - before

    def stop_looks(self, sweep_ids: Iterable[str]) -> list[StopLook]:
        """The sweeps' looks, oldest first."""
        ids = sorted(set(sweep_ids))
        out: list[StopLook] = []
        with self.reading() as s:
            for start in range(0, len(ids), IN_CHUNK):
                out += s.exec(select(StopLook).where(col(StopLook.sweep_id).in_(ids[start:start + IN_CHUNK]))
                              .order_by(col(StopLook.id))).all()
        return out

    def record_curves(self, job_id: str, attempt: int, curves: Mapping[str, Sequence[tuple[float, float]]]) -> None:
        """A running job's learning curves so far, in place of those recorded before (its final and best
        rows come when it ends: ``record_results`` replaces them all); non-finite points are left out."""
        rows = [{"job_id": job_id, "attempt": attempt, "scope": "curve", "name": name, "value": value,
                 "step": int(step), "epoch": None}
                for name, points in curves.items() for step, value in points
                if math.isfinite(value) and math.isfinite(step)]
        with self.session() as s:
            s.execute(delete(Metric).where(col(Metric.job_id) == job_id, col(Metric.scope) == "curve"))
            if rows:
                s.execute(insert(Metric), rows)
