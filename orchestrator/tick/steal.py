"""Work stealing: jobs still waiting in a busy host's inbox move to hosts with slots free now."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.agent.bundle import Bundle
from orchestrator.agent.launcher import attempt_spec, enqueue, ensure_bundle
from orchestrator.core.config import Settings
from orchestrator.core.errors import GpuqError
from orchestrator.core.specs import HostSlots, clamp_slots
from orchestrator.core.states import JobState
from orchestrator.fleet.registry import Fleet
from orchestrator.hosts.base import Host
from orchestrator.ledger import HostRow, Job, Ledger
from orchestrator.scheduling.estimates import EpochRates, estimate_s
from orchestrator.scheduling.gpumatch import need_of, read_facts
from orchestrator.scheduling.stealing import Move, QueuedJob, plan_steals
from orchestrator.tick import budget, withdraw
from orchestrator.tick.probe import Probe


def steal(ledger: Ledger, fleet: Fleet, settings: Settings, probes: Sequence[Probe], rates: EpochRates) -> list[Move]:
    """Move jobs still waiting in a busy host's inbox to hosts with slots free now.

    The source agent withdraws a job by atomic rename out of its inbox; only a job it
    withdrew moves (the ledger records the move in one transaction, then the target gets
    the spec).  A job the source agent claimed meanwhile stays where it is.
    """
    ledger_jobs = {j.id: j for j in ledger.jobs(states=[JobState.ASSIGNED])}
    rows = ledger.hosts()
    queued, slots = _inboxes(rows, {p.host: p for p in probes}, ledger_jobs, settings, rates)
    if len(slots) < 2 or not any(queued.values()):
        return []
    allowed = _allowed_hosts(ledger, rows, ledger_jobs)
    handed = ledger.dependencies(ledger_jobs)  # its dependencies' checkpoints were placed on its host: it stays
    moves = [m for m in plan_steals(queued, slots)
             if m.to_host in allowed[ledger_jobs[m.job_id].sweep_id] and m.job_id not in handed]
    moves = budget.moves_within(ledger, settings, moves, ledger_jobs, rates)  # a capped sweep's dearer moves
    done: list[Move] = []
    by_source: dict[str, list[Move]] = {}
    for move in moves:
        by_source.setdefault(move.from_host, []).append(move)
    for source, group in by_source.items():
        done += _move_from(ledger, fleet, settings, source, group, ledger_jobs)
    return done


def _inboxes(rows: Sequence[HostRow], reports: dict[str, Probe], ledger_jobs: dict[str, Job], settings: Settings,
             rates: EpochRates) -> tuple[dict[str, list[QueuedJob]], list[HostSlots]]:
    """What waits in each reachable host's inbox (jobs the ledger placed there, this attempt), and
    each such host's slots."""
    queued: dict[str, list[QueuedJob]] = {}
    slots: list[HostSlots] = []
    for row in rows:
        if row.kind == "slurm":
            continue  # nothing waits in a Slurm host's inbox (Slurm holds the queue), and its slots are not GPUs
        report = reports.get(row.name)
        if report is not None and report.ok:
            docs = report.document.jobs
            total = clamp_slots(report.document.slots.total)  # bounded at the edge too
            free = min(clamp_slots(report.document.slots.free), total)
        elif report is not None and report.reachable and not row.agent_bundle:
            docs, total = [], clamp_slots(row.slots_total)  # reachable, nothing of ours placed there yet: all idle
            free = total
        else:
            continue  # unreachable hosts neither give nor take work
        entries = []
        for doc in (d for d in docs if d.state == "queued"):  # in the host's order
            job = ledger_jobs.get(doc.job_id)
            if job is None or job.host != row.name or doc.attempt != job.attempt_count:
                continue
            if job.nodes > 1:
                continue  # a node of a multi-node job stays with its gang
            est = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=rates)
            entries.append(QueuedJob(job.id, job.gpus, est, job.host_pin, need=need_of(job.gpu, job.gpu_mem)))
        queued[row.name] = entries
        # busy slots free at an unknown time; only "free now" matters to a steal, so any positive
        # horizon works (a few heartbeats)
        free_at = tuple([0.0] * free + [float(settings.heartbeat_s) * 6] * max(0, total - free))
        models, mem_mib = read_facts(row.gpu_facts)
        slots.append(HostSlots(host=row.name, total=total, slot_free_at=free_at, gpu_models=models,
                               gpu_mem_mib=mem_mib))
    return queued, slots


