"""Taking jobs not yet started back out of a host's inbox (work stealing, a budget passed).

The record comes before the side effect: each attempt is marked ``withdrawing`` (why) in the ledger,
then the host's agent withdraws the specs by atomic rename out of its inbox, in one round trip.  A spec
the agent had claimed meanwhile runs where it is (its mark is cleared).  When gpuq dies between the
agent's rename and its own record, the next tick reads the host's ``withdrawn`` and, seeing the mark,
puts the job back in the queue (``settle``); a withdrawal without the mark is the user's cancel, and
ends the job.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.agent import client
from orchestrator.core.states import AttemptState, JobState
from orchestrator.fleet.registry import Fleet
from orchestrator.ledger import Attempt, Job, Ledger

WHY = ("steal", "budget")


def withdraw(ledger: Ledger, fleet: Fleet, host_name: str, jobs: Sequence[Job], why: str) -> set[str]:
    """Withdraw ``jobs`` (their current attempts, all on ``host_name``) from that host's inbox; the ids the
    agent withdrew.  Nothing is withdrawn from a host that does not answer or answers garbage."""
    assert why in WHY
    if not jobs:
        return set()
    for job in jobs:  # the record first
        ledger.update_attempt(job.id, job.attempt_count, withdrawing=why)
    row = ledger.host(host_name)
    host = fleet.named(host_name)
    verdicts = client.withdraw(host, row.agent_bundle if row else "", [j.id for j in jobs])
    withdrawn = {j.id for j in jobs if verdicts.of(j.id) == "withdrawn"}
    for job in jobs:
        if job.id not in withdrawn:  # claimed meanwhile (it runs), or not asked: no withdrawal under way
            ledger.update_attempt(job.id, job.attempt_count, withdrawing="")
    return withdrawn


def requeue(ledger: Ledger, job: Job, number: int, message: str) -> bool:
    """The job's attempt ``number``, withdrawn unstarted, ends KILLED (it counts against no retries=) and
    the job goes back to QUEUED, in one transaction; False when the job moved on meanwhile."""
    return ledger.requeue(job.id, message=message, of_attempt=number, end_attempt=AttemptState.KILLED, via=None)


def settle(ledger: Ledger, job: Job, attempt: Attempt | None) -> None:
    """The host says the job's current attempt was withdrawn from its inbox and the ledger never recorded
    it: gpuq's own withdrawal (marked) goes back to the queue; an unmarked one was the user's cancel."""
    number = job.attempt_count
    if attempt is not None and attempt.withdrawing in WHY:
        requeue(ledger, job, number, f"withdrawn unstarted from {attempt.host} ({attempt.withdrawing}); "
                                     "queued again")
        return
    ledger.transition(job.id, AttemptState.KILLED, attempt=number, message="withdrawn from the inbox")
    ledger.transition(job.id, JobState.CANCELLED, message="withdrawn from the inbox", of_attempt=number)
