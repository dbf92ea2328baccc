"""``gpuq report``: which ablation cell won, by how much, and is it within the noise (docs/report.md)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli import complete

if TYPE_CHECKING:
    from orchestrator.api import Context
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
    ctx = _ctx()
    doc = build_report(ctx, list(sweeps), baseline=baseline, metric=metric, mode=mode)
    if fmt == "html" and out_dir is not None:
        from orchestrator.report.html import write_report

        page = write_report(doc, ctx.ledger.curves(j for cell in doc.cells for j in cell.jobs), out_dir)
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


def _ctx() -> Context:
    from orchestrator import api

    try:
        return api.open_context()
    finally:
        gc.enable()  # main() turns it off for start-up


def _table(doc: Report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from orchestrator.report import tables

    styles = {"better": "green", "worse": "red", "within noise": "yellow", "baseline": "bold", "n too small": "dim",
              "no data": "dim"}
    table = Table(title=escape(tables.heading(doc)), title_justify="left")
    for i, name in enumerate(tables.COLUMNS):
        table.add_column(name, justify="left" if i == 0 or name in ("verdict", "flags") else "right",
                         overflow="fold")
    for row in doc.cells:
        values = [escape(v) for v in tables.cells(row)]
        values[-2] = f"[{styles.get(row.verdict, '')}]{values[-2]}[/]" if styles.get(row.verdict) else values[-2]
        table.add_row(*values)
    console = Console(highlight=False)
    console.print(table)
    for note in doc.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    for fail in doc.failures:
        klass = f" ({escape(fail.failure_class)})" if fail.failure_class else ""
        console.print(f"[red]failed[/] {escape(fail.name)}{klass}: {escape(fail.message)}")
