"""A running attempt the patrol ends (docs/health.md): a stall, a stall before the first step
(``deadlock_at_start``) or a non-finite loss (``divergence``).

The attempt is killed by its recorded group through the agent's identity-checked ``kill``, as a cancel
kills; before a stall kill the agent's ``stacks`` saves where each process waits to the attempt's
``stacks.txt`` (py-spy, else /proc), which travels home with the attempt's evidence.  The attempt
is then LOST and the job settled by its class: a stall requeued with resume while retries last, a
deadlock at start retried once at most, a divergence FAILED, never retried.
"""

from __future__ import annotations

import time

from orchestrator.agent import client
from orchestrator.context import Context
from orchestrator.core import protocol
from orchestrator.core.errors import HostError
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health.patrol import Finding
from orchestrator.health.verdicts import DEADLOCK_AT_START, DIVERGENCE_HINT
from orchestrator.hosts.base import Host
from orchestrator.ledger import HostRow, Job
from orchestrator.tick.findings import TickReport
from orchestrator.tick.settle import settle

STACKS_FOR = frozenset({"stalled", DEADLOCK_AT_START})  # where a hung process waits says why it hangs
STACKS_TIMEOUT_S = 90.0  # the agent bounds its own work to 45 s (gpuq_stacks.TOTAL_S)


def save_stacks(ctx: Context, host: Host, row: HostRow, job: Job) -> str:
    """Ask the agent to save the attempt's stacks.txt; the agent's one line ("saved ..." or "not
    saved: why"), or why it could not be asked.  Never stops the kill that follows."""
    try:
        said = client.stacks(host, row.agent_bundle, job.id, job.attempt_count, timeout=STACKS_TIMEOUT_S)
    except HostError as exc:
        return f"stacks not saved: {exc}"
    line = said.text[:300] if said.text else f"exit {said.code}"
    if not said.ok:
        ctx.ledger.record_event("job", job.id, f"stacks of attempt {job.attempt_count}: {line}", unless_repeated=True)
    return line


def stall_message(klass: str, n: int, verdict: str, stacks: str) -> str:
    """What the history says of attempt ``n`` ended as a stall (``klass``), whoever killed it (this patrol,
    or the host's agent healing it itself: tick/host_retries.py), and where it hung."""
    first = "no step reached; " if klass == DEADLOCK_AT_START else ""
    where = f"{protocol.ATTEMPTS_DIR}/{n}/{protocol.STACKS_FILE}"
    saved = f"where it hung: {where}" if stacks.startswith("saved") else stacks
    return f"{klass}: {first}killed group of attempt {n} ({verdict})" + (f"; {saved}" if saved else "")


def end_attempt(ctx: Context, host: Host, row: HostRow, job: Job, finding: Finding, report: TickReport) -> None:
    """Kill the job's current attempt for ``finding`` (its ``klass`` says why), then settle the job."""
    klass = finding.klass
    current = ctx.ledger.job(job.id)
    live = (JobState.RUNNING.value, JobState.ASSIGNED.value)
    if current.state not in live or current.attempt_count != job.attempt_count:
        return
    n = job.attempt_count
    stacks = save_stacks(ctx, host, row, job) if klass in STACKS_FOR else ""
    try:
        said = client.kill(host, row.agent_bundle, job.id, n, timeout=ctx.settings.kill_grace_s + 60)
    except HostError as exc:
        ctx.ledger.record_event("job", job.id, f"{klass}; killing it failed: {exc}", unless_repeated=True)
        return
    verdict = said.text
    if not said.ok:
        ctx.ledger.record_event("job", job.id, f"{klass}; not killed: {verdict}", unless_repeated=True)
        return
    if verdict.startswith(protocol.KILL_HOST_RETRIED):  # the host healed it first: its retry is recorded next look
        ctx.ledger.record_event("job", job.id, f"{klass}: the host's agent had ended attempt {n} first and "
                                f"retried it itself ({verdict})", unless_repeated=True)
        return
    message = stall_message(klass, n, verdict, stacks)
    if klass == "divergence":  # the finding's message without the job's name
        what = finding.reason or finding.message
        message = f"{klass}: {what}; gpuq ended attempt {n} ({verdict}); {DIVERGENCE_HINT}"
    ctx.ledger.update_attempt(job.id, n, message=message, ended_at=time.time())
    ctx.ledger.transition(job.id, AttemptState.LOST, attempt=n, message=message)
    ctx.ledger.transition(job.id, JobState.LOST, message=message, failure_class=klass)
    decision = settle(ctx.ledger, job.id, klass, ctx.settings, attempt=n)
    report.actions.append(f"{job.name} ({job.id}): {decision.reason}")
