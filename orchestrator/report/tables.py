"""The report as text: the columns every form shares, Markdown and CSV (the terminal table is
``orchestrator/cli/report.py``, the HTML page ``orchestrator/report/html.py``)."""

from __future__ import annotations

import csv
import io

from orchestrator.report.model import CellRow, Report

COLUMNS = ("cell", "n", "mean", "std", "95% CI", "best", "steps", "GPU-h", "cost", "Δ vs baseline", "Δ 95% CI",
           "p", "p (Holm)", "verdict", "flags")


def num(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.4g}"


def interval(low: float | None, high: float | None, sign: bool = False) -> str:
    if low is None or high is None:
        return ""
    fmt = signed if sign else num
    return f"[{fmt(low)}, {fmt(high)}]"


def p_value(p: float | None) -> str:
    if p is None:
        return ""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def cost(value: float | None) -> str:
    return "" if value is None else f"${value:.2f}"


def _hours(row: CellRow) -> str:
    """GPU-hours, and the CPU-hours of attempts on CPU slots beside them (never added to them, and never
    written "0.00 +0.12", which reads like a sum): ``0.12 CPU-h`` alone, or ``1.50 · 0.12 CPU-h``."""
    if not row.cpu_hours:
        return f"{row.gpu_hours:.2f}"
    cpu = f"{row.cpu_hours:.2f} CPU-h"
    return f"{row.gpu_hours:.2f} · {cpu}" if row.gpu_hours else cpu


def cell_label(row: CellRow) -> str:
    """The cell's name, tagged when it is the baseline (a cell called "baseline" is not tagged again)."""
    return row.cell + (" (baseline)" if row.is_baseline and row.cell.lower() != "baseline" else "")


def cells(row: CellRow) -> list[str]:
    """One cell's columns, in the order of COLUMNS."""
    return [cell_label(row), f"{row.n_finished}/{row.n_total}",
            num(row.mean), num(row.std), interval(row.ci_low, row.ci_high), num(row.best),
            "" if row.steps is None else str(row.steps), _hours(row), cost(row.cost_usd),
            signed(row.delta), interval(row.delta_ci_low, row.delta_ci_high, sign=True), p_value(row.p_value),
            p_value(row.p_adjusted), row.stopped or row.verdict, "; ".join(row.flags)]


def heading(report: Report) -> str:
    sweeps = ", ".join(s.id for s in report.sweeps)
    best = "higher" if report.mode == "max" else "lower"
    base = f"against {report.baseline}" if report.baseline else "no baseline"  # never "baseline baseline"
    return (f"sweep {sweeps}: {report.metric} ({best} is better), final value per seed; {base}; "
            f"{report.finished}/{report.total} jobs finished")


def markdown(report: Report) -> str:
    def esc(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    lines = [f"**{esc(heading(report))}**", ""] + ([esc(report.headline), ""] if report.headline else [])
    lines += ["| " + " | ".join(COLUMNS) + " |",
              "|" + "|".join("---" if i == 0 or c in ("verdict", "flags") else "---:"
                             for i, c in enumerate(COLUMNS)) + "|"]
    lines += ["| " + " | ".join(esc(v) for v in cells(row)) + " |" for row in report.cells]
    lines += [""] + [f"- {esc(note)}" for note in report.notes]
    return "\n".join(lines).rstrip() + "\n"


def _raw(value: object) -> object:
    """CSV cells: 12 significant digits (0.92, not 0.9199999999999999), nothing for null."""
    if value is None:
        return ""
    return f"{value:.12g}" if isinstance(value, float) else value


def csv_text(report: Report) -> str:
    """Machine-friendly: raw numbers (no formatting), one row per cell."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    fields = ("cell", "is_baseline", "n_finished", "n_total", "mean", "std", "ci_low", "ci_high", "best", "steps",
              "gpu_hours", "cpu_hours", "wall_s", "cost_usd", "delta", "delta_ci_low", "delta_ci_high", "p_value",
              "p_adjusted", "verdict")
    out.writerow((*fields, "flags", "sweeps", "metric", "mode"))
    for row in report.cells:
        data = row.model_dump()
        out.writerow([_raw(data[f]) for f in fields]
                     + ["; ".join(row.flags), " ".join(row.sweeps), report.metric, report.mode])
    return buf.getvalue()
