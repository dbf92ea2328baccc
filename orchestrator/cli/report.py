"""``gpuq report``: which ablation cell won, by how much, and is it within the noise (docs/report.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli import complete
from orchestrator.cli.ctx import open_ctx

if TYPE_CHECKING:
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
    from orchestrator.errors import UsageError
    from orchestrator.report import tables

    if fmt == "html" and out_dir is None:
        raise UsageError("gpuq report --format html needs -o DIR (the page and its figures are written there)")
    ctx = open_ctx()
    doc = build_report(ctx, list(sweeps), baseline=baseline, metric=metric, mode=mode)
    if fmt == "html" and out_dir is not None:
        from orchestrator.report.figures import drawn_cells
        from orchestrator.report.html import write_report

        page = write_report(doc, ctx.ledger.curves(j for cell in drawn_cells(doc) for j in cell.jobs), out_dir)
        click.echo(f"wrote {page}")
        return
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


def _table(doc: Report) -> None:
    """The table on a terminal: every column when it fits, else mean ± CI half-width and delta ± CI,
    with the flags, GPU-hours and cost below it (``--format md``/``csv`` have them all)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from orchestrator.cli.cellpanel import VERDICT_STYLE, plus_minus
    from orchestrator.report import tables

    console = Console(highlight=False)
    wide = console.width >= WIDE
    columns = list(tables.COLUMNS) if wide else ["cell", "n", "mean ± CI", "Δ ± CI", "p", "verdict"]
    table = Table(title=escape(tables.heading(doc)), title_justify="left")
    for name in columns:
        table.add_column(name, justify="left" if name in ("cell", "verdict", "flags") else "right",
                         overflow="fold", no_wrap=name != "flags")
    for row in doc.cells:
        values = dict(zip(tables.COLUMNS, (escape(v) for v in tables.cells(row)), strict=True))
        values["mean ± CI"] = plus_minus(row.mean, row.ci_low, row.ci_high)
        if not wide:
            values["cell"] = escape(row.cell)  # the verdict column says which is the baseline
        values["Δ ± CI"] = "" if row.is_baseline else plus_minus(row.delta, row.delta_ci_low,
                                                                             row.delta_ci_high, sign=True)
        style = VERDICT_STYLE.get(row.verdict)
        if style:
            values["verdict"] = f"[{style}]{values['verdict']}[/]"
        table.add_row(*(values[c] for c in columns))
    console.print(table)
    if not wide:
        for row in doc.cells:
            for flag in row.flags:
                console.print(f"[red]{escape(row.cell)}[/]: {escape(flag)}")
        cost = tables.cost(doc.cost_usd)
        console.print(f"GPU-hours {doc.gpu_hours:.2f}" + (f", CPU-hours {doc.cpu_hours:.2f}" if doc.cpu_hours else "")
                      + (f", cost {cost}" if cost else "")
                      + f" · every column: a terminal {WIDE} wide, or --format md|csv|json|html")
    for note in doc.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    for fail in doc.failures:
        klass = f" ({escape(fail.failure_class)})" if fail.failure_class else ""
        console.print(f"[red]failed[/] {escape(fail.name)}{klass}: {escape(fail.message)}")
