"""Settle an attempt that ended badly: requeue with resume while retries last, else FAILED or LOST
(docs/health.md).
"""

from __future__ import annotations

from orchestrator.core.config import Settings
from orchestrator.core.states import JobState
from orchestrator.health.failures import decide
from orchestrator.health.verdicts import Decision
from orchestrator.ledger import Ledger


def settle(ledger: Ledger, job_id: str, klass: str, settings: Settings, *, attempt: int | None = None,
           repeated: str = "") -> Decision:
    """The job's current attempt ended badly (the attempt is already EXITED or LOST): requeue it
    with resume while retries last, else FAILED (never retried) or LOST (`gpuq resume` later).

    ``attempt``: the attempt that ended.  When another gpuq command has settled it and started the
    job again meanwhile, nothing changes (a stale tick must not end or requeue the newer attempt).
    ``repeated``: the exception line it ended with when the attempt before ended with the same one (a
    deterministic crash: FAILED, not retried again; ``failures.decide``)."""
    job = ledger.job(job_id)
    if attempt is not None and (job.attempt_count != attempt or JobState(job.state).terminal
                                or job.state == JobState.QUEUED.value):
        return Decision("stale", f"attempt {attempt} was already settled (the job is {job.state}, "
                                f"attempt {job.attempt_count})")
    retries = job.retries if job.retries is not None else settings.retries
    decision = decide(klass, ledger.failed_attempts(job_id), retries, repeated=repeated)
    if decision.action == "requeue":
        ledger.requeue(job_id, message=decision.reason, of_attempt=job.attempt_count, failure_class=klass)
    elif decision.action == "keep_lost" and job.state in (JobState.LOST.value, JobState.RUNNING.value,
                                                            JobState.ASSIGNED.value):
        ledger.transition(job_id, JobState.LOST, message=decision.reason, of_attempt=job.attempt_count,
                          failure_class=klass)
    else:
        ledger.transition(job_id, JobState.FAILED, message=decision.reason, of_attempt=job.attempt_count,
                          failure_class=klass)
    return decision
