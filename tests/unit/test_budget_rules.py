"""A sweep's budget as pure rules (orchestrator/money/budget.py): what a live attempt still commits, what a job
would cost, which jobs a capped sweep starts and the words that say why the others wait, and how a projection
names the jobs it could not price."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.core.states import AttemptState
from orchestrator.money import budget

SWEEP = "qrule001"
T0 = 1_800_000_000.0
HOUR = 3600.0


@dataclass(frozen=True)
class _Att:
    job_id: str
    state: str
    started_at: float | None
    ended_at: float | None = None
    price_per_hour: float | None = 4.0
    gpu_share: float = 0.5


def test_a_live_attempt_commits_what_is_left_of_its_estimate_at_its_own_share() -> None:
    running = _Att("j", AttemptState.RUNNING.value, T0)
    assert budget.remaining_cost(running, 2 * HOUR, T0 + HOUR / 2) == pytest.approx(1.5 * 4.0 * 0.5)
    assert budget.remaining_cost(running, HOUR, T0 + 2 * HOUR) == 0.0  # past its estimate: nothing more
    assert budget.remaining_cost(running, HOUR, T0) == pytest.approx(2.0)  # just started: all of it
    placed = _Att("j", AttemptState.STARTING.value, None)
    assert budget.remaining_cost(placed, HOUR, T0) == pytest.approx(2.0)  # the whole estimate before it started


@pytest.mark.parametrize("state", [AttemptState.EXITED, AttemptState.PREEMPTED, AttemptState.LOST])
def test_an_attempt_that_ended_commits_nothing(state: AttemptState) -> None:
    assert budget.remaining_cost(_Att("j", state.value, T0, T0 + 60), 10 * HOUR, T0 + 120) == 0.0


def test_an_attempt_on_a_host_without_a_price_commits_nothing() -> None:
    assert budget.remaining_cost(_Att("j", AttemptState.RUNNING.value, T0, price_per_hour=None), HOUR, T0) == 0.0


def test_a_jobs_projected_cost_is_its_estimate_at_its_price_share() -> None:
    assert budget.projected_cost(HOUR, (2.0, 0.5)) == 1.0
    assert budget.projected_cost(90 * 60, (8.0, 0.25)) == 3.0
    assert budget.projected_cost(10 * HOUR, None) == 0.0


def test_without_a_cap_every_job_starts_and_none_is_held() -> None:
    got = budget.admit(SWEEP, budget.Standing(None, spent=1e9), [("a", 5.0), ("b", 7.0)])
    assert got.admitted == ("a", "b") and got.held == {} and not got.stopped and got.needs is None


def test_a_held_sweep_needs_what_its_first_held_job_costs() -> None:
    got = budget.admit(SWEEP, budget.Standing(10.0, spent=9.0), [("a", 0.5), ("b", 2.0), ("c", 0.25)])
    assert got.admitted == ("a",) and list(got.held) == ["b", "c"] and got.stopped
    assert got.added == 0.5 and got.needs == 2.0


def test_a_reached_cap_says_so_and_how_to_raise_it() -> None:
    assert budget.hold_reason(SWEEP, budget.Standing(10.0, spent=7.5, committed=2.5)) == (
        "budget: the sweep's budget of $10.00 is reached ($7.50 spent + $2.50 committed); "
        f"`gpuq budget {SWEEP} USD` raises it")


def test_a_job_that_costs_the_whole_cap_fits_an_empty_budget_and_says_so_when_it_does_not_fit() -> None:
    """Only a job dearer than the cap is "more than the sweep's budget": one that costs it exactly would fit
    the sweep with nothing spent."""
    why = budget.hold_reason(SWEEP, budget.Standing(1.0, spent=0.5), 1.0)
    assert why.startswith("budget: the sweep's budget of $1.00 does not fit it ($0.50 spent + $0.00 committed; "
                          "it needs about $1.00)")
    assert "it alone would cost about $1.01" in budget.hold_reason(SWEEP, budget.Standing(1.0), 1.01)


def test_a_projection_names_three_jobs_it_could_not_estimate_and_counts_the_rest() -> None:
    priced = (2.0, 1.0)
    jobs = [budget.JobCostInput("known", [priced], (HOUR, HOUR))]
    five = budget.project(jobs + [budget.JobCostInput(n, [priced], None) for n in "abcde"])
    assert "5 job(s) without est_min= or history (a, b, c and 2 more) leave the high end open" in five.line()
    three = budget.project(jobs + [budget.JobCostInput(n, [priced], None) for n in "abc"])
    assert "3 job(s) without est_min= or history (a, b, c) leave the high end open" in three.line()
    four = budget.project(jobs + [budget.JobCostInput(n, [priced], None) for n in "abcd"])
    assert "(a, b, c and 1 more)" in four.line()


def test_a_duration_comes_from_a_positive_est_min_else_the_history_of_the_config_before_the_task() -> None:
    history = budget.spreads([("c0.yaml", "t", 2, 100.0), ("c1.yaml", "t", 2, 300.0)])
    by = {"config": "c0.yaml", "task": "t", "epochs": 2, "history": history}
    assert budget.duration_range(est_min=0.5, **by) == (30.0, 30.0)  # type: ignore[arg-type]
    assert budget.duration_range(est_min=0, **by) == (100.0, 100.0)  # type: ignore[arg-type]  # 0: not given
    assert budget.duration_range(est_min=None, **by) == (100.0, 100.0)  # type: ignore[arg-type]


def test_a_projection_of_one_figure_reads_as_one_and_no_job_is_no_projection() -> None:
    exact = budget.project([budget.JobCostInput("a", [(2.0, 1.0)], (HOUR, HOUR))])
    assert exact.line() == "projected cost $2.00"
    span = budget.project([budget.JobCostInput("a", [(2.0, 1.0)], (HOUR, 2 * HOUR))])
    assert span.line() == "projected cost $2.00 .. $4.00"
    unpriced = budget.project([budget.JobCostInput("a", [(2.0, 1.0)], (HOUR, HOUR)),
                               budget.JobCostInput("b", [None], None)])
    assert unpriced.line() == "projected cost $2.00 (1 job(s) on hosts without a price count nothing)"
    nothing = budget.project([])
    assert (nothing.low, nothing.high, nothing.fits(1.0)) == (0.0, 0.0, None)
    assert nothing.line() == "projected cost unknown: no job to price"


def test_without_a_projection_the_dry_run_still_names_the_jobs_it_could_not_place_price_or_estimate() -> None:
    """``submit --dry-run`` reports these lists with the reason there is no figure (api/dryrun.py)."""
    nowhere = budget.JobCostInput("z", [], (HOUR, HOUR))
    placed = budget.project([nowhere])
    assert (placed.unplaceable, placed.why_not) == (("z",), "no host of the sweep can take these jobs now (their "
                                                    "gpu=/gpu_mem=; `gpuq hosts list` shows each host's GPUs)")
    free = budget.project([budget.JobCostInput("a", [None], None), nowhere])
    assert (free.unpriced, free.unplaceable, free.unestimated) == (("a",), ("z",), ())
    assert free.why_not == ("no host these jobs may run on has a price (gpuq knows the prices of the machines it "
                            "rents: `gpuq up`)")
    guess = budget.project([budget.JobCostInput("a", [(2.0, 1.0)], None), nowhere])
    assert (guess.unestimated, guess.unplaceable, guess.unpriced) == (("a",), ("z",), ())
    assert guess.why_not == ("no job has an estimate (give est_min= on the queue lines, or let one job of each "
                             "config run first)")


def test_a_standing_reads_as_spent_committed_and_the_cap_and_says_when_it_guessed() -> None:
    assert budget.Standing(10.0, 3.0, 2.0).line() == "$3.00 spent + $2.00 committed of $10.00 (50%)"
    assert budget.Standing(None, 3.0).line() == "$3.00 spent + $0.00 committed, no cap"
    assert budget.Standing(10.0, 3.0, 2.0, placeholders=2).line() == (
        "$3.00 spent + $2.00 committed of $10.00 (50%) (2 running job(s) without an estimate counted at the "
        "scheduler's placeholder)")


def test_a_projection_shows_a_span_of_cents_and_every_note() -> None:
    near = budget.project([budget.JobCostInput("a", [(2.0, 1.0)], (HOUR, 1.25 * HOUR))])
    assert near.line() == "projected cost $2.00 .. $2.50"
    both = budget.project([budget.JobCostInput("a", [(2.0, 1.0)], (HOUR, HOUR)), budget.JobCostInput("b", [None], None),
                           budget.JobCostInput("z", [], None)])
    assert both.line() == ("projected cost $2.00 (1 job(s) on hosts without a price count nothing; 1 job(s) no host "
                           "can take now (z: their gpu=/gpu_mem=) are not counted)")


# -- the user's monthly cap (budget_usd_month) ------------------------------------------------------------------

def test_a_month_starts_at_midnight_utc_on_its_first_day() -> None:
    start = budget.month_start(T0)  # 2027-01-15T08:00:00Z
    assert start == 1_798_761_600.0  # 2027-01-01T00:00:00Z
    assert budget.month_start(start) == start and budget.month_start(start - 1) == 1_796_083_200.0  # 2026-12-01
    assert budget.month_start(1_801_439_999.0) == start  # 2027-01-31T23:59:59Z


def test_what_a_month_spent_is_each_attempts_time_inside_it_at_its_share() -> None:
    since = T0
    attempts = [
        _Att("a", AttemptState.EXITED.value, since - HOUR, since + HOUR),  # half inside: 1 h
        _Att("b", AttemptState.RUNNING.value, since + HOUR),  # running: to now, 1 h
        _Att("c", AttemptState.EXITED.value, since - 2 * HOUR, since - HOUR),  # last month: nothing
        _Att("d", AttemptState.STARTING.value, None),  # never started: nothing
        _Att("e", AttemptState.EXITED.value, since, since + HOUR, price_per_hour=None),  # unpriced: nothing
        _Att("f", AttemptState.EXITED.value, since, since + 3 * HOUR, gpu_share=1.0),  # ends after now: 2 h
    ]
    assert budget.spent_between(attempts, since, since + 2 * HOUR) == pytest.approx(2.0 + 2.0 + 8.0)
    assert budget.spent_between([], since, since + HOUR) == 0.0


@pytest.mark.parametrize(("cap", "spent", "stops"), [(None, 1e6, False), (10.0, 9.99, False), (10.0, 10.0, True),
                                                     (10.0, 12.5, True)])
def test_the_monthly_cap_stops_dispatch_from_the_cap_on(cap: float | None, spent: float, stops: bool) -> None:
    why = budget.month_stop(cap, spent)
    assert (why is not None) is stops
    if why is not None:
        assert why == (f"budget_usd_month: ${spent:,.2f} spent this month of the $10.00 monthly cap; nothing new "
                       "starts until next month or a higher budget_usd_month")
