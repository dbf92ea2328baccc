"""seeds=auto (orchestrator/stopping/seeds.py): seeds only for ambiguous cells, up to max and the budget."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from orchestrator.stopping.seeds import AutoSeeds, more_seeds, verdicts


def _seeds(mean: float, n: int, sd: float, rnd: random.Random) -> list[float]:
    return [mean + rnd.gauss(0, sd) for _ in range(n)]


def _sweep() -> dict[str, list[float]]:
    return {
        "base": [1.00, 1.01, 0.99],
        "clearly_worse": [2.00, 2.01, 1.99],
        "unclear": [1.05, 0.97, 1.03],
    }


def test_only_the_ambiguous_cell_gets_a_seed() -> None:
    finals = _sweep()
    auto = AutoSeeds(min_seeds=3, max_seeds=6)
    assert verdicts(auto, "base", finals) == {"clearly_worse": True, "unclear": False}
    assert more_seeds(auto, "base", finals, {c: 3 for c in finals}, affordable=10) == ["unclear"]


def test_no_seed_past_the_maximum_or_the_budget() -> None:
    finals = _sweep()
    auto = AutoSeeds(min_seeds=3, max_seeds=3)
    assert more_seeds(auto, "base", finals, {c: 3 for c in finals}, affordable=10) == []
    assert more_seeds(AutoSeeds(max_seeds=6), "base", finals, {c: 3 for c in finals}, affordable=0) == []


def test_nothing_is_judged_while_seeds_are_still_running() -> None:
    finals = _sweep()
    planned = {c: 3 for c in finals} | {"unclear": 4}
    assert more_seeds(AutoSeeds(max_seeds=6), "base", finals, planned, affordable=10) == []


def test_the_baseline_gets_a_seed_when_every_comparison_needs_one() -> None:
    rnd = random.Random(3)
    finals = {c: _seeds(1.0, 3, 0.05, rnd) for c in ("base", "a", "b")}
    chosen = more_seeds(AutoSeeds(max_seeds=6), "base", finals, {c: 3 for c in finals}, affordable=2)
    assert chosen[0] == "base" and len(chosen) == 2


def test_a_margin_makes_as_good_a_clear_verdict() -> None:
    finals = {"base": [1.000, 1.001, 0.999, 1.0005], "same": [0.9995, 1.0, 1.001, 0.999]}
    assert verdicts(AutoSeeds(margin=0.05), "base", finals) == {"same": True}
    assert verdicts(AutoSeeds(), "base", finals) == {"same": False}


def test_max_below_min_is_refused() -> None:
    with pytest.raises(ValidationError):
        AutoSeeds(min_seeds=5, max_seeds=3)
