"""`gpuq report` reads the sweeps' rows once, the learning curves only of cells whose seeds could be
identical, and the failed jobs' events, pulls and redaction in one go (docs/performance.md, "Results and
report").  The report must be the very one the per-job algorithm built: it is kept here as the oracle and
both are run on a ledger with what every part of the report looks at.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.api import report as rep
from orchestrator.api.jobs import collect_missing, collect_notes, cpu_slots
from orchestrator.api.report_detail import fill_differs, mean_wall, seed_rows
from orchestrator.context import Context
from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.host_documents import Provenance
from orchestrator.ledger import Attempt, HostRow, Job, Metric
from orchestrator.money.cost import job_cost
from orchestrator.report import stats, summary, trust
from orchestrator.report.cells import group
from orchestrator.report.model import CellRow, FailureRow, Report

T0 = 1_700_000_000.0
SECRET = "s3cr3t-t0ken-value"
RUN = '{"metric": "val_acc", "mode": "max", "forward_env": ["GPUQ_SCALE_TOKEN"]}'
H100 = Provenance(slot_kind="gpu", gpu_model="NVIDIA H100", gpu_count=1, torch="2.4").stored()
A100 = Provenance(slot_kind="gpu", gpu_model="NVIDIA A100", gpu_count=1, torch="2.3").stored()
# cell -> seeds' (final, best, curve seed): equal curve seeds give equal curves; None: no curves
CELLS: dict[str, list[tuple[float, float, int | None]]] = {
    "baseline": [(0.80, 0.81, 1), (0.82, 0.83, 2), (0.84, 0.86, 3), (0.81, 0.82, 4)],
    "same": [(0.85, 0.86, 7), (0.85, 0.86, 7), (0.85, 0.86, 7)],  # the trainer ignored its seed
    "tied": [(0.90, 0.91, 8), (0.90, 0.91, 9)],  # the same final value, different curves
    "bare": [(0.70, 0.75, None), (0.70, 0.75, None)],  # the same final value, no curves at all
    "diverged": [(0.30, 0.90, 10), (0.88, 0.89, 11)],
    "single": [(0.95, 0.95, 12)],
    "twin": [(0.60, 0.70, 13), (0.60, 0.70, 13)],  # two seeds, identical
}


def _curve(seed: int) -> list[tuple[str, str, float, int | None, int | None]]:
    return [("curve", name, (seed * 37 + step * k) % 101 / 100, step, None)
            for k, name in ((1, "val_acc"), (3, "loss")) for step in range(0, 50, 10)]


def _job(ctx: Context, job: Job, host: str, state: JobState, *, n: int = 1, provenance: str = "",
         message: str = "", failure_class: str = "") -> None:
    led = ctx.ledger
    led.start_attempt(job.id, host=host, bundle_sha="s")
    led.update_attempt(job.id, n, started_at=T0 + n * 100, ended_at=T0 + n * 100 + 3600, provenance=provenance,
                       message=message)
    led.transition(job.id, AttemptState.RUNNING, attempt=n)
    led.transition(job.id, JobState.RUNNING)
    led.transition(job.id, AttemptState.EXITED, attempt=n)
    led.transition(job.id, state, message=message if state != JobState.SUCCEEDED else "", failure_class=failure_class)


def build(ctx: Context, tmp_path: Path) -> None:
    """Two sweeps of the same cells (merged by name), seeds on two GPU models and a CPU host, failed jobs
    whose class is told by a recent event, by one older than their newest 50, or not at all."""
    led = ctx.ledger
    led.add_host(HostRow(name="gpu1", kind="ssh", target="x", root="/r", slots_kind="gpu", slots_total=4,
                         gpu_count=4, price_per_hour=8.0))
    led.add_host(HostRow(name="cpu1", kind="ssh", target="y", root="/r", slots_kind="cpu", slots_total=4))
    for s, sweep in enumerate(("qscalea", "qscaleb")):
        specs = [JobSpec(name=f"{cell}-seed{k}", config="c.yaml", task="classify", config_sha256="0" * 64,
                         line=1, cell=cell, seed=k, gpus=2 if cell == "tied" else 1)
                 for cell, seeds in CELLS.items() for k in range(len(seeds))
                 if s == 0 or (k < 2 and cell not in ("single", "twin"))]
        specs += [JobSpec(name=f"broken{k}", config="c.yaml", task="classify", config_sha256="0" * 64, line=2,
                          cell="broken") for k in range(3 if s == 0 else 1)]
        jobs = led.add_sweep(sweep_id=sweep, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                             default_retries=0, run=RUN)
        for i, job in enumerate(jobs):
            host = "cpu1" if job.cell == "single" else "gpu1"
            ran = A100 if (job.cell == "diverged" and job.seed == 1) or (s == 1 and job.cell == "baseline") else H100
            ran = "" if host == "cpu1" else ran  # the host's slots say what it ran on
            if job.cell == "broken":
                k = int(job.name[-1])
                why = "config error: never retried" if k == 0 else f"gpu_oom: out of memory (token {SECRET})"
                _job(ctx, job, host, JobState.FAILED, provenance=ran, message=why if k < 2 else "exit 1",
                     failure_class=("config", "gpu_oom", "")[k] if k < 3 else "")
                if k == 1:  # older than the job's newest 50 events: no class found
                    for e in range(55):
                        led.record_event("attempt", f"{job.id}/a1", f"progress {e}")
                if k < 2:
                    local = tmp_path / "pulled" / job.id
                    (local / protocol.ATTEMPTS_DIR / "1").mkdir(parents=True)
                    lines = [f"line {n} {SECRET if n == 15 else ''}" for n in range(20)]
                    (local / protocol.ATTEMPTS_DIR / "1" / protocol.JOB_LOG).write_text("\n".join(lines) + "\n")
                    led.record_pull(job.id, attempt=1, host=host, state="verified", local_dir=str(local))
                continue
            final, best, curve = CELLS[job.cell][job.seed or 0]
            _job(ctx, job, host, JobState.SUCCEEDED, provenance=ran)
            led.record_results(job.id, 1, metrics=[
                ("final", "val_acc", final, 40 + i, 3), ("best", "val_acc", best, 30, 2),
                ("final", "loss", 1 - final, 40, 3), *(_curve(curve) if curve is not None else [])], artifacts=[])


def _like_events(path: Path, subject: str, limit: int) -> list[tuple[str, str, str, str]]:
    """(message, new, failure_class, rule) of the subject's newest events, newest first, as the LIKE prefix
    read them."""
    with sqlite3.connect(path) as raw:
        return raw.execute("SELECT message, new, failure_class, rule FROM event WHERE subject LIKE ? || '%' "
                           "ORDER BY id DESC LIMIT ?", (subject, limit)).fetchall()


def _failure(ctx: Context, job: Job, attempts: Sequence[Attempt], cell: str) -> FailureRow:
    last = attempts[-1] if attempts else None
    message = last.message if last else ""
    klass, reason = "", ""
    for text, new, failure_class, rule in _like_events(ctx.ledger.path, job.id, 50):
        if failure_class and (new == job.state or rule):
            klass, reason = failure_class, text
            break
    text = "; ".join(part for part in (message, reason) if part)
    mark = ctx.ledger.verified_pulls([job.id]).get(job.id)
    return FailureRow(job=job.id, name=job.name, cell=cell, state=job.state, failure_class=klass,
                      message=ctx.ledger.redact(text), log_tail=ctx.ledger.redact(rep._log_tail(mark)))


def oracle(ctx: Context, sweeps: Sequence[str]) -> Report:
    """The report as the per-job algorithm built it (every curve read, each failure read alone)."""
    rows = rep._resolve(ctx, sweeps)
    metric, mode = rep._headline(rows, None, None)
    jobs: list[Job] = []
    for sweep in rows:
        jobs.extend(ctx.ledger.jobs(sweep_id=sweep.id))
    missing = collect_missing(ctx, jobs)
    values: dict[str, dict[str, Metric]] = {}
    for m in ctx.ledger.metrics(j.id for j in jobs):
        if m.name == metric and m.scope in ("final", "best"):
            values.setdefault(m.job_id, {})[m.scope] = m
    attempts: dict[str, list[Attempt]] = {}
    for att in ctx.ledger.attempts_of(j.id for j in jobs):
        attempts.setdefault(att.job_id, []).append(att)
    unread = rep._metrics_problems(ctx, [j for j in jobs if j.state == JobState.SUCCEEDED.value
                                         and j.id not in values])
    cells = group(jobs)
    base_name = rep._baseline(cells, None)
    now = time.time()
    on_cpu = cpu_slots(ctx)
    ran = {j.id: [p for p in (Provenance.from_stored(a.provenance) for a in attempts.get(j.id, [])) if p]
           for j in jobs}
    notes: list[str] = collect_notes(missing) + unread
    out: list[CellRow] = []
    finals_of: dict[str, list[float]] = {}
    same: set[str] = set()
    curves = ctx.ledger.curves(j.id for j in jobs if j.state == JobState.SUCCEEDED.value)
    for name, members in cells.items():
        finished = [j for j in members if j.state == JobState.SUCCEEDED.value and "final" in values.get(j.id, {})]
        finals = [values[j.id]["final"].value for j in finished]
        bests = [values[j.id]["best"].value for j in finished if "best" in values[j.id]]
        steps = [s for s in (values[j.id]["final"].step for j in finished) if s is not None]
        finals_of[name] = finals
        costs = [job_cost(j.gpus * j.nodes, attempts.get(j.id, []), [], now, on_cpu) for j in members]
        priced = [c.cost for c in costs if c.cost is not None]
        mean = stats.mean(finals) if finals else None
        flags = rep._flags(finished, values, mode, finals)  # type: ignore[arg-type]
        if trust.identical([rep._signature(values[j.id], curves.get(j.id, {})) for j in finished]):  # type: ignore[arg-type]
            same.add(name)
            flags.append(trust.IDENTICAL)
        mix = trust.mixed({j.name: ran[j.id] for j in finished})
        flags += [mix] if mix else []
        ci = None if name in same else stats.mean_ci(finals)
        out.append(CellRow(
            cell=name, sweeps=sorted({j.sweep_id for j in members}), jobs=[j.id for j in members],
            names=[j.name for j in members], n_finished=len(finished), n_total=len(members),
            mean=mean, std=stats.std(finals), ci_low=ci.low if ci else None, ci_high=ci.high if ci else None,
            best=(max(bests) if mode == "max" else min(bests)) if bests else None, final=mean,
            steps=max(steps) if steps else None, gpu_hours=sum(c.gpu_hours for c in costs),
            cpu_hours=sum(c.cpu_hours for c in costs),
            cost_usd=sum(priced) if priced else None, is_baseline=name == base_name,
            delta=None, delta_ci_low=None, delta_ci_high=None, p_value=None,
            verdict="no data" if not finished else "no baseline", flags=flags,
            ran_with=trust.lines(p for j in members for p in ran[j.id])))
        out[-1].seeds = seed_rows(members, values, attempts, now)
        out[-1].wall_s = mean_wall(out[-1].seeds)
    rep._compare(out, finals_of, base_name, mode, same)
    rep._against_baseline(out, cells, ran, base_name, same)
    fill_differs(out, cells, rows, base_name, ctx.settings.bundle_cache)
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
    compared = sum(c.p_adjusted is not None for c in out)
    if compared:
        notes.append(f"verdicts are Holm-corrected over {compared} compared cells: p (Holm) decides, "
                     "p is the raw Welch p")
    notes += rep._past_bounds(out, metric)
    cell_of = {j.id: name for name, members in cells.items() for j in members}
    failures = [_failure(ctx, j, attempts.get(j.id, []), cell_of[j.id]) for j in jobs if j.state in rep._FAILED]
    report = Report(
        generated_at=now, sweeps=[rep._sweep_info(s, jobs, attempts) for s in rows], metric=metric,
        mode="max" if mode == "max" else "min", baseline=base_name, finished=finished_n, total=len(jobs),
        partial=any(not JobState(j.state).terminal for j in jobs), cells=out, failures=failures,
        gpu_hours=sum(c.gpu_hours for c in out), cpu_hours=sum(c.cpu_hours for c in out),
        cost_usd=sum(c.cost_usd for c in out if c.cost_usd is not None) if any(c.cost_usd is not None for c in out)
        else None, notes=notes)
    report.headline = summary.headline(report)
    return report


def test_the_report_is_the_one_the_per_job_algorithm_built(ctx: Context, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    build(ctx, tmp_path)
    monkeypatch.setenv("GPUQ_SCALE_TOKEN", SECRET)  # set after the writes: the report redacts as it reads
    monkeypatch.setattr(time, "time", lambda: T0 + 90_000)
    got = rep.build_report(ctx, ["qscalea", "qscaleb"])
    want = oracle(ctx, ["qscalea", "qscaleb"])
    assert got.model_dump() == want.model_dump()
    # the ledger holds what the comparison is about
    cells = {c.cell: c for c in got.cells}
    assert trust.IDENTICAL in cells["same"].flags and trust.IDENTICAL not in cells["tied"].flags
    assert trust.IDENTICAL not in cells["bare"].flags and cells["same"].verdict == "seeds identical"
    assert trust.IDENTICAL in cells["twin"].flags and cells["single"].n_finished == 1
    assert any(f.startswith("diverged:") for f in cells["diverged"].flags)
    assert any(f.startswith("mixed machines") for f in cells["diverged"].flags)
    assert cells["single"].cpu_hours and cells["baseline"].cost_usd and cells["tied"].p_value is not None
    assert sorted((f.name, f.failure_class) for f in got.failures) == [
        ("broken0", "config"), ("broken0", "config"), ("broken1", ""), ("broken2", "")]  # broken1's is too old
    told = {f.name: f for f in got.failures}
    assert "[redacted:GPUQ_SCALE_TOKEN]" in told["broken1"].message
    assert any("[redacted:GPUQ_SCALE_TOKEN]" in line for line in told["broken1"].log_tail)
    assert SECRET not in got.model_dump_json() and told["broken2"].log_tail == []


def test_only_cells_whose_seeds_ended_alike_read_their_curves(ctx: Context, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    build(ctx, tmp_path)
    read: list[list[str]] = []
    curves = ctx.ledger.curves

    def spy(job_ids):  # type: ignore[no-untyped-def]
        ids = list(job_ids)
        read.append(ids)
        return curves(ids)

    monkeypatch.setattr(ctx.ledger, "curves", spy)
    rep.build_report(ctx, ["qscalea", "qscaleb"])
    names = {j.id: j.cell for j in ctx.ledger.jobs()}
    assert [sorted({names[j] for j in ids}) for ids in read] == [["bare", "same", "tied", "twin"]]


def test_each_quantile_is_solved_once(ctx: Context, tmp_path: Path) -> None:
    build(ctx, tmp_path)
    stats.t_quantile.cache_clear()
    rep.build_report(ctx, ["qscalea", "qscaleb"])
    info = stats.t_quantile.cache_info()
    assert info.hits > 0 and info.misses < info.hits + info.misses



def _bisection(p: float, df: float) -> float:
    """``t_quantile`` as it was: plain bisection on t_cdf, every step evaluated (the oracle)."""
    if p < 0.5:
        return -_bisection(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while stats.t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if stats.t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def test_quantiles_are_the_plain_bisections_to_the_last_bit() -> None:
    import random

    rng = random.Random(5)
    cases = [(0.975, float(df)) for df in range(1, 60)] + [(0.025, 7.5), (0.995, 0.4), (0.975, 1e9)]
    cases += [(rng.choice([0.975, 0.95, 0.995, 0.999999, rng.uniform(0.5000001, 0.9999)]),
               rng.choice([rng.uniform(0.2, 5), rng.uniform(1, 60), rng.uniform(60, 1e6)])) for _ in range(400)]
    stats.t_quantile.cache_clear()
    assert [stats.t_quantile(p, df) for p, df in cases] == [_bisection(p, df) for p, df in cases]
