"""Early stopping at the tick (docs/stopping.md): after reconcile, before dispatch.

For each sweep with a ``[stop]`` policy and work left: the running jobs' curves so far (carried by this
tick's probe, ``status --curves-for``) are recorded, each cell's seeds are read at the policy's rungs
(``stopping.progress``, finite values only), and the pure rules (``stopping.rules`` or ``.halving``)
say which looks are due.  Every look is recorded FIRST (``stop_look``: the rung, both cells' values,
the statistic and threshold as fields), THEN each unfinished job of a stopped cell is stopped on its
host through the cancel path and ends STOPPED (``Ledger.transition``; its attempt ends KILLED in the
same transaction).  A look recorded but not carried out (gpuq killed between the two) is carried out by
the next tick: the job's STOPPED state is the gate, so nothing is stopped twice.  The baseline is never
looked at, so never stopped.  Dispatch runs after this stage: a freed slot takes queued work at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.agent import client
from orchestrator.context import Context, host_for
from orchestrator.core.errors import GpuqError, IllegalTransition
from orchestrator.core.states import JobState
from orchestrator.health import observed
from orchestrator.ledger import Job, Ledger, StopLook
from orchestrator.report.cells import group
from orchestrator.stopping import halving, rules
from orchestrator.stopping.policy import StopPolicy, rung_steps
from orchestrator.stopping.progress import Seed, at_rungs
from orchestrator.tick import gangs, host_retries
from orchestrator.tick.findings import TickReport
from orchestrator.tick.probe import Probe
from orchestrator.tick.stoplooks import policy_of, reason

LIVE = (JobState.QUEUED.value, JobState.ASSIGNED.value, JobState.RUNNING.value, JobState.PREEMPTED.value,
        JobState.LOST.value)




def watched(ledger: Ledger, jobs: Iterable[Job]) -> dict[str, StopPolicy]:
    """Sweep id -> its policy, for the sweeps of ``jobs`` that have one."""
    out: dict[str, StopPolicy] = {}
    for sweep_id in sorted({j.sweep_id for j in jobs}):
        policy = policy_of(ledger.sweep(sweep_id))
        if policy is not None:
            out[sweep_id] = policy
    return out


def curves_wanted(active: Sequence[Job], sweeps: Mapping[str, StopPolicy]) -> set[str]:
    """The running jobs whose curves this tick's probe should carry: those of ``sweeps`` (``watched``)."""
    return {j.id for j in active if j.sweep_id in sweeps and j.state == JobState.RUNNING.value}


def record_partials(ledger: Ledger, probes: Sequence[Probe], wanted: set[str]) -> None:
    """The curves so far that this tick's probes carried, into the ledger (a host's numbers: finite and
    bounded at the edge, host_documents)."""
    for probe in probes:
        if not probe.ok:
            continue
        for entry in probe.document.jobs:
            if entry.partial is not None and entry.job_id in wanted:
                curves = {name: [(s, v) for s, v in points] for name, points in entry.partial.curves.items()}
                ledger.record_curves(entry.job_id, entry.partial.attempt, curves)


def stop_stage(ctx: Context, report: TickReport, sweeps: Mapping[str, StopPolicy]) -> None:
    """Looks due in each of ``sweeps`` (``watched`` at the tick's start), recorded; then every recorded stop
    carried out."""
    for sweep_id, policy in sweeps.items():
        jobs = ctx.ledger.jobs(sweep_id=sweep_id)
        cells = group(jobs)
        baseline = next((name for name in cells if name.lower() == policy.baseline.lower()), None)
        if baseline is None:
            continue  # nothing to compare with: nothing is stopped (submit warned)
        looks = ctx.ledger.stop_looks([sweep_id])
        due = decide(ctx.ledger, policy, sweep_id, cells, baseline, looks)
        if due:
            ctx.ledger.record_looks(due)  # the record first: a kill -9 from here on loses no decision
            looks = ctx.ledger.stop_looks([sweep_id])
        carry_out(ctx, cells, baseline, looks, report)


def _seeds(ledger: Ledger, metric: str, jobs: Sequence[Job]) -> dict[str, Seed]:
    curves = ledger.curves(j.id for j in jobs)
    attempts = ledger.latest_attempts(j.id for j in jobs)
    out: dict[str, Seed] = {}
    for job in jobs:
        att = attempts.get(job.id)
        total = att.total_steps if att is not None and att.total_steps else None
        points = tuple(curves.get(job.id, {}).get(metric, ())) if total else ()
        out[job.id] = Seed(job_id=job.id, live=job.state in LIVE, total_steps=total or 1, curve=points)
    return out


