"""``status``/``wait``: one controller tick (probe, reconcile, collect, steal, dispatch), then a snapshot."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from orchestrator import controller
from orchestrator.api.context import Context, host_for
from orchestrator.api.submit import _target_rows
from orchestrator.bundle import Bundle
from orchestrator.errors import GpuqError
from orchestrator.ledger import Attempt, Job, Sweep
from orchestrator.ledger import Host as HostRow
from orchestrator.scheduler import EpochRates, epoch_rates
from orchestrator.states import JobState


@dataclass
class Snapshot:
    generated_at: float
    hosts: list[HostRow]
    probes: dict[str, controller.Probe]
    sweeps: list[Sweep]
    jobs: list[Job]
    attempts: dict[str, Attempt]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)


def tick(ctx: Context) -> dict[str, controller.Probe]:
    """Probe every host once (in parallel), reconcile the ledger, collect results, move waiting
    jobs to idle hosts, and dispatch jobs still QUEUED."""
    active: dict[str, list[str]] = {}
    for job in ctx.ledger.jobs(states=controller.ACTIVE):
        active.setdefault(job.host or "", []).append(job.id)
    triples = [(host_for(ctx, row), row.agent_bundle, active.get(row.name, [])) for row in ctx.ledger.hosts()]
    probes = controller.probe_all(triples, ctx.settings)
    by_name = {h.name: (h, sha) for h, sha, _ in triples}
    for report in probes:
        host, sha = by_name[report.host]
        if not report.ok:
            row = ctx.ledger.host(report.host)
            if report.reachable:
                ctx.ledger.update_host(report.host, last_probe_at=time.time(), unreachable_since=None)
            elif report.round_trips and row is not None and row.unreachable_since is None:
                ctx.ledger.update_host(report.host, unreachable_since=time.time())
                ctx.ledger.record_event("host", report.host, f"unreachable: {report.error}")
            continue
        done = controller.reconcile(ctx.ledger, host, ctx.settings, report)
        try:
            controller.collect(ctx.ledger, host, sha, done, report)
        except GpuqError as exc:  # results are collected again by `gpuq results`; never fail a tick
            ctx.ledger.record_event("host", host.name, f"collecting results failed: {exc}", unless_repeated=True)
    # placement needs the run history (one join over every finished attempt): read it only when
    # some inbox holds waiting jobs (work stealing) or the ledger holds QUEUED ones
    waiting = any(j.get("state") == "queued" for p in probes if p.ok for j in p.doc.get("jobs", []))
    queued = ctx.ledger.jobs(states=[JobState.QUEUED])
    if waiting or queued:
        rates = epoch_rates(ctx.ledger.run_history())
        if waiting:
            controller.steal(ctx.ledger, ctx.fleet, ctx.settings, probes, rates)
        if queued:
            _dispatch_queued(ctx, rates, queued)
    return {p.host: p for p in probes}


def _dispatch_queued(ctx: Context, rates: EpochRates, queued: list[Job]) -> None:
    """Place QUEUED jobs (a submit killed after its ledger write, or a host left out at submit)."""
    for sweep_id in sorted({j.sweep_id for j in queued}):
        sweep = ctx.ledger.sweep(sweep_id)
        if sweep is None:
            continue
        bundle_path = ctx.settings.bundle_cache / f"{sweep.bundle_sha}.tar"
        if not bundle_path.is_file():
            ctx.ledger.record_event("sweep", sweep_id, "bundle missing from the cache; cannot launch queued jobs",
                                    unless_repeated=True)
            continue
        bundle = Bundle(sweep.bundle_sha, bundle_path, 0, bundle_path.stat().st_size)
        jobs = {j.id: j for j in queued if j.sweep_id == sweep_id}
        ckpt = ctx.ledger.checkpoint_bytes_by_config()
        plan_jobs = [controller.plan_job(j.id, gpus=j.gpus, config=j.config, task=j.task, epochs=j.epochs,
                                         est_min=j.est_min, host_pin=j.host_pin, rates=rates, ckpt_bytes=ckpt)
                     for j in jobs.values()]
        rows = _target_rows(ctx, sorted(sweep.host_set()), {j.host_pin for j in jobs.values() if j.host_pin})
        try:
            decided, _ = controller.plan_and_push(ctx.ledger, ctx.fleet, ctx.settings, plan_jobs, rows, bundle,
                                                  rates)
        except GpuqError as exc:
            ctx.ledger.record_event("sweep", sweep_id, f"cannot place queued jobs yet: {exc}", unless_repeated=True)
            continue
        for job_id, why in decided.unplaced:
            ctx.ledger.record_event("job", job_id, f"still queued: {why}", unless_repeated=True)
        failed = controller.deliver(ctx.ledger, ctx.fleet, ctx.settings, decided, jobs, bundle.sha256)
        for name, err in failed.items():
            ctx.ledger.record_event("sweep", sweep_id, f"delivery to {name} failed: {err}", unless_repeated=True)


def status(ctx: Context, *, sweep: str | None = None, probe: bool = True, all_jobs: bool = False) -> Snapshot:
    """Tick, then a snapshot: every sweep's counts, and the jobs worth showing.

    Jobs shown: the given sweep's; else every sweep with unfinished jobs (or the newest sweep
    when all are finished); ``all_jobs`` shows the whole history.
    """
    probes = tick(ctx) if probe else {}
    counts = ctx.ledger.state_counts()
    sweep_rows = ctx.ledger.sweeps()
    if sweep is not None:
        shown = {ctx.ledger.resolve_sweep(sweep).id}
    elif all_jobs:
        shown = {s.id for s in sweep_rows}
    else:
        shown = {sid for sid, states in counts.items() if any(not JobState(st).terminal for st in states)}
        if not shown and sweep_rows:
            shown = {sweep_rows[-1].id}
    order = {row.id: index for index, row in enumerate(sweep_rows)}
    jobs = [j for sid in sorted(shown, key=order.__getitem__) for j in ctx.ledger.jobs(sweep_id=sid)]
    latest = ctx.ledger.latest_attempts(j.id for j in jobs)
    return Snapshot(time.time(), ctx.ledger.hosts(), probes, sweep_rows, jobs, latest, counts=counts)


def wait(ctx: Context, *, sweep: str | None = None, interval_s: float = 2.0,
         timeout_s: float | None = None) -> Snapshot:
    """Tick until every job of the sweep is terminal (or LOST)."""
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        snap = status(ctx, sweep=sweep_id)
        if all(JobState(j.state).terminal or j.state == JobState.LOST.value for j in snap.jobs):
            return snap
        if deadline is not None and time.monotonic() > deadline:
            raise GpuqError(f"sweep {sweep_id} still running after {timeout_s:.0f} s; `gpuq status` to follow it")
        time.sleep(interval_s)
