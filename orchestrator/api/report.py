"""``gpuq report``: per-cell statistics of one or more sweeps against a baseline (docs/report.md).

Built from the ledger: each SUCCEEDED job's final and best value of the headline metric (from
gpuq's payload or a project's own trainer, whatever wrote the summary), its attempts' GPU-hours
and cost.  The only host contact is ``collect_missing`` (summaries of jobs that finished since the
last tick).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator import observed, protocol
from orchestrator.api.jobs import collect_missing, collect_notes
from orchestrator.context import Context
from orchestrator.cost import job_cost
from orchestrator.errors import GpuqError, UsageError
from orchestrator.ledger import Attempt, Job, Metric, Sweep
from orchestrator.report import stats
from orchestrator.report.cells import group
from orchestrator.report.model import CellRow, FailureRow, Report, SweepInfo, Verdict
from orchestrator.states import JobState

DIVERGED_DROP = 0.20  # a final value worse than the job's own best by more than 20 % of |best|
SEEDS_DISAGREE_CV = 0.10  # seeds whose std exceeds 10 % of |mean|
LOG_TAIL_LINES = 8
# the failure classes of docs/health.md, as the settling decision's reason starts ("config error: never retried")
_CLASSES = ("transient", "config", "divergence", "gpu_oom", "host_oom", "disk_full", "control_plane", "stopped",
            "killed", "vanished", "unknown", "setup")
_CLASS = re.compile(rf"^({'|'.join(_CLASSES)})(?: error)?:|\(class: ([a-z_]+)\)")
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


def _resolve(ctx: Context, refs: Sequence[str]) -> list[Sweep]:
    if not refs:
        return [ctx.ledger.resolve_sweep(None)]
    out: list[Sweep] = []
    for ref in refs:
        sweep = ctx.ledger.resolve_sweep(ref)
        if all(s.id != sweep.id for s in out):
            out.append(sweep)
    return out


def _headline(sweeps: Sequence[Sweep], metric: str | None, mode: str | None) -> tuple[str, str]:
    found = {observed.headline(s.run) for s in sweeps}
    default_metric, default_mode = sorted(found)[0]
    if metric is None and len({m for m, _ in found}) > 1:
        names = ", ".join(f"{s.id}: {observed.headline(s.run)[0]}" for s in sweeps)
        raise UsageError(f"the sweeps report different metrics ({names}); choose one with --metric")
    return metric or default_metric, mode or default_mode


def _metrics_problems(ctx: Context, jobs: Sequence[Job]) -> list[str]:
    """Why succeeded jobs have no metric, as their warnings said (observed.metrics_problem): one line
    per distinct reason with how many jobs it hides, the setting named, never the metric blamed for a
    file that was not there."""
    found = ctx.ledger.open_findings(j.id for j in jobs)
    counts: dict[str, int] = {}
    for job in jobs:
        event = found.get((job.id, observed.METRICS_RULE))
        if event is not None:
            why = event.message.split(": succeeded, but ", 1)[-1]
            counts[why] = counts.get(why, 0) + 1
    return [f"{why} ({n} job{'s' if n != 1 else ''})" for why, n in counts.items()]


def _log_tail(ctx: Context, job: Job) -> list[str]:
    """The last lines of the job's newest log in a pulled copy; none without one."""
    mark = ctx.ledger.verified_pulls([job.id]).get(job.id)
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


