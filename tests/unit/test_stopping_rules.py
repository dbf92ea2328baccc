"""The early-stopping rules (orchestrator/stopping/): properties over random sweeps, and the numbers."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orchestrator.report import stats
from orchestrator.stopping import halving, rules
from orchestrator.stopping.policy import StopPolicy, rung_steps, value_at
from orchestrator.stopping.progress import Seed, at_rungs
from orchestrator.stopping.rules import AtRung

values = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=0, max_size=8)


@st.composite
def sweeps(draw: st.DrawFn) -> tuple[StopPolicy, list[AtRung], int]:
    rule = draw(st.sampled_from(["baseline", "halving"]))
    policy = StopPolicy(rule=rule, min_seeds=draw(st.integers(2, 4)), alpha=draw(st.floats(0.001, 0.5)))
    cells = draw(st.integers(1, 6))
    seen = [
        AtRung(cell=f"c{i}", rung=r, values=tuple(draw(values)), pending=draw(st.sampled_from([0, 0, 1])))
        for i in range(cells + 1)
        for r in range(len(policy.rungs))
    ]
    return policy, seen, cells


def _decide(policy: StopPolicy, seen: list[AtRung], cells: int, looked=(), stopped=()) -> list[rules.Look]:
    if policy.rule == "halving":
        return halving.decide(policy, "c0", seen, looked, stopped)
    return rules.decide(policy, "c0", cells, seen, looked, stopped)


@settings(max_examples=150, deadline=None)
@given(sweeps())
def test_never_the_baseline_never_too_few_seeds_never_twice(sweep: tuple[StopPolicy, list[AtRung], int]) -> None:
    policy, seen, cells = sweep
    looks = _decide(policy, seen, cells)
    by = {(a.cell, a.rung): a for a in seen}
    assert all(v.cell != "c0" for v in looks)
    assert all(v.n_cell >= policy.min_seeds and by[(v.cell, v.rung)].pending == 0 for v in looks)
    assert len({(v.cell, v.rung) for v in looks}) == len(looks)
    again = _decide(policy, seen, cells, looked={(v.cell, v.rung) for v in looks})
    assert not {(v.cell, v.rung) for v in again} & {(v.cell, v.rung) for v in looks}
    stopped = {v.cell for v in looks if v.stop}
    after = _decide(policy, seen, cells, stopped=stopped)
    assert not {v.cell for v in after} & stopped


@settings(max_examples=150, deadline=None)
@given(sweeps())
def test_a_stop_is_a_p_value_under_its_share_of_alpha(sweep: tuple[StopPolicy, list[AtRung], int]) -> None:
    policy, seen, cells = sweep
    if policy.rule != "baseline":
        return
    for v in rules.decide(policy, "c0", cells, seen, (), ()):
        assert v.threshold == pytest.approx(policy.spent(v.rung) / cells)
        assert v.p_value is not None and v.stop == (v.p_value <= v.threshold)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.001, 0.5), st.lists(st.floats(0.01, 0.99), min_size=1, max_size=8, unique=True))
def test_the_shares_of_alpha_add_up_to_alpha(alpha: float, fractions: list[float]) -> None:
    policy = StopPolicy(rule="baseline", alpha=alpha, rungs=tuple(sorted(fractions)))
    shares = [policy.spent(k) for k in range(len(policy.rungs))]
    assert all(s > 0 for s in shares)
    assert math.fsum(shares) == pytest.approx(alpha)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=3, max_size=6), st.floats(0.01, 100))
def test_worse_goes_with_the_direction_and_margin(base: list[float], shift: float) -> None:
    worse = [v + shift for v in base]
    lo = StopPolicy(rule="baseline")
    hi = StopPolicy(rule="baseline", direction="max")
    tested_lo, tested_hi = rules.worse_test(lo, worse, base), rules.worse_test(hi, worse, base)
    assert tested_lo is not None and tested_hi is not None
    assert tested_lo[1] <= 0.5 <= tested_hi[1]
    wide = StopPolicy(rule="baseline", margin=shift * 2)
    tested_wide = rules.worse_test(wide, worse, base)
    assert tested_wide is not None and tested_wide[1] >= 0.5


def test_a_clearly_worse_cell_stops_and_an_equal_one_does_not() -> None:
    rnd = random.Random(4)
    base = tuple(1.0 + rnd.gauss(0, 0.01) for _ in range(4))
    seen = [
        AtRung(cell="base", rung=0, values=base),
        AtRung(cell="bad", rung=0, values=tuple(v + 0.5 for v in base)),
        AtRung(cell="same", rung=0, values=tuple(1.0 + rnd.gauss(0, 0.01) for _ in range(4))),
    ]
    looks = {v.cell: v for v in rules.decide(StopPolicy(rule="baseline"), "base", 2, seen, (), ())}
    assert looks["bad"].stop and not looks["same"].stop
    assert "worse than baseline at step 111" in looks["bad"].reason(111)
    waiting = [seen[0], seen[1].model_copy(update={"pending": 1})]
    assert rules.decide(StopPolicy(rule="baseline"), "base", 2, waiting, (), ()) == []


def test_halving_keeps_the_best_share_and_never_the_baseline_stops() -> None:
    seen = [AtRung(cell=f"c{i}", rung=0, values=(float(i), float(i) + 0.1, float(i) - 0.1)) for i in range(7)]
    looks = halving.decide(StopPolicy(rule="halving", keep=0.5), "c0", seen, (), ())
    assert {v.cell for v in looks if not v.stop} == {"c1", "c2", "c3"}
    assert {v.cell for v in looks if v.stop} == {"c4", "c5", "c6"}


def test_bad_policies_are_refused() -> None:
    for bad in ({"rungs": (0.5, 0.2)}, {"alpha": 0.0}, {"min_seeds": 1}, {"rungs": (1.0,)}, {"margin": math.inf}):
        with pytest.raises(ValidationError):
            StopPolicy(rule="baseline", **bad)


def test_rung_steps_and_the_value_at_a_rung() -> None:
    assert rung_steps(StopPolicy(rule="baseline"), 900) == (100, 300)
    curve = ((10, 3.0), (20, math.nan), (30, 2.0))
    assert value_at(curve, 25) == 3.0
    assert value_at(curve, 30) == 2.0
    assert value_at(curve, 31) is None
    assert value_at((), 1) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_is_monotone_at_least_raw_and_at_most_bonferroni(ps: list[float]) -> None:
    adj = stats.holm(ps)
    m = len(ps)
    assert all(p <= a + 1e-12 and a <= min(1.0, m * p) + 1e-12 for p, a in zip(ps, adj, strict=True))
    order = sorted(range(m), key=lambda i: ps[i])
    assert all(adj[order[i]] <= adj[order[i + 1]] for i in range(m - 1))


def test_the_rungs_are_read_from_the_collected_curves() -> None:
    policy = StopPolicy(rule="baseline", rungs=(0.1, 0.5))
    done = Seed(job_id="a", live=False, total_steps=100, curve=((5, 3.0), (10, 2.5), (50, 2.0), (100, 1.0)))
    early = Seed(job_id="b", live=True, total_steps=100, curve=((5, 3.0), (12, math.inf)))
    died = Seed(job_id="c", live=False, total_steps=100, curve=((5, 3.0),))
    seen = {(a.cell, a.rung): a for a in at_rungs(policy, {"x": [done, early, died]})}
    assert seen[("x", 0)].values == (2.5, 3.0) and seen[("x", 0)].pending == 0
    assert seen[("x", 1)].values == (2.0,) and seen[("x", 1)].pending == 1
