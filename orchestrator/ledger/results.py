"""The ledger's record of what finished jobs left: their final, best and curve metrics, the artifacts
verified on their hosts, and the checkpoints the hosts reported (with the controller's durable copy)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, insert
from sqlmodel import Session, col, select

from orchestrator.core import protocol
from orchestrator.core.errors import LedgerError
from orchestrator.ledger.tables import Artifact, Checkpoint, Job, Metric
from orchestrator.ledger.txn import Sessions

if TYPE_CHECKING:  # the host documents' models load only where a host is read
    from orchestrator.host_documents import ResultCheckpoint


class ResultRecords(Sessions):
    """Result methods of :class:`orchestrator.ledger.store.Ledger` (which provides ``session`` and ``reading``)."""

    def record_results(
        self,
        job_id: str,
        attempt: int,
        *,
        metrics: Sequence[tuple[str, str, float, int | None, int | None]],
        artifacts: Sequence[tuple[str, int, str]],
        checkpoint: ResultCheckpoint | None = None,
    ) -> None:
        """Replace the job's metrics/artifacts with those of ``attempt`` (scope, name, value, step, epoch).
        Artifacts that hold ``attempt``'s end record (its ``attempts/<n>/outputs.json`` row) are kept as
        they are: what the attempt left as it ended is recorded once, never replaced by a later collect.

        A non-finite value (NaN, an infinity) is refused whole (LedgerError, nothing changed): host
        documents are checked at the edge, and this is the last line before SQLite."""
        bad = next(((scope, name, value) for scope, name, value, _, _ in metrics if not math.isfinite(value)), None)
        if bad is not None:
            raise LedgerError(f"job {job_id}: metric {bad[1]!r} ({bad[0]}) is {bad[2]!r}, not a finite number; "
                              "its results were not recorded")
        now = time.time()
        with self.session() as s:
            # set-based: a job's learning curves are hundreds of rows (ORM objects cost ~100x more)
            s.execute(delete(Metric).where(col(Metric.job_id) == job_id))
            old_artifacts = list(s.exec(select(Artifact).where(Artifact.job_id == job_id)))
            ended = protocol.end_record_path(attempt)
            if any(a.attempt == attempt and a.path == ended for a in old_artifacts):
                artifacts = ()
            else:
                for old_artifact in old_artifacts:
                    s.delete(old_artifact)
            rows = [{"job_id": job_id, "attempt": attempt, "scope": scope, "name": name, "value": value,
                     "step": step, "epoch": epoch} for scope, name, value, step, epoch in metrics
                    if math.isfinite(value)]  # checked at the edge too: a NaN is no value SQLite keeps
            if rows:
                s.execute(insert(Metric), rows)
            if artifacts:  # an end record lists up to protocol.OUTPUTS_MAX_FILES files: set-based too
                s.execute(insert(Artifact), [{"job_id": job_id, "attempt": attempt, "path": path, "bytes": size,
                                              "sha256": sha, "verified_at": now} for path, size, sha in artifacts])
            if checkpoint is not None:
                self._add_checkpoint(s, job_id, attempt, checkpoint)

    def record_checkpoint(self, job_id: str, attempt: int, pointer: ResultCheckpoint) -> None:
        """A checkpoint the host reported (checked at the edge, host_documents); one without a sha256
        names nothing to pin and is not recorded."""
        with self.session() as s:
            self._add_checkpoint(s, job_id, attempt, pointer)

    @staticmethod
    def _add_checkpoint(s: Session, job_id: str, attempt: int, pointer: ResultCheckpoint) -> None:
        sha = pointer.sha256
        if not sha:
            return
        seen = s.exec(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.sha256 == sha)).first()
        if seen is not None:
            return
        s.add(
            Checkpoint(
                job_id=job_id,
                attempt=attempt,
                file=pointer.file,
                step=pointer.step,
                epoch=pointer.epoch,
                sha256=sha,
                bytes=pointer.bytes,
                written_at=pointer.written(),
            )
        )

    def metrics(self, job_ids: Iterable[str], scopes: Sequence[str] = ("final", "best")) -> list[Metric]:
        """The jobs' final and best metrics (``scopes=("curve",)``: the learning curves' points)."""
        ids = list(job_ids)
        with self.reading() as s:
            return list(s.exec(select(Metric).where(col(Metric.job_id).in_(ids), col(Metric.scope).in_(scopes))
                               .order_by(col(Metric.id))))

    def metric_values(self, job_ids: Iterable[str], scopes: Sequence[str] = ("final", "best"),
                      names: Sequence[str] | None = None) -> list[tuple[str, str, str, float, int | None]]:
        """``metrics(job_ids, scopes)`` as plain (job id, scope, name, value, step) rows, of the metrics
        ``names`` only when given; each job's rows in the order ``metrics`` gives them."""
        def marks(n: int) -> str:
            return ", ".join("?" * n)

        ids = sorted(set(job_ids))
        out: list[tuple[str, str, str, float, int | None]] = []
        also = f" AND name IN ({marks(len(names))})" if names is not None else ""
        with self.reading() as s:
            raw = s.connection().exec_driver_sql
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                sql = (f"SELECT job_id, scope, name, value, step FROM metric WHERE job_id IN ({marks(len(chunk))})"
                       f" AND scope IN ({marks(len(scopes))}){also} ORDER BY id")
                out += [(job, scope, name, value, step) for job, scope, name, value, step
                        in raw(sql, (*chunk, *scopes, *(names or ())))]
        return out

    def with_metrics(self, job_ids: Iterable[str]) -> set[str]:
        """Those of the given jobs the ledger has final or best metrics of."""
        ids = sorted(set(job_ids))
        found: set[str] = set()
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                found.update(s.exec(select(Metric.job_id).distinct().where(
                    col(Metric.job_id).in_(ids[start:start + 500]), col(Metric.scope).in_(("final", "best")))))
        return found

    def curves(self, job_ids: Iterable[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
        """Job id -> metric name -> [(step, value)] in step order: what ``gpuq report`` draws."""
        out: dict[str, dict[str, list[tuple[int, float]]]] = {}
        ids = list(job_ids)
        with self.reading() as s:  # plain rows, not ORM objects: a report may read a million points
            rows = s.exec(select(Metric.job_id, Metric.name, Metric.step, Metric.value)
                          .where(col(Metric.job_id).in_(ids), Metric.scope == "curve").order_by(col(Metric.id))).all()
        for job_id, name, step, value in rows:
            out.setdefault(job_id, {}).setdefault(name, []).append((step or 0, value))
        for by_name in out.values():
            for points in by_name.values():
                points.sort(key=lambda p: p[0])  # stable: points of one step stay in the order the host sent them
        return out

    def artifacts(self, job_id: str) -> list[Artifact]:
        with self.reading() as s:
            return list(s.exec(select(Artifact).where(Artifact.job_id == job_id).order_by(col(Artifact.path))))

    def mark_checkpoint_durable(self, job_id: str, sha256: str, path: str, host: str) -> None:
        """The controller holds a verified copy of this checkpoint at ``path``."""
        with self.session() as s:
            row = s.exec(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.sha256 == sha256)).first()
            if row is not None:
                row.durable_path = path
                row.host = host
            for other in s.exec(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.sha256 != sha256,
                                                         Checkpoint.durable_path != "")):
                other.durable_path = ""  # one copy per job is kept: the newest

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        with self.reading() as s:
            return list(s.exec(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(col(Checkpoint.step))))

    def checkpoints_of(self, job_ids: Iterable[str]) -> dict[str, list[Checkpoint]]:
        """``checkpoints(job)`` of each of the given jobs, in a few reads; a job without any is left out."""
        ids = sorted(set(job_ids))
        out: dict[str, list[Checkpoint]] = {}
        with self.reading() as s:
            for start in range(0, len(ids), 500):
                for row in s.exec(select(Checkpoint).where(col(Checkpoint.job_id).in_(ids[start:start + 500]))
                                  .order_by(col(Checkpoint.job_id), col(Checkpoint.step))):
                    out.setdefault(row.job_id, []).append(row)
        return out

    def checkpoint_bytes_by_config(self) -> dict[str, int]:
        """Largest checkpoint ever recorded per config path (disk budgets of the scheduler)."""
        with self.reading() as s:
            rows = s.exec(
                select(Job.config, func.max(Checkpoint.bytes)).join(Checkpoint, col(Checkpoint.job_id) == Job.id)
                .group_by(Job.config)
            ).all()
            return {str(config): int(size or 0) for config, size in rows}
