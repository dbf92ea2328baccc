"""``seeds=auto`` in the tick (``stopping/seeds.py`` decides; docs/stopping.md, "seeds=auto").

Once every job of a sweep with a ``seeds=auto:MIN..MAX`` line has ended, each cell is judged against the
baseline cell from its seeds' final values of the sweep's headline metric: a cell whose verdict is still
ambiguous, under its line's MAX, gets one more seed (the baseline too when every comparison needs it), as far
as the sweep's budget affords (each seed at its cell's measured cost so far).  The new seed is a QUEUED job
row named ``<cell>-seed<k>`` (``k``: the first index its cell has not used), a copy of the cell's first
seed; the row is the decision's record, written before dispatch places it (this stage runs before
placement, so the same tick starts it).  Its id derives from the sweep and that name, so a tick that
decides again after a crash between deciding and inserting adds the same seed once.  When nothing more
is added, one ``seeds_auto`` finding says why (verdicts clear, MAX reached, the budget, no baseline); the
sweep is then settled and never judged again (``sweeps_done`` waits for it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.context import Context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import JobState
from orchestrator.health import observed
from orchestrator.ledger import Attempt, Job, Ledger, Sweep
from orchestrator.money import budget as money
from orchestrator.money.cost import money_spent
from orchestrator.queue.queuegrid import job_name
from orchestrator.report.cells import group
from orchestrator.stopping.policy import StopPolicy
from orchestrator.stopping.seeds import AutoSeeds, CellSeeds, afford, auto_of, choose, verdicts
from orchestrator.tick import budget
from orchestrator.tick.findings import TickReport

RULE = "seeds_auto"
_WAIT = {JobState.QUEUED.value, JobState.ASSIGNED.value, JobState.RUNNING.value, JobState.PREEMPTED.value}


@dataclass(frozen=True)
class Round:
    """One sweep's decision: the seeds to add (job specs) with why, or the line that settles it."""

    add: tuple[JobSpec, ...] = ()
    why: Mapping[str, str] = field(default_factory=dict)  # job name -> the verdict that called for it
    settled: str = ""  # "" while seeds are added; else why no more will be


def rule_of(sweep: Sweep) -> AutoSeeds:
    """The verdicts' alpha and margin: the sweep's ``[stop]`` policy's when it has one, else the defaults."""
    return auto_of(StopPolicy.model_validate_json(sweep.stop) if sweep.stop else None)


def plan_round(auto: AutoSeeds, jobs: Sequence[Job], finals: Mapping[str, float], cost: Mapping[str, float],
               left: float | None) -> Round | None:
    """The decision for one sweep's ``jobs`` (pure): None while any of them may still run.  ``finals``:
    {job id: its final value of the headline metric}; ``cost``: {job id: dollars it cost}; ``left``: what the
    sweep's cap leaves (None: no cap)."""
    if any(j.state in _WAIT for j in jobs):
        return None
    if any(j.state == JobState.CANCELLED.value for j in jobs):
        return Round(settled="a job of the sweep was cancelled: seeds=auto adds no more seeds")
    if not any(j.id in finals for j in jobs):
        return Round(settled="no seed reported a final value of the sweep's headline metric ([run] metric): "
                             "seeds=auto adds no seeds it could not judge")
    cells = group(list(jobs))
    baseline = next((c for c in cells if c.lower() == "baseline"), None)
    if baseline is None:
        return Round(settled="no cell is named baseline: seeds=auto has nothing to judge against")
    seen = {c: CellSeeds(finals=tuple(finals[j.id] for j in members if j.id in finals), seeds=len(members),
                         most=max(max(j.seeds_max for j in members), len(members))) for c, members in cells.items()}
    chosen = choose(auto, baseline, seen)
    if not chosen:
        return Round(settled=_summary(auto, baseline, seen))
    per_seed = {c: _mean([cost[j.id] for j in cells[c] if j.id in cost]) for c in chosen}
    added, held = afford(chosen, per_seed, left)
    if not added:
        return Round(settled=f"the budget leaves {money.usd(left or 0.0)}, less than one more seed of "
                             f"{', '.join(held)} costs: seeds=auto adds no more seeds")
    taken = {j.name.casefold() for j in jobs}
    specs = [_next_seed(cells[c], c, taken) for c in added]
    why = {s.name: _reason(auto, baseline, s.cell, seen, held) for s in specs}
    return Round(add=tuple(specs), why=why)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _next_seed(members: Sequence[Job], cell: str, taken: set[str]) -> JobSpec:
    """The cell's next seed: its first seed's job with the first seed index whose name the sweep lacks."""
    first = min(members, key=lambda j: (j.seed if j.seed is not None else -1, j.created_at, j.name))
    used = {j.seed for j in members}
    k = len(members)
    while job_name(cell, (f"seed{k}",)).casefold() in taken or k in used:
        k += 1
    name = job_name(cell, (f"seed{k}",))
    taken.add(name.casefold())
    return JobSpec(name=name, config=first.config, task=first.task, epochs=first.epochs or None, gpus=first.gpus,
                   nodes=first.nodes, est_min=first.est_min, seed=k, host=first.host_pin, retries=first.retries,
                   gpu=tuple(g for g in first.gpu.split("|") if g), gpu_mem=first.gpu_mem,
                   config_sha256=first.config_sha256, args=tuple(json.loads(first.args or "[]")), cell=first.cell,
                   seeds_max=max(j.seeds_max for j in members), line=first.line, raw=first.raw)


