"""Job and attempt states, and the only transitions the ledger permits.

::

    Job:     QUEUED → ASSIGNED → RUNNING → SUCCEEDED
                                         ↘ FAILED (non-retryable, or retries exhausted)
             ASSIGNED|RUNNING → PREEMPTED | LOST → QUEUED (resume) | FAILED
             ASSIGNED → QUEUED: the controller withdrew it unstarted from its host's inbox (a budget
             passed, or work stealing that did not live to place it elsewhere); the attempt ends KILLED
             any non-terminal → CANCELLED
             any non-terminal → STOPPED: early stopping ([stop], docs/stopping.md) found its cell worse than
             the baseline; the decision is recorded (``stop_look``) before the job is stopped on its host
             FAILED | LOST → PREEMPTED: the provider reports a spot preemption a tick after the
             attempt ended on that host (its grace came first); only ``stops.reclaim_preempted``
    Attempt: STARTING → RUNNING → EXITED | PREEMPTED | LOST | KILLED
             EXITED | LOST → PREEMPTED: the same late evidence, for the attempt that just ended

``ASSIGNED → SUCCEEDED|FAILED`` is allowed because a short job can start and
finish between two probes; the ledger then learns both facts at once from the
exit record.

The lease of a rented machine (where the money is; ``Ledger.lease_transition`` is its only writer)::

    Lease:   (none) → PROVISIONING: `gpuq up` records the row before its create call
             PROVISIONING → RUNNING: registered (the audit passed) | TERMINATED: ended unregistered
             RUNNING | PREEMPTED | STOPPED | FAILED → PREEMPTED | STOPPED | FAILED | TERMINATED:
             what its provider says once the machine stops answering (``tick/leases.py``); `gpuq up`
             marks a registered machine it could not end FAILED
             PREEMPTED | STOPPED → RUNNING: `gpuq resume` re-bid or resumed the same machine
             TERMINATED: final (the provider says it is gone)

A host's hold (no new job goes there) is a ``HoldKind`` and free detail text, never parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    STOPPED = "STOPPED"  # early stopping: its cell lost against the baseline at a rung (its own outcome)

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


JOB_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED})
ATTEMPT_TERMINAL = frozenset(
    {AttemptState.EXITED, AttemptState.PREEMPTED, AttemptState.LOST, AttemptState.KILLED}
)

# the state a job's current attempt ends in when the job ends and the host never said the attempt ended
# (a cancel, a settle): an attempt always ends with its job (``Ledger.transition``; docs/cost.md)
ENDS_AS: dict[JobState, AttemptState] = {
    JobState.SUCCEEDED: AttemptState.EXITED,
    JobState.FAILED: AttemptState.LOST,
    JobState.CANCELLED: AttemptState.KILLED,
    JobState.STOPPED: AttemptState.KILLED,
}

_J = JobState
JOB_ALLOWED: dict[JobState, frozenset[JobState]] = {
    _J.QUEUED: frozenset({_J.ASSIGNED, _J.CANCELLED, _J.STOPPED}),
    _J.ASSIGNED: frozenset({_J.RUNNING, _J.SUCCEEDED, _J.FAILED, _J.PREEMPTED, _J.LOST, _J.CANCELLED, _J.QUEUED,
                            _J.STOPPED}),
    _J.RUNNING: frozenset({_J.SUCCEEDED, _J.FAILED, _J.PREEMPTED, _J.LOST, _J.CANCELLED, _J.STOPPED}),
    _J.PREEMPTED: frozenset({_J.QUEUED, _J.FAILED, _J.CANCELLED, _J.STOPPED}),
    _J.LOST: frozenset({_J.QUEUED, _J.FAILED, _J.CANCELLED, _J.PREEMPTED, _J.STOPPED}),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset({_J.PREEMPTED}),
    _J.CANCELLED: frozenset(),
    _J.STOPPED: frozenset(),
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


class LeaseState(str, Enum):
    """Where a rented machine's money stands (``HostRow.lease_state``; NONE: a host the user brought)."""

    NONE = ""
    PROVISIONING = "provisioning"
    RUNNING = "running"
    PREEMPTED = "preempted"
    STOPPED = "stopped"
    FAILED = "failed"
    TERMINATED = "terminated"


_L = LeaseState
LEASE_ALLOWED: dict[LeaseState, frozenset[LeaseState]] = {
    _L.NONE: frozenset({_L.PROVISIONING}),
    _L.PROVISIONING: frozenset({_L.RUNNING, _L.TERMINATED}),
    _L.RUNNING: frozenset({_L.PREEMPTED, _L.STOPPED, _L.FAILED, _L.TERMINATED}),
    _L.PREEMPTED: frozenset({_L.RUNNING, _L.STOPPED, _L.FAILED, _L.TERMINATED}),
    _L.STOPPED: frozenset({_L.RUNNING, _L.PREEMPTED, _L.FAILED, _L.TERMINATED}),
    _L.FAILED: frozenset({_L.PREEMPTED, _L.STOPPED, _L.TERMINATED}),
    _L.TERMINATED: frozenset(),
}
LEASE_DOWN = frozenset({_L.PREEMPTED, _L.STOPPED, _L.FAILED, _L.TERMINATED})  # its provider says it is not running
LEASE_REVIVABLE = frozenset({_L.PREEMPTED, _L.STOPPED})  # the same machine may come back (re-bid, resume)
LEASE_UNPROBED = frozenset({_L.PROVISIONING, _L.TERMINATED})  # not up yet, or gone: nothing answers there


def lease_may(old: LeaseState, new: LeaseState) -> bool:
    return new in LEASE_ALLOWED[old]


class HoldKind(str, Enum):
    """Why a host gets no new job (``HostRow.hold_kind``; the detail text says more, for people)."""

    NONE = ""
    UNHEALTHY = "unhealthy"  # a failed preflight or a fatal Xid; lifted by a later PASS or WARN
    DISK = "disk"  # its data mount is full; lifted when it clears
    UNUSABLE = "unusable"  # `gpuq up` will not use the machine and could not end it
    REPLACED = "replaced"  # `gpuq resume` rented a replacement: it stays down
    TERMINATED = "terminated"  # gpuq ended the machine
    OTHER = "other"  # a hold of a ledger older than the kinds (its text is the detail)


ANY_HOLD = frozenset(HoldKind)


@dataclass(frozen=True)
class HoldChange:
    """A change of a host's hold: to ``kind`` (NONE: lifted) with ``detail``, made only when the host's
    current hold is one of ``over`` (NONE in it: when the host is not held), in the writing transaction."""

    kind: HoldKind
    detail: str = ""
    over: frozenset[HoldKind] = ANY_HOLD

    @classmethod
    def lift(cls, *kinds: HoldKind) -> HoldChange:
        """Lift the host's hold when it is one of ``kinds``; another hold stays."""
        return cls(HoldKind.NONE, over=frozenset(kinds))


def hold_text(kind: HoldKind, detail: str) -> str:
    """A hold as one line for people: "" when not held; "KIND: DETAIL" (a legacy hold: its own text)."""
    if kind is HoldKind.NONE:
        return ""
    if kind is HoldKind.OTHER:
        return detail
    return f"{kind.value}: {detail}" if detail else kind.value
