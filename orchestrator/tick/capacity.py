"""Placement, first stage: what the scheduler may assume about each host, from the ledger alone."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import datetime, timezone

from orchestrator.core.config import Settings
from orchestrator.core.specs import HostSlots, clamp_slots
from orchestrator.core.states import JobState
from orchestrator.fleet import slurm as slurm_hosts
from orchestrator.ledger import Attempt, HostRow, Job, Ledger
from orchestrator.scheduling.estimates import EpochRates, estimate_s
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed, read_facts
from orchestrator.scheduling.placements import PlanJob
from orchestrator.tick import ACTIVE


def host_capacity(row: HostRow, active: Sequence[Job], attempts: dict[str, Attempt], settings: Settings,
                  rates: EpochRates, now: float) -> HostSlots:
    """What the scheduler may assume about one host, from the ledger alone (no round trip).

    Work already on the host occupies its slots: running jobs until their estimate runs out
    (at least one more heartbeat), then assigned jobs in order behind them.
    """
    total = row.slots_total
    slurm = slurm_hosts.settings_of(row)
    if row.kind == "local" and row.slots_kind != "gpu":  # its agent runs on CPU slots (GPUs win, as there)
        total = settings.local_cpu_slots or os.cpu_count() or 1
    elif slurm is not None:  # a slot is a place in Slurm's queue (the host's job cap); Slurm packs the GPUs
        total = slurm.max_jobs
    free_at = [0.0] * clamp_slots(total)  # the ledger may hold what an older gpuq let a host report
    mine = [j for j in active if j.host == row.name
            or (j.id in attempts and row.name in attempts[j.id].node_hosts()[1:])]  # a node of a multi-node job
    mine.sort(key=lambda j: (j.state != JobState.RUNNING.value, attempts[j.id].created_at if j.id in attempts else 0))
    for job in mine:
        need = 1 if slurm is not None else min(job.gpus, len(free_at))
        if need <= 0:
            continue
        est = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=rates)
        attempt = attempts.get(job.id)
        started = attempt.started_at if attempt is not None else None
        remaining = max(float(settings.heartbeat_s), est - (now - started)) if started else est
        free_at.sort()
        begin = free_at[need - 1]
        for index in range(need):
            free_at[index] = begin + remaining
    reason = ""
    if row.held:  # disk full, failed preflight, Xid: no new work until cleared
        reason = f"held: {row.hold_text}"
    elif row.unreachable_since is not None:
        reason = f"unreachable since {datetime.fromtimestamp(row.unreachable_since, timezone.utc):%Y-%m-%d %H:%M:%SZ}"
    # a Slurm host's GPUs are its compute nodes', which gpuq does not know: it matches no `gpu=` / `gpu_mem=`
    models, mem_mib = read_facts(row.gpu_facts) if slurm is None else (None, None)
    budget = None
    if row.disk_free_bytes is not None:  # what jobs may fill before the host's disk gate refuses them
        gate = max(row.min_free_gb, settings.min_free_gb) * 1e9
        budget = max(0, int(row.disk_free_bytes - gate))
    return HostSlots(host=row.name, total=total, usable=not reason and total > 0, slot_free_at=tuple(free_at),
                     reason=reason, disk_free_bytes=budget, job_slots=1 if slurm is not None else 0,
                     max_gpus=(slurm.gpus_per_node or None) if slurm is not None and slurm.gres else None,
                     max_nodes=max(1, slurm.nodes) if slurm is not None else 1,
                     gang=slurm is None and row.kind != "local", gpu_models=models, gpu_mem_mib=mem_mib)


def plan_job(job_id: str, *, gpus: int, config: str, task: str, epochs: int | None, est_min: float | None,
             host_pin: str | None, rates: EpochRates, ckpt_bytes: dict[str, int] | None = None,
             nodes: int = 1, need: GpuNeed = ANY_GPU) -> PlanJob:
    """``ckpt_bytes``: largest checkpoint seen per config; a job keeps two (latest + best).  ``need``: its
    ``gpu=`` / ``gpu_mem=`` (``gpumatch.need_of``)."""
    est = estimate_s(config=config, task=task, epochs=epochs, est_min=est_min, history=rates)
    return PlanJob(job_id, gpus, est, host_pin, disk_bytes=2 * (ckpt_bytes or {}).get(config, 0), nodes=nodes,
                   need=need)


def capacities(ledger: Ledger, settings: Settings, rows: Sequence[HostRow], rates: EpochRates) -> list[HostSlots]:
    active = ledger.jobs(states=ACTIVE)
    attempts = ledger.latest_attempts(j.id for j in active)
    now = time.time()
    return [host_capacity(row, active, attempts, settings, rates, now) for row in rows]