def decide(ledger: Ledger, policy: StopPolicy, sweep_id: str, cells: Mapping[str, Sequence[Job]], baseline: str,
           looks: Sequence[StopLook]) -> list[StopLook]:
    """The looks due now, as the ledger's rows (not yet recorded)."""
    sweep = ledger.sweep(sweep_id)
    metric = observed.headline(sweep.run_config() if sweep is not None else None)[0]
    seeds = _seeds(ledger, metric, [j for members in cells.values() for j in members])
    by_cell = {cell: [seeds[j.id] for j in members] for cell, members in cells.items()}
    seen = at_rungs(policy, by_cell)
    looked = {(look.cell, look.rung) for look in looks}
    stopped = {look.cell for look in looks if look.stop}
    if policy.rule == "halving":
        made = halving.decide(policy, baseline, seen, looked, stopped)
    else:
        made = rules.decide(policy, baseline, len(cells) - 1, seen, looked, stopped)
    now = time.time()
    out = []
    for look in made:
        if look.cell == baseline:  # the rules never look at it; this is the last guard before a kill
            continue
        totals = [s.total_steps for s in by_cell[look.cell] if s.curve]
        step = rung_steps(policy, max(totals))[look.rung] if totals else 0
        out.append(StopLook(sweep_id=sweep_id, step=step, decided_at=now, **look.model_dump()))
    return out


def carry_out(ctx: Context, cells: Mapping[str, Sequence[Job]], baseline: str, looks: Sequence[StopLook],
              report: TickReport) -> None:
    """Every unfinished job of a cell with a recorded stop is stopped: on its host when placed there,
    in the ledger alone when it never was; a job already ended is left as it is."""
    stops: dict[str, StopLook] = {}
    for look in looks:
        if look.stop and look.cell != baseline:
            stops.setdefault(look.cell, look)
    by_host: dict[str, list[tuple[Job, StopLook]]] = {}
    for cell, look in stops.items():
        for job in cells.get(cell, ()):
            fresh = ctx.ledger.job(job.id)
            if JobState(fresh.state).terminal:
                continue
            if fresh.host is not None and fresh.attempt_count and fresh.state in (JobState.ASSIGNED.value,
                                                                                   JobState.RUNNING.value):
                by_host.setdefault(fresh.host, []).append((fresh, look))
            else:
                _mark(ctx.ledger, fresh, look, "not running", report)
    for host_name, held in by_host.items():
        _stop_on_host(ctx, host_name, held, report)


def _mark(ledger: Ledger, job: Job, look: StopLook, said: str, report: TickReport) -> None:
    why = reason(look)
    try:
        changed = ledger.transition(job.id, JobState.STOPPED, message=f"{why} ({said})")
    except IllegalTransition:  # it ended meanwhile (another gpuq command recorded it): nothing to stop
        return
    if changed:
        report.actions.append(f"{job.name}: {why}")


def _stop_on_host(ctx: Context, host_name: str, held: Sequence[tuple[Job, StopLook]], report: TickReport) -> None:
    """One cancel call for the host's jobs to stop (the agent's cancel: SIGTERM, the grace for a last
    checkpoint, then the group); a host that does not answer keeps them for the next tick."""
    row = ctx.ledger.host(host_name)
    if row is None:
        return
    jobs = [job for job, _ in held]
    try:
        host = host_for(ctx, row)
        host_retries.before_cancel(ctx.ledger, host, jobs, ctx.settings)  # a host's own retry: recorded first
        verdicts = client.cancel(host, row.agent_bundle, [j.id for j in jobs],
                                 timeout=60 + ctx.settings.kill_grace_s * 2)
    except GpuqError as exc:
        report.actions.append(f"{host_name}: early stop not carried out yet ({' '.join(str(exc).split())}); "
                              "the next tick tries again")
        return
    for job, look in held:
        _mark(ctx.ledger, job, look, verdicts.get(job.id, ""), report)
        attempt = ctx.ledger.attempt(job.id, job.attempt_count)
        if attempt is not None and attempt.nodes:
            parts = [gangs.Part(rank, name, False, None) for rank, name in enumerate(attempt.node_hosts()) if rank > 0]
            gangs.stop_parts(ctx.ledger, ctx.fleet, job, attempt, parts, "it was stopped early")
