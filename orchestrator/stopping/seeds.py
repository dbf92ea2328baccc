"""``seeds=auto`` (pure): after the first seeds finish, which cells get one more seed.

A cell's verdict against the baseline is clear when its Holm-adjusted Welch p is at or under alpha
(it differs), or, with a margin, when the (1 - alpha) interval of the difference lies within
+-margin (it is as good).  Otherwise it is ambiguous and gets a seed, until ``max_seeds`` or the
budget (``affordable`` more seeds) is reached; the baseline gets one too when every comparison is
ambiguous.  Cells nearest a verdict (smallest adjusted p) go first when the budget is short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.report import stats
from orchestrator.stopping.policy import StopPolicy


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


def auto_of(policy: StopPolicy | None) -> AutoSeeds:
    """The verdicts' level for a sweep: its ``[stop]`` policy's alpha and margin when it has one, else the
    defaults (the bounds are each line's own: ``seeds=auto:MIN..MAX``)."""
    if policy is None:
        return AutoSeeds(min_seeds=2, max_seeds=64)
    return AutoSeeds(min_seeds=2, max_seeds=64, alpha=policy.alpha, margin=policy.margin)


def describe(auto: AutoSeeds, cells: Mapping[str, tuple[int, int]], budget_usd: float | None) -> str:
    """One line for the dry run: what seeds=auto will do with ``cells`` ({cell: (seeds now, most seeds)})."""
    bounds = ", ".join(f"{c} {now}..{most}" for c, (now, most) in sorted(cells.items()))
    clear = f"Holm-adjusted Welch p <= {auto.alpha:g}"
    if auto.margin:
        clear += f", or its {1 - auto.alpha:.0%} interval within +-{auto.margin:g}"
    cap = f", or the sweep's budget of ${budget_usd:,.2f} is spent" if budget_usd is not None else ""
    return (f"seeds=auto: {bounds} seeds; once every job has ended, each cell whose verdict against baseline is "
            f"ambiguous gets one more seed (clear: {clear}; the baseline too when every comparison is ambiguous), "
            f"until its verdict is clear, it has its most seeds{cap}")


class CellSeeds(BaseModel):
    """What the rule sees of one cell once its seeds so far have ended: their final values, how many seeds
    it has had (in any state: a failed seed counts towards its bound), and its bound (its line's
    ``seeds=auto`` MAX, or ``seeds`` itself for a fixed number of seeds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    finals: tuple[Annotated[float, Field(allow_inf_nan=False)], ...] = Field(max_length=4096)
    seeds: int = Field(ge=0, le=4096)
    most: int = Field(ge=0, le=4096)


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


def choose(auto: AutoSeeds, baseline: str, cells: Mapping[str, CellSeeds]) -> list[str]:
    """The cells (the baseline included) to give one more seed now, all of them, nearest a verdict first:
    each compared cell whose verdict is ambiguous and that is under its bound; the baseline first, when
    every comparison is ambiguous and it is under its own."""
    finals = {c: s.finals for c, s in cells.items()}
    clear = verdicts(auto, baseline, finals)
    ambiguous = [c for c, ok in clear.items() if not ok and cells[c].seeds < cells[c].most]
    base = finals.get(baseline, ())
    order = {c: _near(finals[c], base) for c in ambiguous}
    chosen = sorted(ambiguous, key=lambda c: (order[c], c))
    room = baseline in cells and cells[baseline].seeds < cells[baseline].most
    if clear and not any(clear.values()) and room:
        chosen.insert(0, baseline)
    return chosen


def afford(chosen: Sequence[str], cost: Mapping[str, float], left: float | None) -> tuple[list[str], list[str]]:
    """``chosen`` split into the seeds the budget affords, in order, and those it does not: each costs its
    cell's ``cost`` (0 when unknown); ``left`` is what the sweep's cap leaves (None: no cap).  The first
    that does not fit holds it and every later one, as dispatch holds a capped sweep's plan."""
    if left is None:
        return list(chosen), []
    spent = 0.0
    for i, cell in enumerate(chosen):
        spent += max(0.0, cost.get(cell, 0.0))
        if spent > left + 1e-9:
            return list(chosen[:i]), list(chosen[i:])
    return list(chosen), []


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
    cells = {c: CellSeeds(finals=tuple(v), seeds=planned.get(c, 0), most=auto.max_seeds) for c, v in finals.items()}
    return choose(auto, baseline, cells)[: max(0, affordable)]


def _near(cell: Sequence[float], base: Sequence[float]) -> float:
    w = stats.welch(cell, base)
    return 1.0 if w is None else w.p_value
