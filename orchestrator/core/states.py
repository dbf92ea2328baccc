"""Job and attempt states, and the only transitions the ledger permits.

::

    Job:     QUEUED → ASSIGNED → RUNNING → SUCCEEDED
                                         ↘ FAILED (non-retryable, or retries exhausted)
             ASSIGNED|RUNNING → PREEMPTED | LOST → QUEUED (resume) | FAILED
             ASSIGNED → QUEUED: the controller withdrew it unstarted from its host's inbox (a budget
             passed, or work stealing that did not live to place it elsewhere); the attempt ends KILLED
             any non-terminal → CANCELLED
             FAILED | LOST → PREEMPTED: the provider reports a spot preemption a tick after the
             attempt ended on that host (its grace came first); only ``stops.reclaim_preempted``
    Attempt: STARTING → RUNNING → EXITED | PREEMPTED | LOST | KILLED
             EXITED | LOST → PREEMPTED: the same late evidence, for the attempt that just ended

``ASSIGNED → SUCCEEDED|FAILED`` is allowed because a short job can start and
finish between two probes; the ledger then learns both facts at once from the
exit record.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    QUEUED = "QUEUED"
    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in JOB_TERMINAL


class AttemptState(str, Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in ATTEMPT_TERMINAL


JOB_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ATTEMPT_TERMINAL = frozenset(
    {AttemptState.EXITED, AttemptState.PREEMPTED, AttemptState.LOST, AttemptState.KILLED}
)

_J = JobState
JOB_ALLOWED: dict[JobState, frozenset[JobState]] = {
    _J.QUEUED: frozenset({_J.ASSIGNED, _J.CANCELLED}),
    _J.ASSIGNED: frozenset({_J.RUNNING, _J.SUCCEEDED, _J.FAILED, _J.PREEMPTED, _J.LOST, _J.CANCELLED, _J.QUEUED}),
    _J.RUNNING: frozenset({_J.SUCCEEDED, _J.FAILED, _J.PREEMPTED, _J.LOST, _J.CANCELLED}),
    _J.PREEMPTED: frozenset({_J.QUEUED, _J.FAILED, _J.CANCELLED}),
    _J.LOST: frozenset({_J.QUEUED, _J.FAILED, _J.CANCELLED, _J.PREEMPTED}),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset({_J.PREEMPTED}),
    _J.CANCELLED: frozenset(),
}

_A = AttemptState
ATTEMPT_ALLOWED: dict[AttemptState, frozenset[AttemptState]] = {
    _A.STARTING: frozenset({_A.RUNNING, _A.EXITED, _A.PREEMPTED, _A.LOST, _A.KILLED}),
    _A.RUNNING: frozenset({_A.EXITED, _A.PREEMPTED, _A.LOST, _A.KILLED}),
    _A.EXITED: frozenset({_A.PREEMPTED}),
    _A.PREEMPTED: frozenset(),
    _A.LOST: frozenset({_A.PREEMPTED}),
    _A.KILLED: frozenset(),
}


def job_may(old: JobState, new: JobState) -> bool:
    return new in JOB_ALLOWED[old]


def attempt_may(old: AttemptState, new: AttemptState) -> bool:
    return new in ATTEMPT_ALLOWED[old]
