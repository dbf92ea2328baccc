"""The live dashboard's per-cell view (key ``c``): the jobs table replaced by one row per cell,
mean ± 95 % CI half-width over finished seeds and the delta to the baseline so far (docs/report.md)."""

from __future__ import annotations

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.report import tables
from orchestrator.report.model import CellRow, Report

VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "within noise": "yellow", "baseline": "bold",
                 "n too small": "dim", "cannot compute": "dim", "no data": "dim", "no baseline": "dim"}


def plus_minus(mean: float | None, low: float | None, high: float | None, sign: bool = False) -> str:
    if mean is None:
        return "-"
    shown = tables.signed(mean) if sign else tables.num(mean)
    if low is None or high is None:
        return shown
    return f"{shown} ± {tables.num((high - low) / 2, 2)}"


def _row(cell: CellRow) -> list[Text | str]:
    name = Text(tables.cell_label(cell), style="bold" if cell.is_baseline else "")
    delta = "" if cell.is_baseline else plus_minus(cell.delta, cell.delta_ci_low, cell.delta_ci_high, sign=True)
    flags = Text("; ".join(cell.flags), style="red") if cell.flags else Text("")
    return [name, f"{cell.n_finished}/{cell.n_total}", plus_minus(cell.mean, cell.ci_low, cell.ci_high), delta,
            tables.p_value(cell.p_value), Text(cell.verdict, style=VERDICT_STYLE.get(cell.verdict, "")), flags]


def cells_panel(report: Report | None, error: str, *, offset: int, rows: int) -> Panel:
    """Cells ``offset``..``offset + rows`` of the report (None: not computed yet; ``error``: why not)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=True, header_style="bold dim")
    for name, justify in (("cell", "left"), ("n", "right"), ("mean ± CI", "right"), ("Δ vs baseline ± CI", "right"),
                          ("p", "right"), ("verdict", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("flags", no_wrap=True, overflow="ellipsis", ratio=1)  # what is left of the width
    cells = report.cells if report is not None else []
    for cell in cells[offset:offset + rows]:
        table.add_row(*_row(cell))
    if report is None:
        table.add_row(Text(error or "computing the cells…", style="red" if error else "dim"), *[""] * 6)
    elif not cells:
        table.add_row(Text("no jobs in the shown sweeps", style="dim"), *[""] * 6)
    title = "cells"
    if report is not None:
        title = f"cells · {report.metric} ({'higher' if report.mode == 'max' else 'lower'} is better) · " \
                f"{report.finished}/{report.total} jobs finished"
        if len(cells) > rows:
            title += f" · {offset + 1}-{offset + min(rows, len(cells) - offset)} of {len(cells)}"
    return Panel(table, title=title, title_align="left", border_style="magenta",
                 subtitle="c: back to jobs", subtitle_align="right")
