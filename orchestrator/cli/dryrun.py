"""Print ``gpuq submit --dry-run``: a plain aligned table (fast for 10,000 rows), or one JSON document; and
``gpuq submit --smoke``'s table of cells."""

from __future__ import annotations

import shlex
import sys

from orchestrator.api.dryrun import DryRun, DryRunCost
from orchestrator.api.smoke import SmokeResult
from orchestrator.cli.ctx import warn
from orchestrator.views.text import rough_duration

COLUMNS = ("name", "config", "task", "epochs", "gpus", "host", "estimate", "argv")


def _estimate(seconds: float | None, source: str) -> str:
    if seconds is None:
        return source
    return f"{rough_duration(seconds)} ({source})"


def print_dry_run(doc: DryRun, *, as_json: bool) -> None:
    out = sys.stdout
    if as_json:
        out.write(doc.model_dump_json(indent=1) + "\n")
        return
    for warning in doc.warnings:
        warn(warning)
    for line in doc.joined:  # --into: what the sweep already has, and changed lines
        out.write(line + "\n")
    rows = [COLUMNS] + [
        (j.name, j.config or "-", j.task or "-", str(j.epochs or "-"), str(j.gpus),
         j.host or (f"after {','.join(j.after)}" if j.after else "-"),
         _estimate(j.est_s, j.estimate_from), shlex.join(j.argv))
        for j in doc.jobs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]))
    out.write("\n".join(lines) + "\n")
    into = f" would join sweep {doc.into}" if doc.into else ""
    out.write(f"dry run: {len(doc.jobs)} jobs valid{into}; bundle {doc.bundle_sha[:12]} ({doc.bundle_files} files, "
              f"{doc.bundle_bytes} bytes); nothing was written\n")
    out.writelines(dependency_lines(doc))
    if doc.metrics:
        out.write(f"metrics: {doc.metrics}\n")
    if doc.stop:
        out.write(doc.stop + "\n")
    if doc.seeds:
        out.write(doc.seeds + "\n")
    if doc.makespan_s is None:
        out.write("makespan unknown until one job of each config has run\n")
    else:
        out.write(f"projected makespan {rough_duration(doc.makespan_s)}\n")
    cost = doc.cost
    if cost is not None and (cost.budget_usd is not None or len(cost.unpriced) < len(doc.jobs)):  # a price, or a cap
        out.write(cost.summary + "\n")
        if cost.budget_usd is not None:
            out.write(budget_verdict(cost) + "\n")


def dependency_lines(doc: DryRun) -> list[str]:
    """The ``after=`` graph, one line per job that others wait for: ``train → eval, eval-b`` (each placed once
    everything it waits for SUCCEEDED, with its checkpoint handed over)."""
    waiters: dict[str, list[str]] = {}
    for job in doc.jobs:
        for needed in job.after:
            waiters.setdefault(needed, []).append(job.name)
    if not waiters:
        return []
    order = [j.name for j in doc.jobs if j.name in waiters]
    return ["dependencies (after=; each starts once what it waits for SUCCEEDED):\n",
            *(f"  {name} \u2192 {', '.join(waiters[name])}\n" for name in order)]


def budget_verdict(cost: DryRunCost) -> str:
    """Whether the projection fits the sweep's cap, in one line."""
    cap = f"budget ${cost.budget_usd:,.2f}"
    if cost.fits is True:
        return f"{cap}: the projection fits"
    if cost.fits is False:
        return (f"{cap}: the projection does not fit; the jobs it fits start, the rest stay queued until "
                "`gpuq budget SWEEP USD` raises it")
    if cost.why_not:
        return f"{cap}: cannot say whether it fits ({cost.why_not}); jobs start only while it fits their estimates"
    return f"{cap}: the projection may not fit; jobs start only while it fits their estimates, the rest stay queued"


SMOKE_COLUMNS = ("cell", "started", "metrics", "checkpoint", "resumed", "exit", "seconds")


def print_smoke(result: SmokeResult) -> None:
    """``gpuq submit --smoke``: one row per cell, then each failure on its own line."""
    out = sys.stdout
    for warning in result.warnings:
        warn(warning)

    def yes(flag: bool | None) -> str:
        return "?" if flag is None else "yes" if flag else "no"

    rows = [SMOKE_COLUMNS] + [
        (r.cell, yes(r.started), f"{r.metrics} rows" if r.metrics else "no", r.checkpoint or "no",
         yes(r.resumed), "-" if r.exit_code is None else str(r.exit_code), f"{r.seconds:.0f}")
        for r in result.rows
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(SMOKE_COLUMNS))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
    for r in result.rows:
        if r.problem:
            out.write(f"FAILED {r.cell}: {r.problem}\n")
    if result.root:
        out.write(f"the smoke runs are kept for a look in {result.root} (jobs/*/attempts/*/job.log)\n")
    passed = sum(r.ok for r in result.rows)
    out.write(f"smoke: {passed} of {len(result.rows)} cell(s) passed on this machine; nothing was submitted\n")