def _reason(auto: AutoSeeds, baseline: str, cell: str, seen: Mapping[str, CellSeeds], held: Sequence[str]) -> str:
    n = len(seen[cell].finals)
    what = ("every comparison with the baseline is ambiguous" if cell == baseline
            else f"its verdict against {baseline} is ambiguous at alpha={auto.alpha:g}")
    tail = f"; the budget holds {', '.join(held)}" if held else ""
    return f"{what} after {n} finished seed{'s' if n != 1 else ''} (at most {seen[cell].most}){tail}"


def _summary(auto: AutoSeeds, baseline: str, seen: Mapping[str, CellSeeds]) -> str:
    clear = verdicts(auto, baseline, {c: s.finals for c, s in seen.items()})
    done = sorted(c for c, ok in clear.items() if ok)
    at_max = sorted(c for c, ok in clear.items() if not ok)
    parts = [f"clear: {', '.join(done)}"] if done else []
    if at_max:
        parts.append(f"still ambiguous at their most seeds: {', '.join(at_max)}")
    return "seeds=auto is done: " + ("; ".join(parts) or "no cell to compare with the baseline")


def settled(ledger: Ledger, sweep_id: str) -> bool:
    return ledger.latest_finding(sweep_id, RULE) is not None


def add_seeds(ctx: Context, report: TickReport) -> set[str]:
    """The tick's stage: each unsettled ``seeds=auto`` sweep whose jobs have all ended gets its round.
    Returns the sweeps not settled yet (their end is not announced: more seeds may come)."""
    open_: set[str] = set()
    for sweep_id in ctx.ledger.auto_seed_sweeps():
        if settled(ctx.ledger, sweep_id):
            continue
        open_.add(sweep_id)
        sweep = ctx.ledger.sweep(sweep_id)
        jobs = ctx.ledger.jobs(sweep_id=sweep_id)
        if sweep is None or any(j.state in _WAIT for j in jobs):
            continue
        decided = plan_round(rule_of(sweep), jobs, _finals(ctx.ledger, sweep, jobs), *_money(ctx.ledger, sweep, jobs))
        if decided is None:
            continue
        if decided.settled:
            ctx.ledger.record_finding("sweep", sweep_id, severity="info", rule=RULE, message=decided.settled)
            report.actions.append(f"{sweep_id}: {decided.settled}")
            open_.discard(sweep_id)
            continue
        added = ctx.ledger.add_seeds(sweep_id, decided.add, ctx.settings.retries, decided.why)
        for row in added:
            report.actions.append(f"{sweep_id}: seeds=auto added {row.name} ({decided.why[row.name]})")
    return open_


def _finals(ledger: Ledger, sweep: Sweep, jobs: Sequence[Job]) -> dict[str, float]:
    """{job id: its final value of the sweep's headline metric}, a reused job's from the job it reuses."""
    metric, _ = observed.headline(sweep.run_config())
    source = {j.id: j.reused_from or j.id for j in jobs if j.state == JobState.SUCCEEDED.value}
    found = {job_id: value for job_id, scope, _, value, _ in ledger.metric_values(set(source.values()), ("final",),
                                                                                 [metric]) if scope == "final"}
    return {job_id: found[src] for job_id, src in source.items() if src in found}


def _money(ledger: Ledger, sweep: Sweep, jobs: Sequence[Job]) -> tuple[dict[str, float], float | None]:
    """{job id: dollars its attempts cost}, and what the sweep's cap leaves now (None: no cap)."""
    now = time.time()
    by_job: dict[str, list[Attempt]] = {}
    for att in ledger.attempts_of(j.id for j in jobs):
        by_job.setdefault(att.job_id, []).append(att)
    cost = {job_id: spent for job_id, atts in by_job.items()
            if (spent := money_spent(atts, now)) is not None}
    if sweep.budget_usd is None:
        return cost, None
    return cost, max(0.0, sweep.budget_usd - budget.standing_of(ledger, sweep).total)
