"""A sweep's budget as the verbs see it (docs/cost.md): ``gpuq budget SWEEP [USD]`` shows or sets it,
``gpuq submit --budget`` starts only what it fits and ``--dry-run`` projects the cost, ``gpuq resume``
continues a capped sweep's jobs only while it is under its cap.  ``orchestrator/money/budget.py`` decides;
``tick/budget.py`` holds the tick's side."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.context import Context
from orchestrator.core.errors import UsageError
from orchestrator.core.specs import JobSpec, job_id_for
from orchestrator.core.states import JobState
from orchestrator.ledger import HostRow, Job, attempt_price
from orchestrator.money import budget
from orchestrator.money.budget import JobCostInput, Projection, Standing, usd
from orchestrator.scheduling.gpumatch import host_matches, need_of, read_facts
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.tick import budget as tick_budget
from orchestrator.tick.placement import target_rows

NOT_STARTED = (JobState.QUEUED, JobState.PREEMPTED, JobState.LOST)  # what may still start an attempt


@dataclass(frozen=True)
class BudgetView:
    """``gpuq budget SWEEP``: the cap, what was spent and is committed, and what the rest may cost."""

    sweep_id: str
    standing: Standing
    waiting: int  # jobs not started (queued, or preempted/lost awaiting `gpuq resume`)
    remaining: Projection | None  # what they may cost on the sweep's hosts; None when none wait
    note: str = ""  # what a change did ("" when shown only)

    def lines(self) -> list[str]:
        cap = self.standing.cap
        out = [f"sweep {self.sweep_id}: budget {usd(cap) if cap is not None else 'none (no cap)'}",
               f"  spent      {usd(self.standing.spent)}  (attempts so far, at the price each fixed when it "
               "started)",
               f"  committed  {usd(self.standing.committed)}  (placed and running attempts, to their estimates)"]
        if self.standing.placeholders:
            out.append(f"             {self.standing.placeholders} of them without est_min= or history: counted "
                       "at the scheduler's placeholder")
        if cap is not None:
            out.append(f"  used       {self.standing.total / cap:.0%} ({self.standing.level})")
        if self.remaining is not None:
            out.append(f"  remaining  {self.waiting} job(s) not started: {self.remaining.line()}")
        if self.note:
            out.append(self.note)
        return out


def show(ctx: Context, ref: str | None) -> BudgetView:
    sweep = ctx.ledger.resolve_sweep(ref)
    now = tick_budget.standing_of(ctx.ledger, sweep)
    waiting = ctx.ledger.jobs(sweep_id=sweep.id, states=NOT_STARTED)
    remaining = None
    if waiting:
        rows = target_rows(ctx, sorted(sweep.host_set()), {j.host_pin for j in waiting if j.host_pin})
        remaining = _project(ctx, waiting, rows)
    return BudgetView(sweep.id, now, len(waiting), remaining)


def set_cap(ctx: Context, ref: str | None, cap: float | None) -> BudgetView:
    """Set, raise, lower (even below what was spent: dispatch stops) or remove (None) a sweep's cap.  The
    finding that records it starts the sweep's budget alerts over (one warning and one escalation per cap)."""
    if cap is not None and not 0 < cap <= 1e9:
        raise UsageError(f"a budget is a number of dollars above 0 (and at most 1e9), not {cap:g}")
    sweep = ctx.ledger.resolve_sweep(ref)
    was = f"was {usd(sweep.budget_usd)}" if sweep.budget_usd is not None else "had none"
    message = (f"budget of sweep {sweep.id} set to {usd(cap)} ({was})" if cap is not None
               else f"budget of sweep {sweep.id} removed ({was})")
    ctx.ledger.set_sweep_budget(sweep.id, cap, severity="info", rule=budget.RULE, message=message)
    view = show(ctx, sweep.id)
    now = view.standing
    if cap is None:
        note = "no cap: every queued job may start (at the next tick)"
    elif now.level == "stop":
        note = (f"dispatch stops: {usd(now.total)} spent and committed reaches the cap of {usd(cap)}; nothing new "
                "of this sweep starts, running jobs finish")
    else:
        note = (f"{usd(cap - now.total)} left under the cap for jobs not started; queued jobs it fits start "
                "at the next tick (`gpuq status` or `gpuq watch`)")
    resumable = ctx.ledger.jobs(sweep_id=sweep.id, states=[JobState.PREEMPTED, JobState.LOST])
    if resumable and now.level != "stop":
        note += f"; `gpuq resume --sweep {sweep.id}` continues its {len(resumable)} preempted or lost job(s)"
    return BudgetView(view.sweep_id, now, view.waiting, view.remaining, note)


def stopped(ctx: Context, sweep_id: str | None = None) -> dict[str, str]:
    """The sweeps (``sweep_id``'s, or every one) their budget stopped, each with the line saying what to do
    (``tick.budget.stopped``)."""
    from orchestrator.tick.budget import stopped as budget_stopped

    return budget_stopped(ctx.ledger, sweep_id)


