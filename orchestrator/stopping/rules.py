"""The stopping decision at a tick (pure): each cell at each rung is looked at once, against the
baseline at the same rung over both cells' seeds, and each look is a record (``Look``).

``baseline`` rule: one-sided Welch t of (cell - baseline) in the metric's worse direction, less the
margin; stopped when its p-value is at or under ``StopPolicy.look_alpha`` (the rung's share of alpha
split over the compared cells).  Every look spends only its own share, so the chance of any wrong
stop in a sweep is at most alpha whatever the correlation between rungs (union bound).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.report import stats
from orchestrator.stopping.policy import StopPolicy

Finite = Annotated[float, Field(allow_inf_nan=False)]


class AtRung(BaseModel):
    """One cell's seeds at one rung: the finite values of those that reached it, and how many of its
    live seeds have yet to (a rung is looked at only when none is left to come)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: str = Field(min_length=1, max_length=200)
    rung: int = Field(ge=0, le=7)
    values: tuple[Finite, ...] = Field(max_length=4096)
    pending: int = Field(default=0, ge=0)


def stop_words(rule: str, step: int) -> str:
    """The few words a report's row shows of a stop: "stopped: worse than baseline at step N"."""
    if rule == "halving":
        return f"stopped: not in the best share at step {step}"
    return f"stopped: worse than baseline at step {step}"


class Look(BaseModel):
    """One cell's verdict at one rung, recorded before anything is stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["baseline", "halving"]
    cell: str
    rung: int
    fraction: float
    cell_mean: float
    baseline_mean: float
    n_cell: int
    n_baseline: int
    statistic: float  # baseline: Welch t (worse positive); halving: the cell's mean
    threshold: float  # baseline: the p-value to reach; halving: the cut (worst mean kept)
    p_value: float | None = None
    stop: bool

    def reason(self, step: int) -> str:
        """The user's words for ``gpuq explain`` (every number is a field above)."""
        if self.rule == "halving":
            return (
                f"stopped: not in the best share at step {step} (rung {self.rung + 1}, successive halving): "
                f"mean {self.cell_mean:.4g} vs cut {self.threshold:.4g}"
            )
        return (
            f"stopped: worse than baseline at step {step} (rung {self.rung + 1}): mean {self.cell_mean:.4g} vs "
            f"baseline {self.baseline_mean:.4g}, t={self.statistic:.3g}, p={self.p_value:.3g} <= {self.threshold:.3g}"
        )


def worse_test(policy: StopPolicy, cell: Sequence[float], base: Sequence[float]) -> tuple[float, float] | None:
    """(t, one-sided p) that ``cell`` is worse than ``base`` by more than the margin; None below two
    values a side or when it cannot be computed.  Both sides without spread: p is 0 or 1 exactly."""
    if len(cell) < 2 or len(base) < 2:
        return None
    sign = 1.0 if policy.direction == "min" else -1.0
    gap = sign * (stats.mean(cell) - stats.mean(base)) - policy.margin
    sc, sb = stats.std(cell), stats.std(base)
    if sc is None or sb is None or not math.isfinite(gap):
        return None
    vc, vb = sc * sc / len(cell), sb * sb / len(base)
    se2 = vc + vb
    if se2 == 0.0:
        return (math.copysign(math.inf, gap) if gap else 0.0, 0.0 if gap > 0.0 else 1.0)
    rc, rb = vc / se2, vb / se2  # shares of the variance: tiny spreads squared would underflow to 0 / 0
    df = 1.0 / (rc * rc / (len(cell) - 1) + rb * rb / (len(base) - 1))
    t = gap / math.sqrt(se2)
    return t, 1.0 - stats.t_cdf(t, df)


def look(policy: StopPolicy, cells: int, cell: AtRung, base: AtRung) -> Look | None:
    """The baseline rule's look at ``cell`` (None: not yet, too few seeds or some yet to come)."""
    ready = cell.pending == 0 and base.pending == 0
    if not ready or min(len(cell.values), len(base.values)) < policy.min_seeds:
        return None
    tested = worse_test(policy, cell.values, base.values)
    if tested is None:
        return None
    t, p = tested
    threshold = policy.look_alpha(cell.rung, cells)
    return Look(
        rule="baseline",
        cell=cell.cell,
        rung=cell.rung,
        fraction=policy.rungs[cell.rung],
        cell_mean=stats.mean(cell.values),
        baseline_mean=stats.mean(base.values),
        n_cell=len(cell.values),
        n_baseline=len(base.values),
        statistic=t if math.isfinite(t) else math.copysign(1e308, t),
        threshold=threshold,
        p_value=p,
        stop=p <= threshold,
    )


def decide(
    policy: StopPolicy,
    baseline: str,
    cells: int,
    seen: Sequence[AtRung],
    looked: Collection[tuple[str, int]],
    stopped: Collection[str],
) -> list[Look]:
    """The looks due now under the baseline rule: each (cell, rung) not yet ``looked`` at, for cells
    not ``stopped``, never the baseline; ``cells`` is the number of compared cells in the sweep (all
    of them, with data or not: the Bonferroni split must not shrink with what has arrived)."""
    bases = {a.rung: a for a in seen if a.cell == baseline}
    out: list[Look] = []
    for at in sorted(seen, key=lambda a: (a.rung, a.cell)):
        if at.cell == baseline or at.cell in stopped or (at.cell, at.rung) in looked or at.rung not in bases:
            continue
        if at.rung >= len(policy.rungs) or any(o.cell == at.cell and o.stop for o in out):
            continue
        verdict = look(policy, cells, at, bases[at.rung])
        if verdict is not None:
            out.append(verdict)
    return out
