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
from orchestrator.ledger import Job, Ledger
from orchestrator.tick import withdraw


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
    _progress(ledger, job, number, seen)
    if state == "running":
        ledger.transition(job.id, AttemptState.RUNNING, attempt=number, message="group alive")
        ledger.transition(job.id, JobState.RUNNING, of_attempt=number)
    elif state == "exited":
        exit_doc = seen.exit_or_empty
        code = exit_doc.code
        ledger.update_attempt(
            job.id, number, exit_code=code, trainer_code=exit_doc.trainer_code,
            phase=exit_doc.phase, message=exit_message(exit_doc),
            ended_at=exit_doc.ended_at, started_at=exit_doc.started_at,
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
        if seen.cancel_requested:
            ledger.transition(job.id, JobState.CANCELLED, message=exit_message(exit_doc), of_attempt=number)
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


def _progress(ledger: Ledger, job: Job, number: int, seen: JobEntry) -> None:
    beat = seen.beat
    fields: dict[str, Any] = {}
    if beat is not None:
        fields.update(step=beat.step, total_steps=beat.total_steps, epoch=beat.epoch, loss=beat.loss,
                      heartbeat_at=beat.time)
    fields.update(observed.attempt_progress(seen))  # no heartbeat: what the log's tail says
    if seen.launched_at is not None:
        fields["started_at"] = seen.launched_at
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
