"""``gpuq results`` (table and ``--csv``) and ``gpuq pull`` for people: one row per job.

Costs are ``api.results``' ``JobCost`` (``orchestrator/cost.py``, the policy ``gpuq status`` uses too).
"""

from __future__ import annotations

import csv
import sys
from typing import TYPE_CHECKING

from rich.table import Table

from orchestrator.cli.render import STATE_STYLE, console, escape
from orchestrator.views.text import printable

if TYPE_CHECKING:
    from orchestrator.api import PullReport, ResultRow


def _metric_names(rows: list[ResultRow]) -> list[str]:
    """Every metric a job reported, the sweep's headline metric first (it shows even before any job did)."""
    names: list[str] = [rows[0].metric] if rows and rows[0].metric else []
    for row in rows:
        for name in [*row.final, *row.best]:
            if name not in names:
                names.append(name)
    return names


PULLED_CELL = {"verified": "[green]verified[/]", "missing": "[red]verified, copy missing[/]"}


def results_table(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    table = Table(title=f"results of {rows[0].job.sweep_id}", title_justify="left")
    priced = any(r.cost is not None and r.cost.cost is not None for r in rows)
    lost = any(r.cost is not None and (r.cost.preemptions or r.cost.lost_gpu_hours) for r in rows)
    head = rows[0].metric
    arrow = {"max": " (max)", "min": " (min)"}.get(rows[0].mode, "")
    cols = ["job", "name", "state", *[f"final {n}" for n in names],
            *[f"best {n}{arrow if n == head else ''}" for n in names], "GPU-h"]
    cols += (["cost"] if priced else []) + (["lost GPU-h", "preempted"] if lost else []) + ["pulled"]
    unknown = any(r.error for r in rows)  # a host that could not answer: its rows say so, the others stand
    cols += ["note"] if unknown else []
    for col in cols:
        table.add_column(col, no_wrap=col in ("job", "state", "pulled"))
    for row in rows:
        style = STATE_STYLE.get(row.job.state, "")
        cells = [row.job.id, escape(row.job.name), f"[{style}]{row.job.state}[/]"]
        cells += [f"{row.final[n]:.4f}" if n in row.final else "-" for n in names]
        cells += [f"{row.best[n]:.4f}" if n in row.best else "-" for n in names]
        c = row.cost
        cells.append(f"{c.gpu_hours:.3f}" if c is not None else "-")
        if priced:
            cells.append(f"${c.cost:.2f}" if c is not None and c.cost is not None else "-")
        if lost:
            cells += [f"{c.lost_gpu_hours:.3f}" if c is not None else "-", str(c.preemptions) if c is not None else "-"]
        cells.append(PULLED_CELL.get(row.pulled, "-"))
        if unknown:
            cells.append(f"[yellow]{escape(printable(row.error))}[/]" if row.error else "")
        table.add_row(*cells)
    console().print(table)
    for row in rows:
        if row.restarts_from_scratch:
            console().print(f"[yellow]{row.job.id} {escape(row.job.name)}: {row.restarts_from_scratch} retr"
                            f"{'ies' if row.restarts_from_scratch > 1 else 'y'} restarted from scratch: no file "
                            "matched `checkpoint`[/]")
    total = [r.cost for r in rows if r.cost is not None]
    if total:
        money = [c.cost for c in total if c.cost is not None]
        spent = f", ${sum(money):.2f}" if money else ""
        wasted = sum(c.lost_gpu_hours for c in total)
        console().print(f"total {sum(c.gpu_hours for c in total):.3f} GPU-h{spent}"
                         + (f"; {wasted:.3f} GPU-h lost to preemptions and losses" if wasted else ""))


def results_csv(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    writer = csv.writer(sys.stdout)
    writer.writerow(["job_id", "sweep_id", "name", "task", "epochs", "state", "attempts",
                     *[f"final_{n}" for n in names], *[f"best_{n}" for n in names], "gpu_hours", "cost_usd",
                     "lost_gpu_hours", "preemptions", "pulled", "local_dir", "error"])
    for row in rows:
        j = row.job
        c = row.cost
        writer.writerow([j.id, j.sweep_id, j.name, j.task, j.epochs, j.state, j.attempt_count,
                         *[row.final.get(n, "") for n in names], *[row.best.get(n, "") for n in names],
                         f"{c.gpu_hours:.6f}" if c else "", f"{c.cost:.4f}" if c and c.cost is not None else "",
                         f"{c.lost_gpu_hours:.6f}" if c else "", c.preemptions if c else "",
                         row.pulled, row.local_dir, row.error or ""])


PULL_STYLE = {"verified": "green", "already verified": "green", "incomplete": "yellow", "quarantined": "red",
              "not pulled": "red"}


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def pulled(report: PullReport) -> None:
    """One row per job (state, files, bytes, local dir), then why each unverified job is not."""
    out = console()
    table = Table(title=f"pull of {report.sweep_id}", title_justify="left")
    for col in ("job", "name", "state", "files", "bytes", "local dir"):
        table.add_column(col, no_wrap=col in ("job", "state", "local dir"))
    for item in report.outcomes:
        style = PULL_STYLE.get(item.state, "")
        shown = item.local_dir if item.verified else "-"
        table.add_row(escape(item.job_id), escape(item.name), f"[{style}]{escape(item.state)}[/]",
                      str(item.files) if item.files else "-", _size(item.bytes) if item.bytes else "-",
                      escape(str(shown)))
    out.print(table)
    for item in report.outcomes:
        if item.reason:
            out.print(printable(f"{item.job_id} {item.name}: {item.state}: {item.reason}"), markup=False)
    verified = report.verified
    fresh = [o for o in verified if o.state == "verified"]
    unverified = [o for o in report.outcomes if not o.verified and o.job_id not in report.written_off]
    retry = [o for o in unverified if o.state in ("incomplete", "quarantined")]
    if not verified:
        out.print("nothing was pulled: no job of this sweep has verified results "
                  "(an empty result set is a failure)", style="red")
    summary = (f"{len(verified)} of {len(report.outcomes)} jobs verified ({len(fresh)} just now, "
               f"{_size(sum(o.transferred for o in fresh))} transferred) in {report.results_dir}")
    if retry:
        summary += f"; {len(retry)} to retry: `gpuq pull --sweep {report.sweep_id}` resumes"
    if len(unverified) > len(retry):
        summary += f"; {len(unverified) - len(retry)} not pulled (reasons above)"
    out.print(summary, markup=False)
