"""``gpuq results`` (table and ``--csv``) and ``gpuq pull`` for people: one row per job (past a
screenful of jobs the table is plain aligned text: ``orchestrator/cli/plaintable.py``).

Costs are ``api.results``' ``JobCost`` (``orchestrator/money/cost.py``, the policy ``gpuq status`` uses too).
rich is imported by the tables only: ``--csv`` and ``--json`` go without it.
"""

from __future__ import annotations

import csv
import sys
from typing import TYPE_CHECKING

from orchestrator.host_documents import Summary
from orchestrator.views.text import printable

if TYPE_CHECKING:
    from orchestrator.api import PullReport, ResultRow
    from orchestrator.cli.plaintable import Cell, Line


def _metric_names(rows: list[ResultRow]) -> list[str]:
    """Every metric a job reported, the sweep's headline metric first (it shows even before any job did)."""
    names: list[str] = [rows[0].metric] if rows and rows[0].metric else []
    for row in rows:
        for name in [*row.final, *row.best]:
            if name not in names:
                names.append(name)
    return names


def _way(rows: list[ResultRow], name: str) -> str:
    """" (max)" / " (min)": the direction each metric's own best was taken by (none for a name that says neither)."""
    from orchestrator.health.observed import direction

    head = rows[0]
    if name == head.metric:
        return " (min)" if head.mode == "min" else " (max)"
    way = direction(name, Summary(metric=head.metric, mode=head.mode))
    return f" ({way})" if way else ""


PULLED_CELL = {"verified": ("verified", "green"), "missing": ("verified, copy missing", "red")}


def result_cells(rows: list[ResultRow]) -> tuple[list[str], list[list[Cell]], list[Line]]:
    """The table of ``gpuq results``: its columns, a row of cells per job (printable text and a style,
    never markup), and the lines below it (retries that restarted from scratch, the total)."""
    from orchestrator.cli.render import STATE_STYLE

    names = _metric_names(rows)
    priced = any(r.cost is not None and r.cost.cost is not None for r in rows)
    lost = any(r.cost is not None and (r.cost.preemptions or r.cost.lost_gpu_hours) for r in rows)
    cols = ["job", "name", "state", *[f"final {n}" for n in names], *[f"best {n}{_way(rows, n)}" for n in names]]
    on_cpu = any(r.cost is not None and r.cost.cpu_hours for r in rows)  # CPU slots: CPU-hours, never "GPU-h"
    on_gpu = not on_cpu or any(r.cost is not None and r.cost.gpu_hours for r in rows)
    cols += (["GPU-h"] if on_gpu else []) + (["CPU-h"] if on_cpu else [])
    cols += (["cost"] if priced else []) + (["lost GPU-h", "preempted"] if lost else []) + ["pulled"]
    unknown = any(r.error for r in rows)  # a host that could not answer: its rows say so, the others stand
    cols += ["note"] if unknown else []
    grown = any(r.joined for r in rows)  # parts that joined later (submit --into): a part column
    cols[3:3] = ["part"] if grown else []
    table = []
    for row in rows:
        state = row.job.state
        cells = [row.job.id, printable(row.job.name)]
        cells += [f"{row.final[n]:.4f}" if n in row.final else "-" for n in names]
        cells += [f"{row.best[n]:.4f}" if n in row.best else "-" for n in names]
        c = row.cost
        if on_gpu:
            cells.append(f"{c.gpu_hours:.3f}" if c is not None else "-")
        if on_cpu:
            cells.append(f"{c.cpu_hours:.3f}" if c is not None else "-")
        if priced:
            cells.append(f"${c.cost:.2f}" if c is not None and c.cost is not None else "-")
        if lost:
            cells += [f"{c.lost_gpu_hours:.3f}" if c is not None else "-", str(c.preemptions) if c is not None else "-"]
        styled = [(text, "") for text in cells]
        styled.insert(2, (state, STATE_STYLE.get(state, "")))
        styled[3:3] = [(str(row.job.part), "")] if grown else []
        styled.append(PULLED_CELL.get(row.pulled, ("-", "")))
        if unknown:
            styled.append((printable(row.error), "yellow") if row.error else ("", ""))
        table.append(styled)
    below: list[Line] = [[(line, "")] for line in dict.fromkeys(r.joined for r in rows if r.joined)]
    for row in rows:
        if row.job.reused_from:
            below.append([(f"{row.job.id} {printable(row.job.name)}: reused the verified results of "
                           f"{row.job.reused_from} (result cache; not run, no cost)", "")])
        if row.restarts_from_scratch:
            below.append([(f"{row.job.id} {printable(row.job.name)}: {row.restarts_from_scratch} retr"
                           f"{'ies' if row.restarts_from_scratch > 1 else 'y'} restarted from scratch: no file "
                           "matched `checkpoint`", "yellow")])
    total = [r.cost for r in rows if r.cost is not None]
    if total:
        money = [c.cost for c in total if c.cost is not None]
        spent = f", ${sum(money):.2f}" if money else ""
        wasted = sum(c.lost_gpu_hours for c in total)
        hours = [f"{sum(c.gpu_hours for c in total):.3f} GPU-h"] if on_gpu else []
        hours += [f"{sum(c.cpu_hours for c in total):.3f} CPU-h"] if on_cpu else []
        below.append([(f"total {', '.join(hours)}{spent}"
                       + (f"; {wasted:.3f} GPU-h lost to preemptions and losses" if wasted else ""), "")])
    return cols, table, below + _saved(rows)


