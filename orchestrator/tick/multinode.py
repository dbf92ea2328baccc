"""The tick's part of multi-node jobs over SSH hosts (orchestrator/tick/gangs.py, docs/multinode.md).

After every host's probe has been reconciled:

* an attempt that ended (node 0 succeeded, or any node failed) has its other nodes stopped;
* a node whose spec never arrived is sent again;
* an attempt whose nodes did not all start within ``gang_timeout_s`` is given up: every node is
  stopped and the job goes back to the queue without counting against ``retries=`` (its hosts were
  not all free, which is no fault of the job).

Before a multi-node job resumes, every node gets the same checkpoint (``place_on_every_node``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from orchestrator.context import Context
from orchestrator.core.errors import GpuqError, IllegalTransition
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Job
from orchestrator.tick import gangs
from orchestrator.tick.checkpoints import place_checkpoint, refresh_from

_ACTIVE = (JobState.ASSIGNED.value, JobState.RUNNING.value)


def after_reconcile(ctx: Context, parts: Mapping[str, Sequence[gangs.Part]], ended: Sequence[str],
                    actions: list[str]) -> None:
    """Act on every multi-node attempt seen this tick; ``ended``: those reconcile just settled."""
    now = time.time()
    for job_id, nodes in parts.items():
        job = ctx.ledger.job(job_id)
        attempt = ctx.ledger.attempt(job_id, job.attempt_count) if job.attempt_count else None
        if attempt is None or not attempt.nodes:
            continue
        if job_id in ended or job.state not in _ACTIVE:
            if job.attempt_count == attempt.number and job.state not in _ACTIVE:
                why = "it succeeded" if job.state == JobState.SUCCEEDED.value else "it ended"
                gangs.stop_parts(ctx.ledger, ctx.fleet, job, attempt, nodes[1:] if why == "it succeeded" else nodes,
                                 why)
            elif job_id in ended:  # settled and already requeued
                gangs.stop_parts(ctx.ledger, ctx.fleet, job, attempt, nodes, "it ended")
            continue
        gangs.resend_missing(ctx.ledger, ctx.fleet, ctx.settings, job, attempt, nodes)
        late = gangs.waiting(nodes)
        if late and now - attempt.created_at > ctx.settings.gang_timeout_s:
            give_up(ctx, job, attempt.number, nodes, late, actions)


def give_up(ctx: Context, job: Job, number: int, nodes: Sequence[gangs.Part], late: Sequence[gangs.Part],
            actions: list[str]) -> None:
    """Nodes that did not start in time: stop every node and requeue the job (not counted as a failure)."""
    names = ", ".join(f"node {p.rank} on {p.host}" for p in late)
    why = (f"{names} did not start within {ctx.settings.gang_timeout_s:.0f} s of the others (gang_timeout_s); "
           "requeued, not counted against retries=")
    attempt = ctx.ledger.attempt(job.id, number)
    if attempt is None:
        return
    gangs.stop_parts(ctx.ledger, ctx.fleet, job, attempt, nodes, "its nodes did not all start")
    try:
        ctx.ledger.requeue(job.id, message=why, of_attempt=number, end_attempt=AttemptState.KILLED,
                           attempt_fields={"message": why, "ended_at": time.time()})
    except IllegalTransition:  # another gpuq command settled it meanwhile
        return
    actions.append(f"{job.name} ({job.id}): {why}")


def place_on_every_node(ctx: Context, job: Job, names: Sequence[str]) -> None:
    """Every node of a resuming multi-node job must load the same checkpoint: the newest one is first
    copied home from the host of the last attempt's node 0, then placed on each node (a node keeps its
    own copy only when it is the very same checkpoint).  Raises GpuqError when a node cannot get it."""
    last = ctx.ledger.attempt(job.id, job.attempt_count) if job.attempt_count else None
    if last is not None and last.host:
        try:
            refresh_from(ctx, job, last.host)
        except GpuqError as exc:  # its host is gone: the copy shipped earlier (if any) is the newest there is
            ctx.ledger.record_event("job", job.id, f"newest checkpoint not copied from {last.host}: {exc}",
                                    unless_repeated=True)
    for name in names:
        place_checkpoint(ctx, job, name, same_on_every_node=True)
