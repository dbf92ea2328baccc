"""Placement: plan → push the bundle (preflight fresh hosts) → deliver; the hosts a sweep may use."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.agent.bundle import Bundle
from orchestrator.agent.launcher import deliver_all, push_all
from orchestrator.context import Context
from orchestrator.core.config import LOCAL_HOST, Settings
from orchestrator.fleet import slurm as slurm_hosts
from orchestrator.fleet.registry import Fleet
from orchestrator.hosts.local import gpu_count as local_gpu_count
from orchestrator.hosts.local import gpus as local_gpus
from orchestrator.ledger import HostRow, Job, Ledger
from orchestrator.scheduling.estimates import EpochRates
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed, facts_json, strictest
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.tick import ACTIVE, gangs
from orchestrator.tick.capacity import capacities
from orchestrator.tick.preflight import needs_preflight, preflight_all


def plan_and_push(ledger: Ledger, fleet: Fleet, settings: Settings, jobs: Sequence[PlanJob],
                  rows: Sequence[HostRow], bundle: Bundle, rates: EpochRates,
                  pushed: list[str] | None = None) -> tuple[Plan, dict[str, str]]:
    """Plan, then place the bundle on every host that got work.  A host whose push fails is
    dropped and the jobs are planned again without it (once per failing host).

    Returns the final plan and {host: why it was dropped}; ``pushed`` collects the hosts that
    received the bundle's bytes (the others had it already).
    """
    dropped: dict[str, str] = {}
    while True:
        slots = [
            s if s.host not in dropped else s.model_copy(update={"usable": False, "reason": dropped[s.host]})
            for s in capacities(ledger, settings, rows, rates)
        ]
        decided = plan(jobs, slots)
        targets = sorted({n for a in decided.assignments for n in (a.host, *a.peers)} - set(dropped))
        failed = push_all([fleet.named(name) for name in targets], bundle, pushed)
        for name in targets:
            if name not in failed:
                ledger.update_host(name, agent_bundle=bundle.sha256)
        dropped.update({name: f"bundle push failed: {err}" for name, err in failed.items()})
        if settings.preflight:  # a host's first job waits for its GPU preflight (docs/health.md)
            fresh = [name for name in targets if name not in failed and needs_preflight(ledger.host(name))]
            needs = _host_needs(decided, jobs)
            for name, verdict in preflight_all(ledger, fleet, settings, fresh, bundle.sha256, needs).items():
                if verdict.verdict == "fail":
                    dropped[name] = f"failed its GPU preflight: {verdict.detail}"
                elif verdict.verdict == "mismatch":
                    dropped[name] = f"its GPUs are not what the jobs planned there need: {verdict.detail}"
                elif verdict.verdict == "unreachable":
                    dropped[name] = f"unreachable for its GPU preflight: {verdict.detail}"
        if not set(dropped) & set(targets):
            return decided, dropped



def _host_needs(decided: Plan, jobs: Sequence[PlanJob]) -> dict[str, GpuNeed]:
    """What the jobs ``decided`` puts on each host ask of its GPUs, as one ask (``gpumatch.strictest``)."""
    need = {j.job_id: j.need for j in jobs}
    asks: dict[str, list[GpuNeed]] = {}
    for a in decided.assignments:
        for name in (a.host, *a.peers):
            asks.setdefault(name, []).append(need.get(a.job_id, ANY_GPU))
    return {name: strictest(found) for name, found in asks.items()}


def deliver(ledger: Ledger, fleet: Fleet, settings: Settings, decided: Plan, jobs: dict[str, Job],
            bundle_sha: str) -> dict[str, str]:
    """Record attempts and enqueue every assignment of ``decided``, hosts in parallel.  A multi-node
    job goes out only when all its nodes start now (gangs.hold_back); its parts go to every node host."""
    decided, waiting = gangs.hold_back(decided)
    for job_id, why in waiting:
        ledger.record_event("job", job_id, f"still queued: {why}", unless_repeated=True)
    by_host: dict[str, list[Job]] = {}
    multi = [a for a in decided.assignments if a.peers]
    for assignment in decided.assignments:
        if not assignment.peers:
            by_host.setdefault(assignment.host, []).append(jobs[assignment.job_id])
    for name, group in by_host.items():
        row = ledger.host(name)
        slurm = slurm_hosts.settings_of(row) if row is not None else None
        if slurm is not None:  # a Slurm host's queue is Slurm's: send no more than its cap, the rest stay QUEUED
            held = sum(1 for j in ledger.jobs(states=ACTIVE) if j.host == name and j.id not in jobs)
            by_host[name] = group[:max(0, slurm.max_jobs - held)]
    hosts = {name: fleet.named(name) for name in by_host}
    failed = deliver_all(ledger, hosts, bundle_sha, by_host, settings)
    for name, err in gangs.deliver(ledger, fleet, settings, multi, jobs, bundle_sha).items():
        failed[name] = f"{failed[name]}; {err}" if name in failed else err
    return failed


def target_rows(ctx: Context, hosts: Sequence[str], pins: set[str]) -> list[HostRow]:
    """Hosts a submit may use: the named ones; else every remote host (local only when none is
    registered); plus any host a queue line pins with ``host=``."""
    remote = ctx.fleet.remote_rows()
    if hosts:
        names = list(dict.fromkeys(hosts))
    elif remote:
        names = [row.name for row in remote]
    else:
        names = [LOCAL_HOST]
    names += sorted(pins - set(names))
    rows = []
    for name in names:
        row = ctx.ledger.host(name)
        if row is None and name == LOCAL_HOST:  # registered by its first real use, never by a dry run
            gpus = local_gpu_count()  # before its first probe, what its agent will find: GPUs win
            found = local_gpus() if gpus else []  # their models and memory, for `gpu=` / `gpu_mem=`
            row = HostRow(name=LOCAL_HOST, kind="local", root=str(ctx.settings.local_host_root), created_at=0.0,
                          slots_kind="gpu" if gpus else "", slots_total=gpus,
                          gpu_facts=facts_json(found) if len(found) == gpus else "")
        if row is not None:
            rows.append(row)
    return rows
