"""The ledger's attempts as read (by job, host, sweep's prices, history) and their progress fields; an
attempt's state changes only through ``store.Ledger.transition`` (a mixin of ``store.Ledger``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select as columns  # more columns than sqlmodel's select types
from sqlmodel import col, select

from orchestrator.core.errors import LedgerError
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger.pricing import PricedAttempt
from orchestrator.ledger.tables import Attempt, Job
from orchestrator.ledger.txn import IN_CHUNK

if TYPE_CHECKING:
    pass
from orchestrator.ledger.txn import Sessions

SETUP_PHASE = "project_setup"  # orchestrator/health/setup_holds.py: never counts against retries=

_ENDS = frozenset({"ended_at", "seen_ended_at"})  # end times a progress update may set, never clear


class AttemptRecords(Sessions):
    """Attempt reads of :class:`orchestrator.ledger.store.Ledger`, and progress fields (never a state)."""

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
                if value is None and key in _ENDS and getattr(row, key) is not None:
                    continue  # a look that began before another command ended the attempt never unends it
                setattr(row, key, value)

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

