"""What the host says about one attempt, applied to the ledger: progress, checkpoints, exits,
vanished groups, Slurm time-limit chunks.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator import observed, protocol
from orchestrator.ledger import Job, Ledger
from orchestrator.patrol import timestamp
from orchestrator.states import AttemptState, JobState


def exit_message(exit_doc: dict[str, Any]) -> str:
    code = int(exit_doc.get("wrapper_code", -1))
    meaning = protocol.EXIT_MEANINGS.get(code)
    if meaning is None and code > protocol.EXIT_SIGNAL_BASE:
        meaning = f"killed by signal {code - protocol.EXIT_SIGNAL_BASE}"
    detail = str(exit_doc.get("message") or "")
    parts = [f"exit {code}"] + ([meaning] if meaning else []) + ([detail] if detail else [])
    return ": ".join(parts)



def apply(ledger: Ledger, job: Job, seen: dict[str, Any]) -> str:
    """Move the attempt (and, for success or cancel, the job) to what the host says; returns
    "succeeded" | "failed" (exited non-zero) | "lost" (vanished) | "" (nothing ended)."""
    number = job.attempt_count
    state = str(seen.get("state", ""))
    _progress(ledger, job, number, seen)
    if state == "running":
        ledger.transition(job.id, AttemptState.RUNNING, attempt=number, message="group alive")
        ledger.transition(job.id, JobState.RUNNING, of_attempt=number)
    elif state == "exited":
        exit_doc = seen.get("exit") or {}
        code = int(exit_doc.get("wrapper_code", -1))
        ledger.update_attempt(
            job.id, number, exit_code=code, trainer_code=exit_doc.get("trainer_code"),
            phase=exit_doc.get("phase"), message=exit_message(exit_doc),
            ended_at=timestamp(exit_doc.get("ended_at")), started_at=timestamp(exit_doc.get("started_at")),
        )
        if _time_limit_chunk(ledger, job, number, exit_doc, code, seen):
            message = (f"Slurm time limit: stopped at step {exit_doc.get('last_step')} with a checkpoint; "
                       "continues in a new Slurm job (not counted against retries=)")
            ledger.requeue(job.id, message=message, of_attempt=number, end_attempt=AttemptState.PREEMPTED,
                           via=JobState.PREEMPTED)
            return ""
        ledger.transition(job.id, AttemptState.LOST if exit_doc.get("vanished") and code != protocol.EXIT_OK
                          else AttemptState.EXITED, attempt=number, message=exit_message(exit_doc))
        if code == protocol.EXIT_OK:
            ledger.transition(job.id, JobState.SUCCEEDED, message="exit record 0, artifacts verified",
                              of_attempt=number)
            return "succeeded"
        if seen.get("cancel_requested"):
            ledger.transition(job.id, JobState.CANCELLED, message=exit_message(exit_doc), of_attempt=number)
            return ""
        if exit_doc.get("vanished"):  # the agent wrote it: the wrapper's whole group died (kill -9)
            return "lost"
        return "failed"
    elif state == "dead":
        message = "process group gone without an exit record"
        ledger.update_attempt(job.id, number, message=message, ended_at=time.time())
        ledger.transition(job.id, AttemptState.LOST, attempt=number, message=message)
        ledger.transition(job.id, JobState.LOST, message=message, of_attempt=number)
        return "lost"
    elif state == "withdrawn":
        ledger.transition(job.id, AttemptState.KILLED, attempt=number, message="withdrawn from the inbox")
        ledger.transition(job.id, JobState.CANCELLED, message="withdrawn from the inbox", of_attempt=number)
    return ""


def _time_limit_chunk(ledger: Ledger, job: Job, number: int, exit_doc: dict[str, Any], code: int,
                      seen: dict[str, Any]) -> bool:
    """A Slurm job stopped near its time limit (the wrapper's ``slurm_time_limit``) that trained past
    where this attempt began: one chunk of a run longer than the partition allows, continued like a
    preemption.  A chunk that made no progress is an ordinary stop (it counts against retries=, so a
    time limit shorter than the start-up cannot loop forever)."""
    if exit_doc.get("slurm_time_limit") is not True or code == protocol.EXIT_OK or seen.get("cancel_requested"):
        return False
    last = exit_doc.get("last_step")
    previous = ledger.attempt(job.id, number - 1) if number > 1 else None
    began = (previous.step or 0) if previous is not None else 0
    return isinstance(last, int) and not isinstance(last, bool) and last > began


def _progress(ledger: Ledger, job: Job, number: int, seen: dict[str, Any]) -> None:
    beat = seen.get("heartbeat") or {}
    fields: dict[str, Any] = {}
    if beat:
        fields.update(
            step=beat.get("step"), total_steps=beat.get("total_steps"), epoch=beat.get("epoch"),
            loss=beat.get("loss") if isinstance(beat.get("loss"), (int, float)) else None,
            heartbeat_at=timestamp(beat.get("time")),
        )
    fields.update(observed.attempt_progress(seen))  # no heartbeat: what the log's tail says
    if seen.get("launched_at"):
        fields["started_at"] = timestamp(seen.get("launched_at"))
    if seen.get("log_bytes") is not None:
        fields["log_bytes"] = seen.get("log_bytes")
    if fields:
        ledger.update_attempt(job.id, number, **fields)
    pointer = seen.get("ckpt")
    if isinstance(pointer, dict) and pointer.get("sha256"):
        ledger.record_checkpoint(job.id, number, pointer)
    nodes = seen.get("nodes")
    if isinstance(nodes, list) and len(nodes) > 1:  # which machine got which node rank, once per attempt
        ranks = ", ".join(f"node {n.get('rank')} on {n.get('host')}" for n in nodes if isinstance(n, dict))
        message = f"attempt {number} runs on {len(nodes)} nodes: {ranks}"
        if not any(e.message == message for e in ledger.events(subject=job.id, limit=100)):
            ledger.record_event("job", job.id, message)
