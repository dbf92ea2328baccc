"""Dispatch: place QUEUED jobs (a submit killed after its ledger write, a host left out at submit, a
job requeued by the patrol, a job its sweep's budget held back, a job whose dependencies just SUCCEEDED),
with their checkpoints placed first (a resume's own, a dependency's: ``tick/handover.py``); a capped
sweep's jobs only while its budget fits them (``tick/budget.py``); a job that still waits for another
(``after=``) never (``tick/waiting.py``), and the jobs others wait for first, longest chain first.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from orchestrator.agent.bundle import Bundle
from orchestrator.context import Context
from orchestrator.core.errors import GpuqError
from orchestrator.health.setup_holds import held_bundles, is_held
from orchestrator.ledger import Dependency, Job, Sweep
from orchestrator.money.budget import hold_reason
from orchestrator.scheduling.chains import critical_first
from orchestrator.scheduling.estimates import EpochRates
from orchestrator.scheduling.gpumatch import need_of
from orchestrator.scheduling.placements import Plan
from orchestrator.tick import budget, multinode, waiting
from orchestrator.tick.capacity import plan_job
from orchestrator.tick.checkpoints import place_checkpoint
from orchestrator.tick.handover import hand_over
from orchestrator.tick.placement import deliver, plan_and_push, target_rows


def _with_checkpoints(ctx: Context, decided: Plan, jobs: dict[str, Job],
                      edges: Mapping[str, list[Dependency]]) -> Plan:
    """A job resuming on a host that lacks its newest checkpoint gets the controller's verified copy
    first, a job that waited its dependencies' (``edges``: ``hand_over``); a job whose copy cannot be placed
    waits (QUEUED) for the next tick."""
    keep = []
    for assignment in decided.assignments:
        job = jobs[assignment.job_id]
        if job.id in edges:
            try:
                for name in (assignment.host, *assignment.peers):
                    hand_over(ctx, job, name, edges[job.id])
            except GpuqError as exc:
                ctx.ledger.record_event("job", job.id, f"still queued: the checkpoint of what it waited for is not "
                                        f"placed on {assignment.host}: {exc}", unless_repeated=True)
                continue
        if job.attempt_count == 0:
            keep.append(assignment)
            continue
        try:
            if assignment.peers:
                multinode.place_on_every_node(ctx, job, [assignment.host, *assignment.peers])
            else:
                place_checkpoint(ctx, job, assignment.host)
            keep.append(assignment)
        except GpuqError as exc:
            ctx.ledger.record_event("job", job.id, f"checkpoint not placed on {assignment.host}: {exc}",
                                    unless_repeated=True)
    return replace(decided, assignments=tuple(keep))


def dispatch_queued(ctx: Context, rates: EpochRates, queued: list[Job]) -> None:
    """Place QUEUED jobs: a submit killed after its ledger write, a host left out at submit, or a
    job requeued by the patrol (preferring the host that holds its checkpoint).  Nothing starts while the user's
    monthly cap (``budget_usd_month``) is spent."""
    month = budget.month_stopped(ctx.ledger, ctx.settings, time.time()) if queued else None
    if month is not None:
        ctx.ledger.record_events("job", {j.id: f"still queued: {month}" for j in queued})
        return
    gated = waiting.gate(ctx, queued)
    queued, edges = gated.ready, ctx.ledger.dependencies(j.id for j in gated.ready)
    for sweep_id in sorted({j.sweep_id for j in queued}):
        sweep = ctx.ledger.sweep(sweep_id)
        if sweep is None:
            continue
        mine = [j for j in queued if j.sweep_id == sweep_id]
        bundles = ctx.ledger.part_bundles(sweep_id) if any(j.part != 1 for j in mine) else {}
        for part in sorted({j.part for j in mine}):  # each part's jobs run with its own bundle (submit --into)
            _dispatch_part(ctx, rates, sweep, bundles.get(part) or sweep.bundle_sha,
                           {j.id: j for j in mine if j.part == part}, gated, edges)


def _dispatch_part(ctx: Context, rates: EpochRates, sweep: Sweep, bundle_sha: str, jobs: dict[str, Job],
                   gated: waiting.Gate, edges: Mapping[str, list[Dependency]]) -> None:
    """Place the QUEUED ``jobs`` of one part of ``sweep`` with that part's bundle (the jobs others wait for first,
    ``gated``: the dependency gate's split; ``edges``: what each placeable job waited for)."""
    sweep_id = sweep.id
    bundle_path = ctx.settings.bundle_cache / f"{bundle_sha}.tar"
    if not bundle_path.is_file():
        ctx.ledger.record_event("sweep", sweep_id, "bundle missing from the cache; cannot launch queued jobs",
                                unless_repeated=True)
        return
    bundle = Bundle(bundle_sha, bundle_path, 0, bundle_path.stat().st_size)
    capped = budget.standing_of(ctx.ledger, sweep, rates) if sweep.budget_usd is not None else None
    if capped is not None and capped.level == "stop":  # nothing new of it starts: no plan, no push
        budget.hold(ctx.ledger, ctx.settings, sweep_id, capped, dict.fromkeys(jobs, hold_reason(sweep_id, capped)))
        return
    ckpt = ctx.ledger.checkpoint_bytes_by_config()
    rows = target_rows(ctx, sorted(sweep.host_set()), {j.host_pin for j in jobs.values() if j.host_pin})
    holds = held_bundles(ctx.ledger, [r.name for r in rows])
    rows = [r for r in rows if not is_held(holds, r.name, bundle_sha)]  # its setup failed there
    usable = {r.name for r in rows if not r.held and r.unreachable_since is None}
    plan_jobs = []
    for j in [*jobs.values(), *(w for w in gated.waiting if w.sweep_id == sweep_id)]:  # waiting: estimates only
        # a requeued job resumes from the checkpoint on its last host: stay there while it is usable
        pin = j.host_pin or (j.host if j.attempt_count and j.host in usable else None)
        plan_jobs.append(plan_job(j.id, gpus=j.gpus, config=j.config, task=j.task, epochs=j.epochs,
                                  est_min=j.est_min, host_pin=pin, rates=rates, ckpt_bytes=ckpt,
                                  nodes=j.nodes, need=need_of(j.gpu, j.gpu_mem)))
    plan_jobs, _ = critical_first(plan_jobs, gated.needs, set(jobs))
    try:
        decided, _ = plan_and_push(ctx.ledger, ctx.fleet, ctx.settings, plan_jobs, rows, bundle, rates)
    except GpuqError as exc:
        ctx.ledger.record_event("sweep", sweep_id, f"cannot place queued jobs yet: {exc}", unless_repeated=True)
        return
    for job_id, why in decided.unplaced:
        ctx.ledger.record_event("job", job_id, f"still queued: {why}", unless_repeated=True)
    if capped is not None:
        decided, _ = budget.admit_plan(ctx.ledger, ctx.settings, sweep_id, capped, decided,
                                       {p.job_id: p for p in plan_jobs})
    decided = _with_checkpoints(ctx, decided, jobs, edges)
    failed = deliver(ctx.ledger, ctx.fleet, ctx.settings, decided, jobs, bundle.sha256)
    for name, err in failed.items():
        ctx.ledger.record_event("sweep", sweep_id, f"delivery to {name} failed: {err}", unless_repeated=True)
