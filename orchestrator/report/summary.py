"""The report's headline sentence and its durations, computed from the report's cells (never written by hand).

``headline``: "best: wide, +0.0024 vs baseline, within noise": the cell with the best mean (by mode), its
delta against the baseline and its verdict; when the baseline itself is best, the runner-up's; a cell
that is reliably ``better`` but not the best by mean is named too (a noisy cell can have the higher mean).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.report.model import CellRow, Report

BOUNDED = ("acc", "f1", "precision", "recall", "auc", "iou", "dice")  # metric names that live in [0, 1]


def bounded(metric: str) -> bool:
    """A metric that cannot leave [0, 1] (an accuracy, an F1, an IoU ...), by its name."""
    return any(word in metric.lower() for word in BOUNDED)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _signed(value: float | None) -> str:
    return "no delta" if value is None else f"{value:+.4g}"


def _ranked(cells: Sequence[CellRow], mode: str) -> list[CellRow]:
    """Cells with a mean, best first (the table's order breaks ties)."""
    sign = -1.0 if mode == "max" else 1.0
    return sorted((c for c in cells if c.mean is not None), key=lambda c: sign * (c.mean or 0.0))


def _against(cell: CellRow) -> str:
    held = f" (p Holm {cell.p_adjusted:.3g})" if cell.p_adjusted is not None and cell.verdict != "within noise" else ""
    return f"{_signed(cell.delta)} vs baseline, {cell.verdict}{held}"


def headline(report: Report) -> str:
    """One sentence a reader can quote; see the module's docstring."""
    ranked = _ranked(report.cells, report.mode)
    if not ranked:
        return f"no cell has finished with {report.metric} yet"
    best = ranked[0]
    if report.baseline is None:
        return f"best: {best.cell}, {report.metric} {_num(best.mean)} (no baseline to compare with)"
    if best.is_baseline:
        others = ranked[1:]
        if not others:
            return f"best: {best.cell} (the baseline), {report.metric} {_num(best.mean)}; no other cell has finished"
        return (f"best: {best.cell} (the baseline), {report.metric} {_num(best.mean)}; next {others[0].cell}, "
                f"{_against(others[0])}")
    text = f"best: {best.cell}, {_against(best)}"
    also = [c for c in ranked[1:] if c.verdict == "better"]
    if also and best.verdict != "better":
        text += "; reliably better: " + ", ".join(f"{c.cell} ({_signed(c.delta)})" for c in also)
    return text


def duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``1h02m``, ``2d03h``; "" for none."""
    if seconds is None:
        return ""
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
