"""``seeds=auto`` (pure): after the first seeds finish, which cells get one more seed.

A cell's verdict against the baseline is clear when its Holm-adjusted Welch p is at or under alpha
(it differs), or, with a margin, when the (1 - alpha) interval of the difference lies within
+-margin (it is as good).  Otherwise it is ambiguous and gets a seed, until ``max_seeds`` or the
budget (``affordable`` more seeds) is reached; the baseline gets one too when every comparison is
ambiguous.  Cells nearest a verdict (smallest adjusted p) go first when the budget is short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.report import stats


class AutoSeeds(BaseModel):
    """``seeds=auto``'s bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_seeds: int = Field(default=3, ge=2, le=64)
    max_seeds: int = Field(default=8, ge=2, le=64)
    alpha: float = Field(default=0.05, gt=0.0, le=0.5, allow_inf_nan=False)
    margin: float = Field(default=0.0, ge=0.0, le=1e12, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> AutoSeeds:
        if self.max_seeds < self.min_seeds:
            raise ValueError("seeds=auto: max must be at least min")
        return self


def verdicts(auto: AutoSeeds, baseline: str, finals: Mapping[str, Sequence[float]]) -> dict[str, bool]:
    """Per compared cell: is its verdict clear (True) or ambiguous (False)?"""
    base = finals.get(baseline, ())
    cells = sorted(c for c in finals if c != baseline)
    tests = {c: stats.welch(finals[c], base, confidence=1.0 - auto.alpha) for c in cells}
    known = {c: t.p_value for c, t in tests.items() if t is not None}
    adjusted = dict(zip(known, stats.holm(list(known.values())), strict=True))
    out: dict[str, bool] = {}
    for c in cells:
        t = tests[c]
        if t is None:
            out[c] = False
            continue
        equal = auto.margin > 0.0 and -auto.margin <= t.ci.low and t.ci.high <= auto.margin
        out[c] = adjusted[c] <= auto.alpha or equal
    return out


def more_seeds(
    auto: AutoSeeds,
    baseline: str,
    finals: Mapping[str, Sequence[float]],
    planned: Mapping[str, int],
    affordable: int,
) -> list[str]:
    """The cells (the baseline included) to give one more seed now; ``planned`` counts each cell's
    seeds queued, running or done, and a cell with fewer than ``min_seeds`` finished is not judged
    yet (its first seeds are still to come)."""
    if any(len(v) < auto.min_seeds or len(v) < planned.get(c, 0) for c, v in finals.items()):
        return []
    clear = verdicts(auto, baseline, finals)
    ambiguous = [c for c, ok in clear.items() if not ok and planned.get(c, 0) < auto.max_seeds]
    base = finals.get(baseline, ())
    order = {c: _near(finals[c], base) for c in ambiguous}
    chosen = sorted(ambiguous, key=lambda c: (order[c], c))
    if clear and not any(clear.values()) and planned.get(baseline, 0) < auto.max_seeds:
        chosen.insert(0, baseline)
    return chosen[: max(0, affordable)]


def _near(cell: Sequence[float], base: Sequence[float]) -> float:
    w = stats.welch(cell, base)
    return 1.0 if w is None else w.p_value
