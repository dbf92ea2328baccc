"""``gpuq watch``: the tick again and again until the sweep is done, with auto-resume (docs/health.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.api.cloud import resume
from orchestrator.context import Context
from orchestrator.core.states import JobState
from orchestrator.tick import ACTIVE
from orchestrator.tick.budget import stopped
from orchestrator.tick.findings import TickReport
from orchestrator.tick.loop import run_tick


@dataclass
class WatchResult:
    ticks: int = 0
    reason: str = ""
    actions: list[str] = field(default_factory=list)


STRANDED = (JobState.LOST.value, JobState.PREEMPTED.value)


def _sweep_done(ctx: Context, sweep_id: str | None, *, auto_resume: bool = False) -> bool:
    """Every job ended (of the sweep; ``None``: of every sweep); without auto-resume a LOST or PREEMPTED
    job waits for `gpuq resume`, so it ends the watch too."""
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    held = stopped(ctx.ledger, sweep_id)  # a budget-stopped sweep waits for a person, like a stranded job
    return all(JobState(j.state).terminal or (j.state in STRANDED and not auto_resume)
               or (j.sweep_id in held and j.state == JobState.QUEUED.value) for j in jobs)


def watch(ctx: Context, *, sweep: str | None = None, interval_s: float | None = None, max_hours: float = 6.0,
          on_tick: Callable[[TickReport], None] | None = None,
          sleep: Callable[[float], None] = time.sleep, auto_resume: bool = False) -> WatchResult:
    """Tick until the sweep is done (every job ended, or LOST with no retries left) and no down-when-done
    host waits for a retry of its end (tick/billing.py), with per-host backoff for unreachable hosts.
    Without ``sweep``, until every sweep is done, those submitted while it watches too: the unattended
    controller of a machine that stays on (docs/health.md).  A watcher that never exits never
    notifies: it gives up after ``max_hours`` (docs/health.md)."""
    sweep_id = ctx.ledger.resolve_sweep(sweep).id if sweep is not None else None
    if sweep_id is None:
        ctx.ledger.resolve_sweep(None)  # "no sweeps yet" is the user's mistake, said as such
    floor = ctx.settings.patrol_min_interval_s
    deadline = time.monotonic() + max_hours * 3600
    result = WatchResult()
    while True:
        report = run_tick(ctx, honour_backoff=True)
        result.ticks += 1
        if auto_resume and ctx.ledger.jobs(sweep_id=sweep_id, states=[JobState.LOST, JobState.PREEMPTED]):
            resumed = resume(ctx, sweep=sweep_id, tick=False)
            report.actions += [f"{h}: {how}" for h, how in resumed.revived.items()]
            report.actions += [f"{h}: not brought back: {why}" for h, why in resumed.failed.items()]
            if resumed.requeued:
                report.actions.append(f"auto-resume: {len(resumed.requeued)} job(s) continue from their checkpoints")
            if not resumed.requeued and all(j.id in resumed.skipped for j in ctx.ledger.jobs(
                    sweep_id=sweep_id, states=[JobState.LOST, JobState.PREEMPTED])):
                auto_resume = False  # nothing left that may resume: end like a plain watch
        result.actions += report.actions
        if on_tick is not None:
            on_tick(report)
        # a down-when-done host whose end failed for a passing reason is tried again (tick/billing.py):
        # the watch that ends a sweep also stops its billing
        if _sweep_done(ctx, sweep_id, auto_resume=auto_resume) and not report.teardown_pending:
            held = stopped(ctx.ledger, sweep_id)
            done = f"sweep {sweep_id} done" if sweep_id is not None else "every sweep done"
            result.reason = "; ".join(held.values()) if sweep_id is not None and held else (
                f"{done} (but {'; '.join(held.values())})" if held else done)
            return result
        if time.monotonic() > deadline:
            result.reason = f"gave up after {max_hours:g} h; check the sweep by hand (`gpuq status`)"
            return result
        running = bool(ctx.ledger.jobs(sweep_id=sweep_id, states=ACTIVE)) or bool(report.teardown_pending)
        wanted = interval_s if interval_s is not None else (
            ctx.settings.patrol_interval_s if running else ctx.settings.patrol_idle_interval_s)
        sleep(max(floor, wanted))
