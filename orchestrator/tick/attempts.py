"""What the host says about one attempt, applied to the ledger: progress, checkpoints, exits,
vanished groups, Slurm time-limit chunks.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.core import protocol
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health import observed
from orchestrator.host_documents import ExitRecord, JobEntry
from orchestrator.ledger import Attempt, Job, Ledger
from orchestrator.money.cost import Seen, billed_interval
from orchestrator.tick import stoplooks as stopping
from orchestrator.tick import withdraw

CLOCK_RULE = "host_clock"  # a finding: a host's claimed start or end fell outside what gpuq saw (docs/cost.md)


def exit_message(exit_doc: ExitRecord) -> str:
    code = exit_doc.code
    meaning = protocol.EXIT_MEANINGS.get(code)
    if meaning is None and code > protocol.EXIT_SIGNAL_BASE:
        meaning = f"killed by signal {code - protocol.EXIT_SIGNAL_BASE}"
    detail = exit_doc.message or ""
    if meaning and detail.startswith(meaning):  # an older wrapper repeats the meaning as its message
        detail = detail[len(meaning):].lstrip(":, ")
    parts = [f"exit {code}"] + ([meaning] if meaning else []) + ([detail] if detail else [])
    return ": ".join(parts)



def apply(ledger: Ledger, job: Job, seen: JobEntry) -> str:
    """Move the attempt (and, for success or cancel, the job) to what the host says; returns
    "succeeded" | "failed" (exited non-zero) | "lost" (vanished) | "" (nothing ended)."""
    number = job.attempt_count
    state = seen.state
    now = time.time()
    att = ledger.attempt(job.id, number)
    _progress(ledger, job, number, seen, att, now)
    if state == "running":
        ledger.transition(job.id, AttemptState.RUNNING, attempt=number, message="group alive")
        ledger.transition(job.id, JobState.RUNNING, of_attempt=number)
    elif state == "exited":
        exit_doc = seen.exit_or_empty
        code = exit_doc.code
        claim = exit_doc.started_at if exit_doc.started_at is not None else seen.launched_at
        ledger.update_attempt(
            job.id, number, exit_code=code, trainer_code=exit_doc.trainer_code,
            phase=exit_doc.phase, message=exit_message(exit_doc),
            **times(ledger, job, att, claim, exit_doc.ended_at, now, ended=True),
        )
        if _time_limit_chunk(ledger, job, number, exit_doc, code, seen):
            message = (f"Slurm time limit: stopped at step {exit_doc.last_step} with a checkpoint; "
                       "continues in a new Slurm job (not counted against retries=)")
            ledger.requeue(job.id, message=message, of_attempt=number, end_attempt=AttemptState.PREEMPTED,
                           via=JobState.PREEMPTED)
            return ""
        ledger.transition(job.id, AttemptState.LOST if exit_doc.vanished and code != protocol.EXIT_OK
                          else AttemptState.EXITED, attempt=number, message=exit_message(exit_doc))
        if code == protocol.EXIT_OK:
            ledger.transition(job.id, JobState.SUCCEEDED, message=exit_message(exit_doc),
                              of_attempt=number)
            return "succeeded"
        if seen.cancel_requested:  # early stopping's cancel whose STOPPED gpuq did not live to record is STOPPED
            look = stopping.decided_stop(ledger, job)
            ended, said = (JobState.STOPPED, f"{stopping.reason(look)} ({exit_message(exit_doc)})") if look else (
                JobState.CANCELLED, exit_message(exit_doc))
            ledger.transition(job.id, ended, message=said, of_attempt=number)
            return ""
        if exit_doc.vanished:  # the agent wrote it: the wrapper's whole group died (kill -9)
            return "lost"
        return "failed"
    elif state == "dead":
        message = "process group gone without an exit record"
        ledger.update_attempt(job.id, number, message=message, ended_at=time.time())
        ledger.transition(job.id, AttemptState.LOST, attempt=number, message=message)
        ledger.transition(job.id, JobState.LOST, message=message, of_attempt=number)
        return "lost"
    elif state == "withdrawn":
        withdraw.settle(ledger, job, ledger.attempt(job.id, number))
    return ""


def _time_limit_chunk(ledger: Ledger, job: Job, number: int, exit_doc: ExitRecord, code: int,
                      seen: JobEntry) -> bool:
    """A Slurm job stopped near its time limit (the wrapper's ``slurm_time_limit``) that trained past
    where this attempt began: one chunk of a run longer than the partition allows, continued like a
    preemption.  A chunk that made no progress is an ordinary stop (it counts against retries=, so a
    time limit shorter than the start-up cannot loop forever)."""
    if not exit_doc.slurm_time_limit or code == protocol.EXIT_OK or seen.cancel_requested:
        return False
    last = exit_doc.last_step
    previous = ledger.attempt(job.id, number - 1) if number > 1 else None
    began = (previous.step or 0) if previous is not None else 0
    return last is not None and last > began


def times(ledger: Ledger, job: Job, att: Attempt | None, claim_start: float | None, claim_end: float | None,
          now: float, *, running: bool = False, ended: bool = False) -> dict[str, Any]:
    """The attempt's time fields at this look (``now``, gpuq's clock): what gpuq saw (running, ended), the
    host's claimed start and end kept as claims, and the billed interval clamped to what gpuq saw
    (``cost.billed_interval``); a claim outside it is a finding, once per claim."""
    if att is None:
        return {}
    claim_start = claim_start if claim_start is not None else att.host_started_at
    fields: dict[str, Any] = {"host_started_at": claim_start, "host_ended_at": claim_end}
    first_running, alive, first_ended = att.seen_running_at, att.seen_alive_at, att.seen_ended_at
    if running:
        first_running = now if first_running is None else first_running
        alive = now
        fields.update(seen_running_at=first_running, seen_alive_at=alive)
    if ended and first_ended is None:
        first_ended = fields["seen_ended_at"] = now
    looked = Seen(att.dispatched_at if att.dispatched_at is not None else att.created_at, first_running, alive,
                  first_ended)
    billed = billed_interval(claim_start, claim_end, looked, now)
    fields.update(started_at=billed.started, ended_at=billed.ended)
    said = [("started", claim_start, billed.started, billed.start_outside and claim_start != att.host_started_at),
            ("ended", claim_end, billed.ended, billed.end_outside and claim_end != att.host_ended_at)]
    for what, claim, kept, outside in said:
        if outside and claim is not None and kept is not None:
            ledger.record_finding(
                "job", job.id, severity="warn", rule=CLOCK_RULE, attempt=att.number,
                message=f"{job.name}: host {att.host} says attempt {att.number} {what} {claim - kept:+.0f} s from "
                        "what gpuq saw; billed by gpuq's clock (the host's claim is kept, never billed)",
                reason=f"host {att.host}'s claimed {what} time is outside what gpuq saw",
                action="check the host's clock; `gpuq explain` shows the billed interval")
    return fields


def _progress(ledger: Ledger, job: Job, number: int, seen: JobEntry, att: Attempt | None, now: float) -> None:
    beat = seen.beat
    fields: dict[str, Any] = {}
    if beat is not None:
        fields.update(step=beat.step, total_steps=beat.total_steps, epoch=beat.epoch, loss=beat.loss,
                      heartbeat_at=beat.time)
    fields.update(observed.attempt_progress(seen))  # no heartbeat: what the log's tail says
    if seen.state != "exited":  # an exit's times are its record's (``apply``)
        fields.update(times(ledger, job, att, seen.launched_at, None, now, running=seen.state == "running"))
    if seen.log_bytes is not None:
        fields["log_bytes"] = seen.log_bytes
    if seen.provenance is not None:  # what the attempt ran with (the wrapper writes it once)
        fields["provenance"] = seen.provenance.stored()
    if fields:
        ledger.update_attempt(job.id, number, **fields)
    pointer = seen.ckpt
    if pointer is not None and pointer.sha256:
        ledger.record_checkpoint(job.id, number, pointer.recorded())
    nodes = seen.nodes
    if nodes is not None and len(nodes) > 1:  # which machine got which node rank, once per attempt
        ranks = ", ".join(f"node {n.rank} on {n.host}" for n in nodes)
        message = f"attempt {number} runs on {len(nodes)} nodes: {ranks}"
        if not any(e.message == message for e in ledger.events(subject=job.id, limit=100)):
            ledger.record_event("job", job.id, message)
