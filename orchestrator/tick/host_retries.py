"""Host retries as the tick records them (docs/checkpoints.md, "Who retries what").

A host's agent starts attempt n+1 of a job itself, within seconds, when attempt n died of a signal gpuq did
not send or its group vanished (payload/agent/gpuq_watch/gpuq_retry.py).  Who starts attempt n+1 is decided once, on
the host, in the attempt's ``next.json``; so before the tick settles an attempt that ended badly it asks
the host (agent verb ``decide-retry``, one round trip per host, only when some attempt ended badly): the
host already retried it, and the tick adopts that attempt; or the decision is now the controller's, and
the agent will not retry it.  An attempt the host retried before the tick looked comes in the status
document itself (the entry's ``host_retried``).  Either way the ledger records it exactly as if gpuq had
made it: the ended attempt's class and decision, the same requeue, attempt n+1 on the same host, and one
more event, "started by the host".  A stall the agent healed itself (its class ``stalled`` or
``deadlock_at_start`` in next.json: payload/agent/gpuq_serving/gpuq_stall.py) is recorded as the patrol's own stall kill
records it (``adopt_stall``: attempt n LOST with the same message, the ``stalled`` finding).  A cancel
asks the same question first (``before_cancel``), so that it ends an attempt the ledger knows and no host
retry starts after it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from orchestrator.agent import client
from orchestrator.core import protocol
from orchestrator.core.config import Settings
from orchestrator.core.errors import HostError, IllegalTransition
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health import failures
from orchestrator.health.verdicts import DEADLOCK_AT_START, Decision
from orchestrator.host_documents import JobEntry, ProtocolError, RetryDecision
from orchestrator.hosts.base import Host
from orchestrator.ledger import Job, Ledger
from orchestrator.tick.attempts import apply
from orchestrator.tick.ending import stall_message
from orchestrator.tick.settle import settle

ASKED_TIMEOUT_S = 60.0
STALL_CLASSES = frozenset({"stalled", DEADLOCK_AT_START})  # a stall the host's agent healed itself (gpuq_stall.py)
HOST_KILLED = "killed"  # the verdict a stall kill records, whoever killed (tick/ending.py)
MAX_CHAIN = 5  # attempts a host retried one after another, recorded before a cancel (a bound, never reached)


def ended_badly(seen: JobEntry) -> bool:
    """An entry whose attempt ended without success and without a cancel: a host may have retried it."""
    if seen.state == "dead":
        return True
    exit_doc = seen.exit
    return (seen.state == "exited" and exit_doc is not None and not seen.cancel_requested
            and exit_doc.code != protocol.EXIT_OK and not exit_doc.slurm_time_limit)


def who_retries(ledger: Ledger, host: Host, jobs: Sequence[Job],
                on_host: Mapping[str, JobEntry]) -> dict[str, RetryDecision | None]:
    """{job id: who starts the next attempt} for each of ``jobs`` whose current attempt just ended badly
    on ``host``; None for every one of them when the host could not be asked (the tick settles them at its
    next look, never blind)."""
    asked = [job for job in jobs if (seen := on_host.get(job.id)) is not None
             and seen.attempt == job.attempt_count and ended_badly(seen)]
    return ask(ledger, host, [(job, job.attempt_count) for job in asked])


def ask(ledger: Ledger, host: Host, items: Sequence[tuple[Job, int]]) -> dict[str, RetryDecision | None]:
    """The host's ``decide-retry`` for attempt n of each job (one round trip): who starts attempt n+1,
    the decision now the controller's unless the host already retried it.  {} for a host whose agent never
    retries by itself (a Slurm login node; an agent of an older bundle, which has no such verb), and for
    jobs of several nodes; None for every job when the host could not be asked."""
    row = ledger.host(host.name)
    items = [(job, n) for job, n in items if job.nodes == 1]
    if row is None or row.kind == "slurm" or not row.agent_bundle or not items:
        return {}
    try:
        answer = client.decide_retry(host, row.agent_bundle, [(job.id, n) for job, n in items],
                                     timeout=ASKED_TIMEOUT_S)
        if answer is None:
            return {}  # an agent without the verb: it never retries by itself
        return {job.id: answer.root.get(job.id) for job, _ in items}
    except (HostError, ProtocolError) as exc:
        ledger.record_event("host", host.name, f"could not ask who retries {len(items)} ended attempts: {exc}; "
                            "they are settled at the next look", unless_repeated=True)
        return dict.fromkeys((job.id for job, _ in items), None)


def before_cancel(ledger: Ledger, host: Host, jobs: Sequence[Job], settings: Settings) -> None:
    """Before a cancel reaches ``host``: from here on its agent retries none of ``jobs`` (the decision on
    each current attempt is now gpuq's), and an attempt it already started by itself is recorded first,
    as the tick would have recorded it, so that the cancel ends an attempt the ledger knows."""
    pending = [(job, job.attempt_count) for job in jobs if job.attempt_count]
    for _ in range(MAX_CHAIN):
        answers = ask(ledger, host, pending)
        retried = [(job, n, decision) for job, n in pending if by_host(decision := answers.get(job.id))]
        pending = [(ledger.job(job.id), n + 1) for job, n, decision in retried
                   if decision is not None and _record(ledger, job.id, n, decision, settings)]
        if not pending:
            return


def _record(ledger: Ledger, job_id: str, number: int, decision: RetryDecision, settings: Settings) -> bool:
    """Attempt ``number``'s end as the host recorded it, and the attempt its agent started after it."""
    current = ledger.job(job_id)
    if decision.exit is None or current.attempt_count != number:
        return False
    ended = JobEntry(job_id=job_id, attempt=number, state="exited", exit=decision.exit.model_dump())
    if host_stall(decision):
        return adopt_stall(ledger, current, ended, decision, settings).action == "requeue"
    if apply(ledger, current, ended) not in ("failed", "lost"):
        return False
    klass = decision.klass if decision.klass in failures.NAMES else "killed"  # the host's word, only if a class
    adopted = adopt(ledger, current, klass, settings, repeated="", why=decision.why or "")
    return adopted.action == "requeue"


def by_host(decision: RetryDecision | None) -> bool:
    return decision is not None and decision.by == "host"


def host_stall(decision: RetryDecision | None) -> bool:
    """The host's agent ended the attempt as a stall and retried it (its class one of gpuq's stall classes)."""
    return by_host(decision) and decision is not None and decision.klass in STALL_CLASSES


def adopt_stall(ledger: Ledger, job: Job, seen: JobEntry, decision: RetryDecision, settings: Settings) -> Decision:
    """Attempt n of ``job`` stalled and the host's agent healed it itself (saved its stacks, killed it and
    started attempt n+1 with resume): recorded as the patrol's own stall kill records it (tick/ending.py:
    its progress, then LOST with the same message), then settled and adopted as every host retry is."""
    number = job.attempt_count
    if job.state not in (JobState.RUNNING.value, JobState.ASSIGNED.value):
        return Decision("stale", f"attempt {number} was settled meanwhile ({job.state})")
    klass = str(decision.klass)
    apply(ledger, job, seen.model_copy(update={"state": "running", "exit": None}))  # its last progress, checkpoints
    exit_doc = seen.exit
    message = stall_message(klass, number, HOST_KILLED, decision.stacks or "")
    ended_at = exit_doc.ended_at if exit_doc is not None and exit_doc.ended_at is not None else time.time()
    ledger.update_attempt(job.id, number, message=message, ended_at=ended_at)
    ledger.transition(job.id, AttemptState.LOST, attempt=number, message=message)
    ledger.transition(job.id, JobState.LOST, message=message, failure_class=klass)
    return adopt(ledger, ledger.job(job.id), klass, settings, repeated="", why=decision.why or "")


def adopt(ledger: Ledger, job: Job, klass: str, settings: Settings, *, repeated: str, why: str) -> Decision:
    """Attempt n of ``job`` (already recorded as ended) was retried by its host's agent: settle it as
    ``settle`` would have, and record attempt n+1, started by the host, in the same transaction.  The
    attempt runs whatever gpuq would have decided (it was started with the retries gpuq gave the host):
    when the class says otherwise, the decision says so.  Never past ``retries=``: the host was given no
    more (``launcher.host_retry``), so a retry beyond them is not adopted and attempt n is settled as
    ``settle`` settles it (LOST or FAILED)."""
    number = job.attempt_count
    retries = job.retries if job.retries is not None else settings.retries
    failed = ledger.failed_attempts(job.id)
    if failed > retries:
        return _refuse(ledger, job, klass, settings, repeated=repeated, retries=retries)
    decision = failures.decide(klass, failed, retries, repeated=repeated)
    if decision.action != "requeue":
        decision = Decision("requeue", f"{klass}: the host's agent retried it with resume; gpuq would not "
                                       f"have ({decision.reason})")
    note = f"started by the host: its agent retried attempt {number} with resume" + (f" ({why})" if why else "")
    try:
        started = ledger.restart_on_host(job.id, of_attempt=number, host=job.host or "", message=decision.reason,
                                         note=note, failure_class=klass)
    except IllegalTransition as exc:  # it ended meanwhile (a cancel): the host's attempt went with it
        return Decision("stale", f"attempt {number} was settled meanwhile: {exc}")
    if started is None:
        return Decision("stale", f"attempt {number} was already settled (another gpuq command)")
    return decision


def _refuse(ledger: Ledger, job: Job, klass: str, settings: Settings, *, repeated: str, retries: int) -> Decision:
    """A retry the host says it made past the job's ``retries=``: attempt n is settled as gpuq's own end
    (``settle``), and the host's attempt n+1 is no attempt of gpuq's (never recorded, never adopted)."""
    number = job.attempt_count
    ledger.record_event("job", job.id, f"the host's agent says it retried attempt {number} itself, past "
                        f"retries={retries}: not adopted (the host was given no retry left)")
    return settle(ledger, job.id, klass, settings, attempt=number, repeated=repeated)