def resume_refusals(ctx: Context, jobs: Sequence[Job]) -> dict[str, str]:
    """{job id: why} of the preempted or lost ``jobs`` that `gpuq resume` leaves alone: a resume is a new
    attempt, so a capped sweep's job resumes only while the sweep is under its cap (spent + committed); one
    that resumes still starts only if the cap fits it, as any queued job."""
    out: dict[str, str] = {}
    sweeps = {s.id: s for s in (ctx.ledger.sweep(sid) for sid in sorted({j.sweep_id for j in jobs}))
              if s is not None and s.budget_usd is not None}
    if not sweeps:
        return out
    for sweep_id, now in tick_budget.standings(ctx.ledger, list(sweeps.values()), time.time()).items():
        if now.level != "stop":
            continue
        why = (f"not resumed: sweep {sweep_id} is at its budget ({now.line()}); `gpuq budget {sweep_id} USD` "
               "raises it, then `gpuq resume`")
        out.update({j.id: why for j in jobs if j.sweep_id == sweep_id})
    return out


def admit_submitted(ctx: Context, sweep_id: str, cap: float | None, decided: Plan,
                    plan_jobs: Sequence[PlanJob]) -> tuple[Plan, Mapping[str, str]]:
    """A new capped sweep's plan less what its cap does not fit (they stay QUEUED, each saying why); nothing of it
    while the user's monthly cap (``budget_usd_month``) is spent."""
    month = tick_budget.month_stopped(ctx.ledger, ctx.settings, time.time())
    if month is not None:
        return replace(decided, assignments=()), {a.job_id: month for a in decided.assignments}
    if cap is None:
        return decided, {}
    kept, admitted = tick_budget.admit_plan(ctx.ledger, ctx.settings, sweep_id, Standing(cap), decided,
                                            {p.job_id: p for p in plan_jobs})
    return kept, admitted.held


def admit_joined(ctx: Context, sweep_id: str, decided: Plan,
                 plan_jobs: Sequence[PlanJob]) -> tuple[Plan, Mapping[str, str]]:
    """``submit --into``: the joining jobs' plan less what the sweep's one cap (spent and committed so far
    included) does not fit; nothing of it while the user's monthly cap is spent."""
    month = tick_budget.month_stopped(ctx.ledger, ctx.settings, time.time())
    if month is not None:
        return replace(decided, assignments=()), {a.job_id: month for a in decided.assignments}
    sweep = ctx.ledger.sweep(sweep_id)
    if sweep is None or sweep.budget_usd is None:
        return decided, {}
    standing = tick_budget.standing_of(ctx.ledger, sweep)
    kept, admitted = tick_budget.admit_plan(ctx.ledger, ctx.settings, sweep_id, standing, decided,
                                            {p.job_id: p for p in plan_jobs})
    return kept, admitted.held


def after_submit(ctx: Context, sweep_id: str) -> None:
    """The new sweep's warning when what it placed already reaches 80 % of its cap."""
    sweep = ctx.ledger.sweep(sweep_id)
    if sweep is not None and sweep.budget_usd is not None:
        tick_budget.alert(ctx.ledger, ctx.settings, sweep_id, tick_budget.standing_of(ctx.ledger, sweep))


def projection(ctx: Context, sweep_id: str, specs: Sequence[JobSpec], placements: Mapping[str, str],
               hosts: Sequence[HostRow]) -> Projection:
    """``gpuq submit --dry-run``'s projected cost: each job's duration range (``est_min=``, else the spread of
    the run history) times the price share of the host the plan gives it (``placements``: job id -> host)."""
    rows = {row.name: row for row in hosts}
    history = budget.spreads(ctx.ledger.run_history())
    jobs = []
    for spec in specs:
        host = placements.get(job_id_for(sweep_id, spec.name))
        price = attempt_price(spec.gpus, [rows.get(host)]) if host else None
        jobs.append(JobCostInput(spec.name, [price], budget.duration_range(
            config=spec.config, task=spec.task, epochs=spec.epochs, est_min=spec.est_min, history=history)))
    return budget.project(jobs)


def _project(ctx: Context, jobs: Sequence[Job], rows: Sequence[HostRow]) -> Projection:
    """What jobs not placed yet may cost: each at the cheapest and the dearest price share among the hosts
    it may run on (those of its sweep, or its pin, whose GPUs its ``gpu=``/``gpu_mem=`` take, as the
    scheduler decides: ``gpumatch.host_matches``; none: it is not counted, and the projection says so)."""
    history = budget.spreads(ctx.ledger.run_history())
    by_name = {row.name: row for row in rows}
    facts = {row.name: read_facts(row.gpu_facts) for row in rows}
    items = []
    for job in jobs:
        hosts = [by_name[job.host_pin]] if job.host_pin is not None and job.host_pin in by_name else list(rows)
        need = need_of(job.gpu, job.gpu_mem)
        if need:
            hosts = [row for row in hosts if host_matches(need, *facts[row.name])]
        prices = [attempt_price(job.gpus, [row]) for row in hosts] if hosts or need else [None]
        items.append(JobCostInput(job.name, prices, budget.duration_range(
            config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=history)))
    return budget.project(items)
