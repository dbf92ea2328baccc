"""``gpuq report``: which ablation cell won, by how much, and is it within the noise (docs/report.md).
Past a screenful of cells the terminal table is plain aligned text (``orchestrator/cli/plaintable.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli import complete
from orchestrator.cli.ctx import read_through

if TYPE_CHECKING:
    from orchestrator.cli.plaintable import Cell, Line
    from orchestrator.context import Context, ReadContext
    from orchestrator.report.model import Report


@click.command()
@click.argument("sweeps", nargs=-1, metavar="[SWEEP]...", shell_complete=complete.sweeps)
@click.option("--baseline", metavar="CELL", help="The cell the others are compared with (default: 'baseline').")
@click.option("--metric", metavar="NAME", help="The headline metric (default: the sweep's [run] metric, else val_acc).")
@click.option("--mode", type=click.Choice(["max", "min"]), help="Whether higher or lower is better.")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv", "json", "html"]), default="table",
              show_default=True, help="json: docs/schemas/report.schema.json; html: a page with curves, needs -o.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the HTML page and its figures (html), else the file is printed.")
def report(sweeps: tuple[str, ...], baseline: str | None, metric: str | None, mode: str | None, fmt: str,
           out_dir: Path | None) -> None:
    """Per cell (jobs that differ only by seed): mean, std and 95 % CI of the final metric, and the
    difference from the baseline with a Welch CI, p-value and verdict.  Several sweeps merge by cell
    name; on a running sweep only finished jobs count."""
    from orchestrator.api.report import build_report
    from orchestrator.core.errors import UsageError
    from orchestrator.report import tables

    if fmt == "html" and out_dir is None:
        raise UsageError("gpuq report --format html needs -o DIR (the page and its figures are written there)")
    if fmt == "html" and out_dir is not None:
        from orchestrator.report.figures import drawn_cells
        from orchestrator.report.html import write_report

        def page_of(ctx: Context | ReadContext) -> Path:
            doc = build_report(ctx, list(sweeps), baseline=baseline, metric=metric, mode=mode)
            return write_report(doc, ctx.ledger.curves(j for cell in drawn_cells(doc) for j in cell.jobs), out_dir)

        click.echo(f"wrote {read_through(page_of)}")
        return
    doc = read_through(lambda ctx: build_report(ctx, list(sweeps), baseline=baseline, metric=metric, mode=mode))
    if fmt in ("md", "csv", "json"):
        text = {"md": tables.markdown(doc), "csv": tables.csv_text(doc),
                "json": doc.model_dump_json(by_alias=True, indent=2) + "\n"}[fmt]
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            target = out_dir / f"report.{fmt}"
            target.write_text(text)
            click.echo(f"wrote {target}")
        else:
            sys.stdout.write(text)
        return
    _table(doc)


WIDE = 170  # terminal columns from which every column of the table fits
NARROW = ("cell", "n", "mean ± CI", "Δ ± CI", "p", "p (Holm)", "verdict")


def report_cells(doc: Report, wide: bool) -> tuple[list[str], list[list[Cell]], list[Line]]:
    """The terminal table: its columns (every one when ``wide``, else mean ± CI half-width and delta
    ± CI), a row of cells per cell of the report (printable text and a style, never markup), and the
    lines below it (when not wide: the flags, GPU-hours and cost; the notes; the failed jobs)."""
    from orchestrator.cli.cellpanel import VERDICT_STYLE, plus_minus
    from orchestrator.report import tables
    from orchestrator.views.text import printable

    columns = list(tables.COLUMNS) if wide else list(NARROW)
    rows = []
    for row in doc.cells:
        values = dict(zip(tables.COLUMNS, map(printable, tables.cells(row)), strict=True))
        values["mean ± CI"] = plus_minus(row.mean, row.ci_low, row.ci_high)
        if not wide:
            values["cell"] = printable(row.cell)  # the verdict column says which is the baseline
        values["Δ ± CI"] = "" if row.is_baseline else plus_minus(row.delta, row.delta_ci_low,
                                                                             row.delta_ci_high, sign=True)
        style = VERDICT_STYLE.get(row.verdict, "")
        rows.append([(values[c], style if c == "verdict" else "") for c in columns])
    below: list[Line] = [[(printable(doc.headline), "bold")]] if doc.headline else []
    if not wide:
        below += [[(printable(cell.cell), "red"), (f": {printable(flag)}", "")]
                  for cell in doc.cells for flag in cell.flags]
        cost = tables.cost(doc.cost_usd)
        hours = f"GPU-hours {doc.gpu_hours:.2f}" + (f", CPU-hours {doc.cpu_hours:.2f}" if doc.cpu_hours else "")
        below.append([(hours + (f", cost {cost}" if cost else "")
                       + f" · every column: a terminal {WIDE} wide, or --format md|csv|json|html", "")])
    below += [[(f"note: {printable(note)}", "dim")] for note in doc.notes]
    for fail in doc.failures:
        klass = f" ({printable(fail.failure_class)})" if fail.failure_class else ""
        below.append([("failed", "red"), (f" {printable(fail.name)}{klass}: {printable(fail.message)}", "")])
    return columns, rows, below


def _table(doc: Report, *, plain: bool | None = None) -> None:
    """The table on a terminal: every column when it fits, else the narrow set with the rest below it
    (``--format md``/``csv`` have them all); past a screenful of cells (``plain`` None) the same cells
    as plain aligned text (``orchestrator/cli/plaintable.py``)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from orchestrator.cli import plaintable
    from orchestrator.context import gc_paused
    from orchestrator.report import tables
    from orchestrator.views.text import printable

    console = Console(highlight=False)
    with gc_paused():
        columns, rows, below = report_cells(doc, console.width >= WIDE)
        right = [c for c in columns if c not in ("cell", "verdict", "flags")]
        if plaintable.big(len(rows)) if plain is None else plain:
            plaintable.write(console, printable(tables.heading(doc)), columns, rows, right=right)
            plaintable.write_lines(console, below)
            return
        table = Table(title=escape(printable(tables.heading(doc))), title_justify="left")
        for name in columns:
            table.add_column(name, justify="right" if name in right else "left", overflow="fold",
                             no_wrap=name != "flags")
        for row in rows:
            table.add_row(*map(plaintable.rich_cell, row))
        console.print(table)
        for line in below:
            console.print(plaintable.rich_line(line))