def build_report(ctx: Context, sweeps: Sequence[str] = (), *, baseline: str | None = None,
                 metric: str | None = None, mode: str | None = None, collect: bool = True) -> Report:
    rows = _resolve(ctx, sweeps)
    metric, mode = _headline(rows, metric, mode)
    jobs: list[Job] = []
    for sweep in rows:
        jobs.extend(ctx.ledger.jobs(sweep_id=sweep.id))
    missing = collect_missing(ctx, jobs) if collect else {}
    values: dict[str, dict[str, Metric]] = {}
    for m in ctx.ledger.metrics(j.id for j in jobs):
        if m.name == metric and m.scope in ("final", "best"):
            values.setdefault(m.job_id, {})[m.scope] = m
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
    cells = group(jobs)
    base_name = _baseline(cells, baseline)
    now = time.time()
    notes: list[str] = collect_notes(missing) + unread
    out: list[CellRow] = []
    finals_of: dict[str, list[float]] = {}
    for name, members in cells.items():
        finished = [j for j in members if j.state == JobState.SUCCEEDED.value and "final" in values.get(j.id, {})]
        finals = [values[j.id]["final"].value for j in finished]
        bests = [values[j.id]["best"].value for j in finished if "best" in values[j.id]]
        steps = [s for s in (values[j.id]["final"].step for j in finished) if s is not None]
        finals_of[name] = finals
        costs = [job_cost(j.gpus * j.nodes, attempts.get(j.id, []), [], now) for j in members]
        priced = [c.cost for c in costs if c.cost is not None]
        ci = stats.mean_ci(finals)
        mean = stats.mean(finals) if finals else None
        flags = _flags(finished, values, mode, finals)
        out.append(CellRow(
            cell=name, sweeps=sorted({j.sweep_id for j in members}), jobs=[j.id for j in members],
            names=[j.name for j in members], n_finished=len(finished), n_total=len(members),
            mean=mean, std=stats.std(finals), ci_low=ci.low if ci else None, ci_high=ci.high if ci else None,
            best=(max(bests) if mode == "max" else min(bests)) if bests else None, final=mean,
            steps=max(steps) if steps else None, gpu_hours=sum(c.gpu_hours for c in costs),
            cost_usd=sum(priced) if priced else None, is_baseline=name == base_name,
            delta=None, delta_ci_low=None, delta_ci_high=None, p_value=None,
            verdict="no data" if not finished else "no baseline", flags=flags))
    _compare(out, finals_of, base_name, mode)
    finished_n = sum(c.n_finished for c in out)
    if finished_n < len(jobs):
        notes.append(f"{len(jobs) - finished_n} of {len(jobs)} jobs have not finished with the metric "
                     f"{metric!r}: only the {finished_n} finished ones count")
    huge = [c.cell for c in out if (c.n_finished >= 2 and (c.std is None or c.ci_low is None))
            or c.verdict == "cannot compute"]
    if huge:
        notes.append(f"cannot compute the spread, interval or comparison of {', '.join(huge)}: their values "
                     "lie too far apart for floating point (beyond ±1.8e308); the means are shown")
    if base_name is None:
        notes.append("no baseline: name a cell with --baseline (a cell called 'baseline' is chosen by itself)")
    cell_of = {j.id: name for name, members in cells.items() for j in members}
    failures = [_failure(ctx, j, attempts.get(j.id, []), cell_of[j.id]) for j in jobs if j.state in _FAILED]
    return Report(
        generated_at=now, sweeps=[_sweep_info(s, jobs, attempts) for s in rows], metric=metric,
        mode="max" if mode == "max" else "min", baseline=base_name, finished=finished_n, total=len(jobs),
        partial=any(not JobState(j.state).terminal for j in jobs), cells=out, failures=failures,
        gpu_hours=sum(c.gpu_hours for c in out),
        cost_usd=sum(c.cost_usd for c in out if c.cost_usd is not None) if any(c.cost_usd is not None for c in out)
        else None, notes=notes)


def _baseline(cells: dict[str, list[Job]], wanted: str | None) -> str | None:
    if wanted is None:
        return next((name for name in cells if name.lower() == "baseline"), None)
    for name in cells:
        if name.lower() == wanted.lower():
            return name
    raise UsageError(f"--baseline {wanted}: no such cell (cells: {', '.join(sorted(cells))})")


def _flags(finished: Sequence[Job], values: dict[str, dict[str, Metric]], mode: str,
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


def _compare(cells: list[CellRow], finals_of: dict[str, list[float]], base: str | None, mode: str) -> None:
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
        test = stats.welch(finals_of[cell.cell], base_finals)
        if test is None:
            enough = len(finals_of[cell.cell]) >= 2 and len(base_finals) >= 2
            cell.verdict = "cannot compute" if enough else "n too small"
            continue
        cell.delta_ci_low, cell.delta_ci_high, cell.p_value = test.ci.low, test.ci.high, test.p_value
        cell.verdict = _better(test.ci.low, test.ci.high, mode)


def _failure(ctx: Context, job: Job, attempts: Sequence[Attempt], cell: str) -> FailureRow:
    last = attempts[-1] if attempts else None
    message = last.message if last else ""
    klass, reason = "", ""
    for event in reversed(ctx.ledger.events(subject=job.id, limit=50)):  # the newest first
        found = _CLASS.search(event.message)
        if found and (event.new == job.state or "(class:" in event.message):
            klass, reason = found.group(1) or found.group(2), event.message
            break
    text = "; ".join(part for part in (message, reason) if part)
    return FailureRow(job=job.id, name=job.name, cell=cell, state=job.state, failure_class=klass,
                      message=ctx.ledger.redact(text),
                      log_tail=ctx.ledger.redact(_log_tail(ctx, job)))  # host text: no forwarded value


def _sweep_info(sweep: Sweep, jobs: Sequence[Job], attempts: dict[str, list[Attempt]]) -> SweepInfo:
    hosts = sorted({a.host for j in jobs if j.sweep_id == sweep.id for a in attempts.get(j.id, [])})
    return SweepInfo(id=sweep.id, queue=sweep.queue_path, queue_text=sweep.queue_text, bundle_sha=sweep.bundle_sha,
                     created_at=sweep.created_at, hosts=hosts)