def _saved(rows: list[ResultRow]) -> list[Line]:
    """What early stopping saved, one line (none when no job was stopped)."""
    if not any(row.job.state == "STOPPED" for row in rows):
        return []
    from orchestrator.api import stopreport  # early stopping's words: only when a job was stopped

    found = stopreport.result_saving(rows)
    return [[(stopreport.saved_line(found), "")]] if found is not None else []


def results_table(rows: list[ResultRow], *, plain: bool | None = None) -> None:
    """The rich table, or past a screenful of rows (``plain`` None) the same cells as plain aligned
    text (``orchestrator/cli/plaintable.py``)."""
    from orchestrator.context import gc_paused

    with gc_paused():  # ~100,000 cells of 10,000 jobs, all alive: full collections would find nothing
        from rich.table import Table

        from orchestrator.cli import plaintable
        from orchestrator.cli.render import console

        cols, cells, below = result_cells(rows)
        out = console()
        title = f"results of {rows[0].job.sweep_id}"
        if plaintable.big(len(rows)) if plain is None else plain:
            plaintable.write(out, title, cols, cells)
            plaintable.write_lines(out, below)
            return
        table = Table(title=title, title_justify="left")
        for col in cols:
            table.add_column(col, no_wrap=col in ("job", "state", "pulled"))
        for row in cells:
            table.add_row(*map(plaintable.rich_cell, row))
        out.print(table)
        for line in below:
            out.print(plaintable.rich_line(line))


def results_csv(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    writer = csv.writer(sys.stdout)
    writer.writerow(["job_id", "sweep_id", "name", "task", "epochs", "state", "attempts",
                     *[f"final_{n}" for n in names], *[f"best_{n}" for n in names], "gpu_hours", "cost_usd",
                     "lost_gpu_hours", "preemptions", "pulled", "local_dir", "error", "cpu_hours",
                     *[f"best_row_{n}" for n in names], "part"])
    for row in rows:
        j = row.job
        c = row.cost
        writer.writerow([j.id, j.sweep_id, j.name, j.task, j.epochs or "", j.state, j.attempt_count,
                         *[row.final.get(n, "") for n in names], *[row.best.get(n, "") for n in names],
                         f"{c.gpu_hours:.6f}" if c else "", f"{c.cost:.4f}" if c and c.cost is not None else "",
                         f"{c.lost_gpu_hours:.6f}" if c else "", c.preemptions if c else "",
                         row.pulled, row.local_dir, row.error or "", f"{c.cpu_hours:.6f}" if c else "",
                         *[row.best_row.get(n, "") for n in names], j.part])


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
    from rich.table import Table

    from orchestrator.cli.render import console, escape

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
