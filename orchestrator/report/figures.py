"""Learning-curve figures of ``gpuq report`` (PNG, matplotlib's Agg backend; the ``gpuq[report]`` extra).

One figure per curve: the headline metric and the training loss against step.  One line per cell
(the mean over its seeds at each logged step), a shaded band from the lowest to the highest seed
(cells of two or more seeds only; each job counts once per step),
the baseline drawn black, thicker and dashed; the legend sits outside the plot, and a loss axis
is logarithmic when its values span more than two decades.  Points beyond ±PLOT_LIMIT (huge finite
metrics: matplotlib's axis arithmetic overflows near the float range) are left out of the figure,
and its title says how many.  One outlier cell (``axis_range``: beyond 3 interquartile spreads of the
cells' late values) does not squash the others: the axis fits the others' second half, the outlier runs
off it, an arrow at the edge gives its last value ("off scale"), and the title names it.  Each figure
returns its y axis as drawn (range, scale, tick labels, the cells off scale): the page records it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.core.errors import UsageError
from orchestrator.report import stats
from orchestrator.report.model import CellRow, Report

Curves = Mapping[str, Mapping[str, Sequence[tuple[int, float]]]]  # job id -> metric -> [(step, value)]
LOG_SPAN = 100.0  # max/min above this: a log axis
MAX_LINES = 12  # cells drawn per figure: the baseline and the best others by mean (more are unreadable)
PLOT_LIMIT = 1e300  # |value| beyond this is not drawn (matplotlib fails on axes reaching ~1e308)
_LOSS_NAMES = ("loss", "train_loss", "train/loss", "training_loss")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("gpuq report's figures need matplotlib: pip install 'gpuq[report]' "
                         "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curve_names(report: Report, curves: Curves) -> list[str]:
    """The curves worth a figure: the headline metric, then the training loss (else any loss)."""
    names = {name for by_name in curves.values() for name in by_name}
    out = [report.metric] if report.metric in names else []
    loss = next((n for n in _LOSS_NAMES if n in names), None) or next((n for n in sorted(names) if "loss" in n), None)
    if loss is not None and loss not in out:
        out.append(loss)
    return out


def cell_band(jobs: Sequence[str], curves: Curves, name: str) -> list[tuple[int, float, float, float]]:
    """(step, mean, low, high) over the cell's seeds at each step any seed logged.  A job counts once
    per step (its last point there: a resumed attempt's row replaces the earlier one), so the band
    spans seeds only, never two attempts of one job."""
    at: dict[int, list[float]] = {}
    for job in jobs:
        own: dict[int, float] = {}
        for step, value in curves.get(job, {}).get(name, ()):
            own[int(step)] = float(value)
        for step, value in own.items():
            at.setdefault(step, []).append(value)
    return [(step, stats.mean(v), min(v), max(v)) for step, v in sorted(at.items())]


def drawable(band: Sequence[tuple[int, float, float, float]]) -> tuple[list[tuple[int, float, float, float]], int]:
    """The band's points that can be drawn (mean, low and high within ±PLOT_LIMIT), and how many were left out."""
    kept = [b for b in band if all(math.isfinite(v) and abs(v) <= PLOT_LIMIT for v in b[1:])]
    return kept, len(band) - len(kept)


def drawn_cells(report: Report) -> list[CellRow]:
    """The baseline and the best other cells by mean (by mode), at most MAX_LINES, in table order."""
    sign = 1.0 if report.mode == "min" else -1.0
    others = [c for c in report.cells if not c.is_baseline and c.mean is not None]
    others.sort(key=lambda c: sign * (c.mean or 0.0))
    keep = {id(c) for c in others[:MAX_LINES - 1]}
    keep |= {id(c) for c in report.cells if c.is_baseline}
    if len(report.cells) <= MAX_LINES:
        return list(report.cells)
    return [c for c in report.cells if id(c) in keep]


OUTLIER_IQR = 3.0  # a cell whose late values lie this many interquartile spreads outside the others' is an outlier


def axis_range(late: Mapping[str, Sequence[float]]) -> tuple[float, float, list[str]] | None:
    """A y range that one outlier cell cannot squash: ``late`` is each cell's values over the second half
    of its curve.  With 4 or more cells, a cell whose median lies more than OUTLIER_IQR interquartile
    spreads outside the cells' middle half is an outlier; the range is then the other cells' late values
    (padded by a tenth), and the outliers are named (drawn, running off the axis).  None: no outlier,
    matplotlib's own range."""
    medians = {cell: sorted(v)[len(v) // 2] for cell, v in late.items() if v}
    if len(medians) < 4:
        return None
    ordered = sorted(medians.values())
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    spread = max(q3 - q1, 1e-12 * max(1.0, abs(q3)))
    out = sorted(c for c, m in medians.items() if m < q1 - OUTLIER_IQR * spread or m > q3 + OUTLIER_IQR * spread)
    kept = [v for c, vals in late.items() if c not in out for v in vals]
    if not out or not kept:
        return None
    lo, hi = min(kept), max(kept)
    pad = 0.1 * (hi - lo) or 0.05 * max(1e-12, abs(hi))
    return lo - pad, hi + pad, out


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "metric"


class Axis(NamedTuple):
    """The y axis a figure was drawn with, as matplotlib laid it out (the HTML page records it on the image)."""

    low: float
    high: float
    scale: str  # "linear" | "log"
    ticks: tuple[str, ...]  # the tick labels drawn inside the range
    off_scale: tuple[str, ...]  # cells drawn running off the axis (outliers), named on the figure


class Figure(NamedTuple):
    name: str
    path: Path
    axis: Axis


@dataclass
class _Drawn:
    """What ``_draw_cells`` put on one figure: the values' extent, each cell's second half and last point."""

    lows: list[float] = field(default_factory=list)
    highs: list[float] = field(default_factory=list)
    late: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, tuple[int, float]] = field(default_factory=dict)
    dropped: int = 0


def _draw_cells(ax: Any, shown: Sequence[CellRow], curves: Curves, name: str) -> _Drawn:
    drawn = _Drawn()
    for cell in shown:
        band, left_out = drawable(cell_band(cell.jobs, curves, name))
        drawn.dropped += left_out
        if not band:
            continue
        steps = [b[0] for b in band]
        style = {"color": "black", "linewidth": 2.6, "linestyle": "--", "zorder": 5} if cell.is_baseline \
            else {"linewidth": 1.6}
        label = f"{cell.cell} (baseline)" if cell.is_baseline and cell.cell.lower() != "baseline" else cell.cell
        label += f" ({cell.stopped})" if cell.stopped else ""  # a partial curve, as far as it got
        seeds = len([j for j in cell.jobs if name in curves.get(j, {})])
        line = ax.plot(steps, [b[1] for b in band], label=f"{label}, n={seeds}", **style)[0]
        if seeds >= 2:  # a band is the spread of seeds: none for a cell of one job
            ax.fill_between(steps, [b[2] for b in band], [b[3] for b in band], color=line.get_color(),
                            alpha=0.18, linewidth=0)
        drawn.lows += [b[2] for b in band]
        drawn.highs += [b[3] for b in band]
        drawn.late[cell.cell] = [v for b in band[len(band) // 2:] for v in b[2:]]
        drawn.last[cell.cell] = (band[-1][0], band[-1][1])
    return drawn


def _fit_axis(ax: Any, drawn: _Drawn) -> list[str]:
    """Clip the y axis to the bulk of the cells when one is an outlier, and mark each outlier's last value
    at the edge it runs off (an arrow and its value: off scale); the outliers' names."""
    ranged = None if ax.get_yscale() == "log" else axis_range(drawn.late)
    if ranged is None:
        return []
    low, high, out = ranged
    ax.set_ylim(low, high)
    for k, cell in enumerate(out):
        step, value = drawn.last[cell]
        below = value < low
        edge = low if below else high
        ax.annotate(f"{cell}: {value:.3g} {'↓' if below else '↑'} off scale", xy=(step, edge),
                    xytext=(-6, (12 + 14 * k) * (1 if below else -1)), textcoords="offset points", ha="right",
                    va="bottom" if below else "top", fontsize=8, color="#b3261e",
                    arrowprops={"arrowstyle": "->", "color": "#b3261e"})
    return out


def _axis(ax: Any, off_scale: Sequence[str]) -> Axis:
    low, high = ax.get_ylim()
    ticks = tuple(t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
                  if min(low, high) <= v <= max(low, high) and t.get_text())
    return Axis(float(low), float(high), str(ax.get_yscale()), ticks, tuple(off_scale))


def write_figures(report: Report, curves: Curves, out: Path) -> list[Figure]:
    """A figure (curve name, PNG path, its y axis) for each figure written under ``out``; none without curves."""
    names = curve_names(report, curves)
    if not names:
        return []
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
        shown = drawn_cells(report)
        drawn = _draw_cells(ax, shown, curves, name)
        is_loss = "loss" in name.lower()
        if is_loss and drawn.lows and min(drawn.lows) > 0 and max(drawn.highs) / min(drawn.lows) > LOG_SPAN:
            ax.set_yscale("log")
        ax.set_xlabel("step (optimizer steps)")
        ax.set_ylabel(name)
        better = "lower" if is_loss or (name == report.metric and report.mode == "min") else "higher"
        sweeps = ", ".join(s.id for s in report.sweeps)
        some = f", the best {len(shown)} of {len(report.cells)} cells" if len(shown) < len(report.cells) else ""
        beyond = f"\n{drawn.dropped} points beyond ±{PLOT_LIMIT:.0e} not drawn" if drawn.dropped else ""
        off_scale = _fit_axis(ax, drawn)  # one outlier must not squash the others into one band
        if off_scale:
            beyond += f"\naxis fits the other cells' second half; {', '.join(off_scale)} (outlier) runs off it"
        ax.set_title(f"{name} against step ({better} is better), sweep {sweeps}{some}{beyond}")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=9,
                  title="cell: mean over seeds\nband: lowest to highest", title_fontsize=8)
        path = out / f"curve-{_slug(name)}.png"
        fig.savefig(path, bbox_inches="tight")  # draws: the tick labels below are those in the file
        written.append(Figure(name, path, _axis(ax, off_scale)))
        plt.close(fig)
    return written
