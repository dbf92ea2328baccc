"""A sweep's stopping policy (``[stop]`` in gpuq.toml, ``submit --stop RULE``) and its rungs: pure.

``baseline``: a cell is stopped when it is worse than the baseline cell at a rung, by a one-sided
Welch test over seeds whose error rate holds over all rungs and cells (docs/stopping.md).
``halving``: successive halving, the top ``keep`` share of cells goes on at each rung; no error bound.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Fraction = Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
DEFAULT_RUNGS = (1.0 / 9.0, 1.0 / 3.0)


class StopPolicy(BaseModel):
    """What to stop, when, and with which error rate; off unless a sweep names a rule."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["baseline", "halving"]
    alpha: float = Field(default=0.05, gt=0.0, le=0.5, allow_inf_nan=False)
    margin: float = Field(default=0.0, ge=0.0, le=1e12, allow_inf_nan=False)
    rungs: tuple[Fraction, ...] = Field(default=DEFAULT_RUNGS, min_length=1, max_length=8)
    min_seeds: int = Field(default=3, ge=2, le=64)
    keep: float = Field(default=1.0 / 3.0, gt=0.0, lt=1.0, allow_inf_nan=False)
    direction: Literal["min", "max"] = "min"
    baseline: str = Field(default="baseline", min_length=1, max_length=200)  # the cell compared against (any case)

    @field_validator("rungs")
    @classmethod
    def _increasing(cls, rungs: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= a for a, b in itertools.pairwise(rungs)):
            raise ValueError("rungs must be fractions of the run that increase, e.g. [0.111, 0.333]")
        return rungs

    def spent(self, rung: int) -> float:
        """The share of ``alpha`` this rung may spend: power spending with rho = 1 over the rungs,
        alpha * (t_k - t_(k-1)) / t_K, so the shares add up to alpha over all rungs."""
        previous = self.rungs[rung - 1] if rung > 0 else 0.0
        return self.alpha * (self.rungs[rung] - previous) / self.rungs[-1]

    def look_alpha(self, rung: int, cells: int) -> float:
        """The one-sided p-value at or under which a cell is stopped at this rung: the rung's share,
        split over the sweep's ``cells`` compared cells (Bonferroni; never the baseline)."""
        return self.spent(rung) / max(1, cells)

    def describe(self) -> str:
        """One line for the dry run: what this policy will do."""
        at = ", ".join(f"{r:.3g}" for r in self.rungs)
        if self.rule == "halving":
            return (
                f"stop: successive halving at {at} of each run: the best {self.keep:.0%} of the cells with "
                f">= {self.min_seeds} seeds go on (metric {self.direction}imised); no error bound; never the baseline "
                f"(cell {self.baseline!r})"
            )
        worse = f"worse than the baseline by more than {self.margin:g}" if self.margin else "worse than the baseline"
        return (
            f"stop: a cell {worse} at {at} of its run (one-sided Welch over >= {self.min_seeds} seeds a side), "
            f"any wrong stop in the sweep at most alpha={self.alpha:g}; never the baseline (cell {self.baseline!r})"
        )


def rung_steps(policy: StopPolicy, total_steps: int) -> tuple[int, ...]:
    """The step of each rung for a run of ``total_steps`` (at least 1 each; rungs at the same step
    are kept, so the rung numbers stay those of the policy)."""
    return tuple(max(1, math.floor(f * total_steps)) for f in policy.rungs)


def value_at(curve: tuple[tuple[int, float], ...], step: int) -> float | None:
    """A seed's metric at a rung: its last finite value at a step <= ``step``, once the curve has
    reached ``step``; None before that (a host's numbers: non-finite values are skipped)."""
    if not curve or max(s for s, _ in curve) < step:
        return None
    best: tuple[int, float] | None = None
    for s, v in curve:
        if s <= step and math.isfinite(v) and (best is None or s >= best[0]):
            best = (s, v)
    return None if best is None else best[1]
