"""The live view's glyphs: bars (``█████░░░░░``), sparklines (``▁▃▅█``) and the style of a level."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

SPARKS = "▁▂▃▄▅▆▇█"
FULL, EMPTY = "█", "░"
BAR_W = 10  # cells of a utilisation / memory / disk bar
SPARK_W = 16  # losses shown in a job's sparkline


def bar(fraction: float | None, width: int = BAR_W, style: str = "green") -> Text:
    """``█████░░░░░``: ``fraction`` (0..1) of ``width`` cells filled; dim dots when unknown."""
    if fraction is None or not math.isfinite(fraction):
        return Text("·" * width, style="dim")
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return Text.assemble((FULL * filled, style), (EMPTY * (width - filled), "dim"))


def level_style(pct: float | None, warn: float, bad: float) -> str:
    if pct is None:
        return "dim"
    return "bold red" if pct >= bad else "yellow" if pct >= warn else "green"


def sparkline(values: Sequence[float], width: int = SPARK_W) -> str:
    """The last ``width`` values as block characters (log scale when all are positive: losses fall
    by orders of magnitude, and a linear scale would flatten everything after the first drop)."""
    vals = [v for v in values if math.isfinite(v)][-width:]
    if not vals:
        return ""
    if all(v > 0 for v in vals):
        vals = [math.log(v) for v in vals]
    lo, hi = min(vals), max(vals)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return SPARKS[3] * len(vals)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - lo) / (hi - lo) * top)] for v in vals)
