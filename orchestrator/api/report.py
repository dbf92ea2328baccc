"""``gpuq report``: per-cell statistics of one or more sweeps against a baseline (docs/report.md).

Built from the ledger: each SUCCEEDED job's final and best value of the headline metric (from
gpuq's payload or a project's own trainer, whatever wrote the summary), its attempts' GPU-hours
and cost.  The only host contact is ``collect_missing`` (summaries of jobs that finished since the
last tick).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from orchestrator.api import stopreport
from orchestrator.api.report_detail import fill_differs, joined_notes, mean_wall, seed_rows
from orchestrator.api.resultrows import collect_notes, collect_or_refuse, cpu_slots, ran_with
from orchestrator.context import Context, ReadContext, gc_paused
from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError, UsageError
from orchestrator.core.states import JobState
from orchestrator.health import observed
from orchestrator.host_documents import Provenance
from orchestrator.money.cost import JobCost, job_cost
from orchestrator.report import stats, summary, trust
from orchestrator.report.cells import group
from orchestrator.report.model import CellRow, FailureRow, Report, SweepInfo, Verdict

if TYPE_CHECKING:  # the ORM's models only as types: the report reads through ledger/reader.py too
    from orchestrator.ledger import Attempt, Job, Pull, Sweep

DIVERGED_DROP = 0.20  # a final value worse than the job's own best by more than 20 % of |best|
SEEDS_DISAGREE_CV = 0.10  # seeds whose std exceeds 10 % of |mean|
LOG_TAIL_LINES = 8
_FAILED = (JobState.FAILED.value, JobState.LOST.value)


def _better(delta_low: float, delta_high: float, mode: str) -> Verdict:
    good_low, good_high = (delta_low, delta_high) if mode == "max" else (-delta_high, -delta_low)
    if good_low > 0:
        return "better"
    if good_high < 0:
        return "worse"
    return "within noise"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _resolve(ctx: Context | ReadContext, refs: Sequence[str]) -> list[Sweep]:
    if not refs:
        return [ctx.ledger.resolve_sweep(None)]
    out: list[Sweep] = []
    for ref in refs:
        sweep = ctx.ledger.resolve_sweep(ref)
        if all(s.id != sweep.id for s in out):
            out.append(sweep)
    return out


def _headline(sweeps: Sequence[Sweep], metric: str | None, mode: str | None) -> tuple[str, str]:
    found = {observed.headline(s.run_config()) for s in sweeps}
    default_metric, default_mode = sorted(found)[0]
    if metric is None and len({m for m, _ in found}) > 1:
        names = ", ".join(f"{s.id}: {observed.headline(s.run_config())[0]}" for s in sweeps)
        raise UsageError(f"the sweeps report different metrics ({names}); choose one with --metric")
    return metric or default_metric, mode or default_mode


def _metrics_problems(ctx: Context | ReadContext, jobs: Sequence[Job]) -> list[str]:
    """Why succeeded jobs have no metric, as their warnings said (observed.metrics_problem): one line
    per distinct reason with how many jobs it hides, the setting named, never the metric blamed for a
    file that was not there."""
    found = ctx.ledger.open_findings(j.id for j in jobs)
    counts: dict[str, int] = {}
    for job in jobs:
        event = found.get((job.id, observed.METRICS_RULE))
        if event is not None:
            why = event.reason
            counts[why] = counts.get(why, 0) + 1
    return [f"{why} ({n} job{'s' if n != 1 else ''})" for why, n in counts.items()]


def _log_tail(mark: Pull | None) -> list[str]:
    """The last lines of the job's newest log in its pulled copy (``mark``: its verified pull); none without one."""
    if mark is None:
        return []
    logs = sorted(Path(mark.local_dir).glob(f"{protocol.ATTEMPTS_DIR}/*/{protocol.JOB_LOG}"),
                  key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1)
    if not logs:
        return []
    with open(logs[-1], "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 16384))
        text = fh.read().decode("utf-8", "replace")
    return [line for line in text.splitlines() if line.strip()][-LOG_TAIL_LINES:]


class Value(NamedTuple):
    """A job's final or best value of the headline metric, and the step it was taken at."""

    value: float
    step: int | None


def build_report(ctx: Context | ReadContext, sweeps: Sequence[str] = (), *, baseline: str | None = None,
                 metric: str | None = None, mode: str | None = None, collect: bool = True) -> Report:
    with gc_paused():  # a few reads of the sweeps' rows, grouped by job: linear in the jobs
        return _build(ctx, sweeps, baseline, metric, mode, collect)


def _build(ctx: Context | ReadContext, sweeps: Sequence[str], baseline: str | None, metric: str | None,
           mode: str | None, collect: bool) -> Report:
    rows = _resolve(ctx, sweeps)
    metric, mode = _headline(rows, metric, mode)
    got = _gather(ctx, rows, metric, collect)
    jobs, values, attempts = got.jobs, got.values, got.attempts
    cells = group(jobs)
    base_name = _baseline(cells, baseline)
    now = time.time()
    on_cpu = cpu_slots(ctx)
    ran = {j.id: [p for p in (ran_with(a.provenance) for a in attempts.get(j.id, [])) if p] for j in jobs}
    done = {name: [j for j in members if j.state == JobState.SUCCEEDED.value and "final" in values.get(j.id, {})]
            for name, members in cells.items()}
    # seeds with different final values never have identical signatures: only the curves of cells whose
    # finished seeds all ended at the same value are read (normally none)
    curves = ctx.ledger.curves(j.id for finished in done.values() if len(finished) >= 2
                               and len({values[j.id]["final"].value for j in finished}) == 1 for j in finished)
    out: list[CellRow] = []
    same: set[str] = set()  # cells whose seeds produced identical curves
    for name, members in cells.items():
        finished = done[name]
        costs = [job_cost(j.gpus * j.nodes, attempts.get(j.id, []), [], now, on_cpu) for j in members]
        identical = trust.identical([_signature(values[j.id], curves.get(j.id, {})) for j in finished])
        if identical:
            same.add(name)
        row = _cell_row(name, members, finished, values, costs, ran, mode, identical=identical,
                        is_baseline=name == base_name)
        row.seeds = seed_rows(members, values, attempts, now)
        row.wall_s = mean_wall(row.seeds)
        out.append(row)
    _compare(out, {name: [values[j.id]["final"].value for j in done[name]] for name in cells}, base_name, mode, same)
    _against_baseline(out, cells, ran, base_name, same)
    fill_differs(out, cells, rows, base_name, ctx.settings.bundle_cache)
    stopreport.mark_stopped(out, stopreport.cell_stops(ctx.ledger, [s.id for s in rows]))
    saved = stopreport.savings(jobs, attempts, now, on_cpu)
    finished_n = sum(c.n_finished for c in out)
    notes = collect_notes(got.missing) + got.unread + _notes(out, len(jobs), finished_n, metric, base_name)
    if saved is not None:
        notes.append(stopreport.saved_line(saved))
    reused = [j for j in jobs if j.reused_from]
    if reused:
        notes.append(f"{len(reused)} of {len(jobs)} jobs reuse the verified results of identical earlier jobs "
                     f"(result cache; not run, no cost): " + ", ".join(f"{j.id} = {j.reused_from}" for j in reused[:5])
                     + (f" and {len(reused) - 5} more" if len(reused) > 5 else ""))
    cell_of = {j.id: name for name, members in cells.items() for j in members}
    notes += joined_notes(ctx.ledger, rows, jobs, cell_of)
    failures = _failures(ctx, [j for j in jobs if j.state in _FAILED], attempts, cell_of)
    report = Report(
        generated_at=now, sweeps=[_sweep_info(s, jobs, attempts) for s in rows], metric=metric,
        mode="max" if mode == "max" else "min", baseline=base_name, finished=finished_n, total=len(jobs),
        partial=any(not JobState(j.state).terminal for j in jobs), cells=out, failures=failures,
        gpu_hours=sum(c.gpu_hours for c in out), cpu_hours=sum(c.cpu_hours for c in out),
        cost_usd=sum(c.cost_usd for c in out if c.cost_usd is not None) if any(c.cost_usd is not None for c in out)
        else None, notes=notes, saved=saved)
    report.headline = summary.headline(report)
    return report


@dataclass
class _Gathered:
    """What the report reads of its sweeps' jobs: their headline values, attempts, and what could not be read."""

    jobs: list[Job]
    values: dict[str, dict[str, Value]]  # job id -> "final" | "best" -> the headline metric's
    attempts: dict[str, list[Attempt]]
    missing: dict[str, str]
    unread: list[str]


def _gather(ctx: Context | ReadContext, rows: Sequence[Sweep], metric: str, collect: bool) -> _Gathered:
    """The jobs of ``rows`` with their values of ``metric`` and their attempts; GpuqError or UsageError when
    no finished job's value can be had (one line saying why)."""
    jobs: list[Job] = []
    for sweep in rows:
        jobs.extend(ctx.ledger.jobs(sweep_id=sweep.id))
    missing = collect_or_refuse(ctx, jobs) if collect else {}
    values: dict[str, dict[str, Value]] = {}
    reusing: dict[str, list[str]] = {}  # the job whose values are read -> the jobs they count for (a reused
    for job in jobs:                    # job's are its twin's: the result cache)
        reusing.setdefault(job.reused_from or job.id, []).append(job.id)
    for job_id, scope, _, value, step in ctx.ledger.metric_values(sorted(reusing), names=[metric]):
        for counted in reusing[job_id]:
            values.setdefault(counted, {})[scope] = Value(value, step)
    attempts: dict[str, list[Attempt]] = {}
    for att in ctx.ledger.attempts_of(j.id for j in jobs):
        attempts.setdefault(att.job_id, []).append(att)
    if jobs and not values and missing and all(j.id in missing for j in jobs if j.state == JobState.SUCCEEDED.value):
        raise GpuqError("no finished job's results could be read: " + "; ".join(collect_notes(missing)))
    unread = _metrics_problems(ctx, [j for j in jobs if j.state == JobState.SUCCEEDED.value and j.id not in values])
    if jobs and not values and any(j.state == JobState.SUCCEEDED.value for j in jobs):
        if unread:
            raise UsageError(f"no finished job of {', '.join(s.id for s in rows)} has a value of {metric!r}: "
                             + "; ".join(unread))
        raise UsageError(f"no finished job of {', '.join(s.id for s in rows)} reported the metric {metric!r}; "
                         "name the one your trainer writes with --metric (gpuq results shows what each job has)")
    return _Gathered(jobs, values, attempts, missing, unread)


def _cell_row(name: str, members: list[Job], finished: list[Job], values: dict[str, dict[str, Value]],
              costs: list[JobCost], ran: dict[str, list[Provenance]], mode: str, *, identical: bool,
              is_baseline: bool) -> CellRow:
    """One cell's row before it is compared with the baseline: its seeds' mean, spread, interval, cost, flags."""
    finals = [values[j.id]["final"].value for j in finished]
    bests = [values[j.id]["best"].value for j in finished if "best" in values[j.id]]
    steps = [s for s in (values[j.id]["final"].step for j in finished) if s is not None]
    priced = [c.cost for c in costs if c.cost is not None]
    mean = stats.mean(finals) if finals else None
    flags = _flags(finished, values, mode, finals)
    if identical:
        flags.append(trust.IDENTICAL)
    mix = trust.mixed({j.name: ran[j.id] for j in finished})
    flags += [mix] if mix else []
    ci = None if identical else stats.mean_ci(finals)
    return CellRow(
        cell=name, sweeps=sorted({j.sweep_id for j in members}), jobs=[j.id for j in members],
        names=[j.name for j in members], n_finished=len(finished), n_total=len(members),
        mean=mean, std=stats.std(finals), ci_low=ci.low if ci else None, ci_high=ci.high if ci else None,
        best=(max(bests) if mode == "max" else min(bests)) if bests else None, final=mean,
        steps=max(steps) if steps else None, gpu_hours=sum(c.gpu_hours for c in costs),
        cpu_hours=sum(c.cpu_hours for c in costs),
        cost_usd=sum(priced) if priced else None, is_baseline=is_baseline,
        delta=None, delta_ci_low=None, delta_ci_high=None, p_value=None,
        verdict="no data" if not finished else "no baseline", flags=flags,
        ran_with=trust.lines(p for j in members for p in ran[j.id]))


def _notes(out: Sequence[CellRow], total: int, finished_n: int, metric: str, base_name: str | None) -> list[str]:
    """What the reader of the table must know: jobs not counted, spreads that cannot be computed, no baseline."""
    notes = []
    if finished_n < total:
        notes.append(f"{total - finished_n} of {total} jobs have not finished with the metric "
                     f"{metric!r}: only the {finished_n} finished ones count")
    for c in out:
        if c.stopped:
            notes.append(f"{c.cell}: {c.stopped} (rung {c.stopped_rung}): mean {c.stopped_mean:.4g} there vs the "
                         f"baseline's {c.stopped_baseline_mean:.4g}; a partial run, no final value (gpuq explain)")
    huge = [c.cell for c in out if (c.n_finished >= 2 and (c.std is None or c.ci_low is None))
            or c.verdict == "cannot compute"]
    if huge:
        notes.append(f"cannot compute the spread, interval or comparison of {', '.join(huge)}: their values "
                     "lie too far apart for floating point (beyond ±1.8e308); the means are shown")
    if base_name is None:
        notes.append("no baseline: name a cell with --baseline (a cell called 'baseline' is chosen by itself)")
    compared = sum(c.p_adjusted is not None for c in out)
    if compared:
        notes.append(f"verdicts are Holm-corrected over {compared} compared cells: p (Holm) decides, "
                     "p is the raw Welch p")
    return notes + _past_bounds(out, metric)


def _past_bounds(out: Sequence[CellRow], metric: str) -> list[str]:
    """A 95% CI past 1 (or below 0) for a metric that cannot leave [0, 1] (an accuracy): said, not hidden."""
    if not summary.bounded(metric):
        return []
    past = [c.cell for c in out if (c.ci_high is not None and c.ci_high > 1) or (c.ci_low is not None and c.ci_low < 0)]
    if not past:
        return []
    return [f"the 95% CI of {', '.join(past)} goes past [0, 1], where {metric!r} lives: few seeds (Student's t) make "
            "the interval wide; read its end as the bound (1 or 0), or run more seeds"]


def _baseline(cells: dict[str, list[Job]], wanted: str | None) -> str | None:
    if wanted is None:
        return next((name for name in cells if name.lower() == "baseline"), None)
    for name in cells:
        if name.lower() == wanted.lower():
            return name
    raise UsageError(f"--baseline {wanted}: no such cell (cells: {', '.join(sorted(cells))})")


def _flags(finished: Sequence[Job], values: dict[str, dict[str, Value]], mode: str,
           finals: Sequence[float]) -> list[str]:
    flags = []
    for job in finished:
        final, best = values[job.id]["final"].value, values[job.id].get("best")
        if best is None:
            continue
        worse_by = (best.value - final) if mode == "max" else (final - best.value)
        if worse_by > DIVERGED_DROP * max(abs(best.value), 1e-12):
            flags.append(f"diverged: {job.name} ended at {_fmt(final)} vs its best {_fmt(best.value)}")
    spread = stats.std(finals)
    if spread is not None and spread > SEEDS_DISAGREE_CV * max(abs(stats.mean(finals)), 1e-12):
        flags.append(f"seeds disagree: std {_fmt(spread)} is over {SEEDS_DISAGREE_CV:.0%} of the mean "
                     f"{_fmt(stats.mean(finals))}")
    return flags


def _signature(value: dict[str, Value], curve: dict[str, list[tuple[int, float]]]) -> trust.Signature:
    return trust.signature([(name, step, v) for name, points in curve.items() for step, v in points],
                           value["final"].value)


def _against_baseline(out: list[CellRow], cells: dict[str, list[Job]], ran: dict[str, list[Provenance]],
                      base: str | None, same: set[str]) -> None:
    """Flags against the baseline: seeds identical there, or other machines or software than here."""
    if base is None:
        return
    base_runs = [p for j in cells[base] for p in ran[j.id]]
    for cell in out:
        if cell.cell == base or cell.n_finished == 0:
            continue
        if base in same:
            cell.flags.append(trust.BASELINE_IDENTICAL)
        unlike = trust.unlike_baseline([p for j in cells[cell.cell] for p in ran[j.id]], base_runs)
        cell.flags += [unlike] if unlike else []


def _compare(cells: list[CellRow], finals_of: dict[str, list[float]], base: str | None, mode: str,
             same: Collection[str] = ()) -> None:
    if base is None:
        return
    base_finals = finals_of[base]
    for cell in cells:
        if cell.cell == base:
            cell.verdict = "baseline"
            continue
        if cell.n_finished == 0:
            continue
        if base_finals:
            delta = stats.mean(finals_of[cell.cell]) - stats.mean(base_finals)
            cell.delta = delta if stats.finite(delta) else None  # beyond the float range: cannot compute
        if cell.cell in same or base in same:  # one run counted n times: no interval, no p-value
            cell.verdict = "seeds identical"
            continue
        test = stats.welch(finals_of[cell.cell], base_finals)
        if test is None:
            enough = len(finals_of[cell.cell]) >= 2 and len(base_finals) >= 2
            cell.verdict = "cannot compute" if enough else "n too small"
            continue
        cell.delta_ci_low, cell.delta_ci_high, cell.p_value = test.ci.low, test.ci.high, test.p_value
        cell.verdict = _better(test.ci.low, test.ci.high, mode)
    _holm(cells)


def _holm(cells: list[CellRow]) -> None:
    """Each compared cell's p Holm-adjusted over all of them; a better or worse verdict whose adjusted p
    is not under 1 - CONFIDENCE becomes "within noise" (docs/report.md)."""
    tested = [c for c in cells if c.p_value is not None and not c.is_baseline]
    for cell, adjusted in zip(tested, stats.holm([c.p_value or 0.0 for c in tested]), strict=True):
        cell.p_adjusted = adjusted
        if cell.verdict in ("better", "worse") and adjusted >= 1.0 - stats.CONFIDENCE:
            cell.verdict = "within noise"


def _failures(ctx: Context | ReadContext, jobs: Sequence[Job], attempts: dict[str, list[Attempt]],
              cell_of: dict[str, str]) -> list[FailureRow]:
    """The failed jobs' rows: why each failed (its last attempt's message and the newest event that
    names a failure class) and its log's tail from a pulled copy, redacted; a few reads for them all."""
    if not jobs:
        return []
    told = ctx.ledger.events_of((j.id for j in jobs), limit=50)
    pulled = ctx.ledger.verified_pulls(j.id for j in jobs)
    found: list[tuple[Job, str, str]] = []
    texts: list[str] = []
    tails: list[list[str]] = []
    for job in jobs:
        last = attempts[job.id][-1] if attempts.get(job.id) else None
        klass, reason = "", ""
        for event in reversed(told.get(job.id, [])):  # the newest first
            if event.failure_class and (event.new == job.state or event.rule):  # a decision, or "ended badly"
                klass, reason = event.failure_class, event.message
                break
        found.append((job, cell_of[job.id], klass))
        texts.append("; ".join(part for part in (last.message if last else "", reason) if part))
        tails.append(_log_tail(pulled.get(job.id)))
    clean_texts, clean_tails = ctx.ledger.redact([texts, tails])  # host text: no forwarded value
    return [FailureRow(job=job.id, name=job.name, cell=cell, state=job.state, failure_class=klass, message=text,
                       log_tail=tail)
            for (job, cell, klass), text, tail in zip(found, clean_texts, clean_tails, strict=True)]


def _sweep_info(sweep: Sweep, jobs: Sequence[Job], attempts: dict[str, list[Attempt]]) -> SweepInfo:
    hosts = sorted({a.host for j in jobs if j.sweep_id == sweep.id for a in attempts.get(j.id, [])})
    return SweepInfo(id=sweep.id, queue=sweep.queue_path, queue_text=sweep.queue_text, bundle_sha=sweep.bundle_sha,
                     created_at=sweep.created_at, hosts=hosts, git_commit=sweep.git_commit or None,
                     git_dirty=sweep.git_dirty)