def _allowed_hosts(ledger: Ledger, rows: Sequence[HostRow], ledger_jobs: dict[str, Job]) -> dict[str, set[str]]:
    """{sweep: the hosts its jobs may move to}: those named at submit, else every remote host (the
    local host takes part only when no remote host is registered)."""
    default = {r.name for r in rows if r.kind != "local"} or {r.name for r in rows}
    allowed: dict[str, set[str]] = {}
    for job in ledger_jobs.values():
        if job.sweep_id not in allowed:
            sweep = ledger.sweep(job.sweep_id)
            allowed[job.sweep_id] = (sweep.host_set() if sweep is not None else set()) or default
    return allowed


def _move_from(ledger: Ledger, fleet: Fleet, settings: Settings, source: str, group: Sequence[Move],
               ledger_jobs: dict[str, Job]) -> list[Move]:
    """Withdraw ``group`` from ``source``'s inbox in one round trip (``tick/withdraw.py``: recorded first);
    each job withdrawn moves."""
    withdrawn = withdraw.withdraw(ledger, fleet, source, [ledger_jobs[m.job_id] for m in group], "steal")
    done = []
    for move in group:
        if move.job_id not in withdrawn:
            continue  # claimed meanwhile: it runs where it is
        if _move_one(ledger, fleet, settings, move, ledger_jobs[move.job_id]):
            done.append(move)
    return done


def _move_one(ledger: Ledger, fleet: Fleet, settings: Settings, move: Move, job: Job) -> bool:
    """Record the move (one transaction), place the bundle if the target lacks it, send the spec."""
    old = ledger.attempt(job.id, job.attempt_count)
    if old is None:
        return False
    target_row = ledger.host(move.to_host)
    bundle_sha = old.bundle_sha
    try:
        target = fleet.named(move.to_host)
        if target_row is not None and target_row.agent_bundle != bundle_sha:
            _ensure_bundle_from_cache(target, bundle_sha, settings)
            ledger.update_host(move.to_host, agent_bundle=bundle_sha)
        attempt = ledger.move_job(job.id, from_attempt=old.number, to_host=move.to_host,
                                  bundle_sha=bundle_sha, message=f"moved unstarted from {move.from_host} to "
                                  f"{move.to_host} (work stealing)")
        spec = attempt_spec(ledger, ledger.job(job.id), attempt, settings, host=move.to_host)  # its host retries too
        enqueue(target, bundle_sha, [spec], settings)
    except GpuqError as exc:
        if ledger.job(job.id).attempt_count == old.number:  # withdrawn, not moved: back to the queue
            withdraw.requeue(ledger, job, old.number, f"withdrawn unstarted from {move.from_host}; not moved to "
                             f"{move.to_host} ({exc}); queued again")
            return False
        ledger.record_event("job", job.id, f"move to {move.to_host} incomplete: {exc}; the next tick "
                            "re-delivers it")
        return False
    return True


def _ensure_bundle_from_cache(host: Host, sha: str, settings: Settings) -> None:
    path = settings.bundle_cache / f"{sha}.tar"
    if not path.is_file():
        raise GpuqError(f"bundle {sha[:12]} is no longer in the local cache; cannot place it on {host.name}")
    ensure_bundle(host, Bundle(sha, path, 0, path.stat().st_size))
