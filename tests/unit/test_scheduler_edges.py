"""The scheduler's exact edges: estimates, the plan's order and polish, and work stealing.

Each case pins one rule of orchestrator/scheduling/scheduler.py with numbers small enough to check by hand
(the comments do the arithmetic); test_scheduler.py holds the broader properties.
"""

from __future__ import annotations

import pytest

from orchestrator.core.specs import HostSlots
from orchestrator.scheduling import estimates, list_scheduling, scheduler
from orchestrator.scheduling.estimates import EpochRates, epoch_rates, estimate_s
from orchestrator.scheduling.placements import Placement, Plan, PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.scheduling.stealing import Move, QueuedJob, plan_steals

# --- estimates -----------------------------------------------------------------------------------


def test_history_rates_skip_runs_without_epochs_or_time() -> None:
    history = [("a.yaml", "t", 0, 50.0), ("a.yaml", "t", 2, 0.0), ("a.yaml", "t", 1, 1.0), ("a.yaml", "t", 2, 20.0)]
    # kept: 1 s / 1 epoch and 20 s / 2 epochs -> (1 + 10) / 2; a skipped run does not end the scan
    rates = epoch_rates(history)
    assert (rates.by_config_task, rates.by_task) == ({("a.yaml", "t"): 5.5}, {"t": 5.5})
    assert rates.whole_runs == {("a.yaml", "t"): [50.0]}  # a run without epochs counts as a whole run
    one = epoch_rates([("a.yaml", "t", 1, 30.0)])
    assert (one.by_config_task, one.by_task) == ({("a.yaml", "t"): 30.0}, {"t": 30.0})
    assert isinstance(one, EpochRates)


def test_est_min_wins_only_when_positive_and_unknown_epochs_are_only_guessed() -> None:
    assert estimate_s(config="a", task="t", epochs=3, est_min=1.0) == 60.0
    assert estimate_s(config="a", task="t", epochs=2, est_min=0.0) == 2 * estimates.DEFAULT_EST_S_PER_EPOCH
    guess = estimate_s(config="a", task="t", epochs=None)  # orders the plan; never shown
    assert guess > 0 and estimates.estimate_source(config="a", task="t", epochs=None, est_min=None,
                                                   rates=epoch_rates([])) is None
    rates = epoch_rates([("a", "t", 0, 40.0), ("a", "t", 0, 60.0), ("", "", 0, 9.0)])
    assert estimate_s(config="a", task="t", epochs=0, history=rates) == 50.0
    assert estimates.estimate_source(config="a", task="t", epochs=0, est_min=None, rates=rates) == "history of 2 runs"
    # jobs without a config path are not alike: another project's runs are no history of this one
    assert estimates.estimate_source(config="", task="", epochs=None, est_min=None, rates=rates) is None


# --- plan --------------------------------------------------------------------------------------


def test_nothing_to_plan_frees_busy_slots_at_once() -> None:
    assert plan([], [HostSlots(host="h1", total=2, busy=1)]) == Plan((), (), (), {"h1": 0.0}, 0.0)


def test_no_usable_host_leaves_every_job_unplaced_and_no_makespan() -> None:
    down = HostSlots(host="h1", total=1, usable=False, reason="unreachable since 14:02Z")
    result = plan([PlanJob("a", 1, 10.0), PlanJob("b", 1, 5.0)], [down])
    why = "no usable host (h1 unreachable since 14:02Z)"
    assert result == Plan((), (("a", why), ("b", why)), (), {}, 0.0)


def test_a_usable_host_without_slots_finishes_at_zero() -> None:
    result = plan([PlanJob("a", 1, 4.0)], [HostSlots(host="h0", total=0), HostSlots(host="h1", total=1)])
    assert result.host_finish_s == {"h0": 0.0, "h1": 4.0}
    assert result.makespan_s == 4.0


def test_busy_slots_free_after_the_mean_estimate_even_below_a_second() -> None:
    result = plan([PlanJob("a", 1, 0.5)], [HostSlots(host="h1", total=1, busy=1)])
    assert result.placements == (Placement("a", "h1", 0.5, 1.0),)


def test_work_is_estimate_times_slots_and_ties_go_by_id() -> None:
    """z (2 slots x 10 s = 20) goes before b and c (10 each); at the lower bound (40 / 2 = 20) the
    plan is kept as is."""
    result = plan([PlanJob("b", 1, 10.0), PlanJob("c", 1, 10.0), PlanJob("z", 2, 10.0)], [HostSlots(host="h", total=2)])
    assert result.placements == (Placement("z", "h", 0.0, 10.0), Placement("b", "h", 10.0, 20.0),
                                 Placement("c", "h", 10.0, 20.0))


def test_sub_second_jobs_keep_their_own_length_and_order() -> None:
    result = plan([PlanJob("a", 1, 0.5), PlanJob("b", 1, 0.8)], [HostSlots(host="h", total=1)])
    assert result.placements == (Placement("b", "h", 0.0, 0.8), Placement("a", "h", 0.8, 1.3))


def test_a_plan_at_the_lower_bound_is_not_polished() -> None:
    """2 slots at speed 0.5: the 1 s job takes 2 s, the bound (the longest job on the fastest
    host).  Longest first already ends there, so the zero-length 2-slot job stays behind it,
    although putting it first would balance the slots better."""
    result = plan([PlanJob("long", 1, 1.0), PlanJob("wide", 2, 0.0)], [HostSlots(host="h", total=2, speed=0.5)])
    assert result.placements == (Placement("long", "h", 0.0, 2.0), Placement("wide", "h", 2.0, 2.0))


def test_polishing_places_a_job_the_longest_first_order_could_not() -> None:
    """Longest first puts a (6 GB) on h1 (8 GB), which leaves c without room anywhere; the swap
    b-first sends a to h2 (6 GB) and every job fits."""
    jobs = [PlanJob("a", 1, 10.0, disk_bytes=6), PlanJob("b", 1, 5.0, disk_bytes=4), PlanJob("c", 1, 4.0, disk_bytes=4)]
    hosts = [HostSlots(host="h1", total=1, disk_free_bytes=8), HostSlots(host="h2", total=1, disk_free_bytes=6)]
    result = plan(jobs, hosts)
    assert result.unplaced == ()
    assert result.placements == (Placement("b", "h1", 0.0, 5.0), Placement("a", "h2", 0.0, 10.0),
                                 Placement("c", "h1", 5.0, 9.0))


def test_polishing_tries_the_last_pair_too() -> None:
    """Longest first: c (2 slots, 7 s), a, b (ties by id).  Only swapping the last two helps: the
    2-slot b before the 1-slot a frees one slot at 10 s instead of 16 s (same makespan)."""
    jobs = [PlanJob("a", 1, 6.0), PlanJob("b", 2, 3.0), PlanJob("c", 2, 7.0)]
    result = plan(jobs, [HostSlots(host="h1", total=2)])
    assert result.placements == (Placement("c", "h1", 0.0, 7.0), Placement("b", "h1", 7.0, 10.0),
                                 Placement("a", "h1", 10.0, 16.0))


def test_polishing_swaps_pairs_in_order_and_stops_at_the_bound() -> None:
    """Same inputs, same plan: the swaps go (0,1), (0,2), (1,2), ... and the first plan that ends at
    the lower bound (5 s: the longest job) is the answer."""
    jobs = [PlanJob("a", 1, 5.0), PlanJob("b", 1, 3.0), PlanJob("c", 2, 1.0)]
    result = plan(jobs, [HostSlots(host="h1", total=2), HostSlots(host="h2", total=1)])
    assert result.placements == (Placement("c", "h1", 0.0, 1.0), Placement("a", "h2", 0.0, 5.0),
                                 Placement("b", "h1", 1.0, 4.0))


P = Placement
EXACT_PLANS = {
    # a and c have the same shape: that swap is skipped, the rest of its row is not (b first: 12 s, not 15 s)
    "same-shape pair skipped, row goes on": (
        [PlanJob("a", 2, 6.0), PlanJob("b", 1, 9.0), PlanJob("c", 2, 6.0)], [HostSlots(host="h1", total=3)],
        (P("b", "h1", 0.0, 9.0), P("c", "h1", 0.0, 6.0), P("a", "h1", 6.0, 12.0))),
    # a round that improved is followed by another round
    "another round after an improving one": (
        [PlanJob("a", 2, 3.0), PlanJob("b", 2, 8.0), PlanJob("c", 1, 5.0)],
        [HostSlots(host="h1", total=3, slot_free_at=(5.0, 5.0, 4.0))],
        (P("c", "h1", 4.0, 9.0), P("a", "h1", 5.0, 8.0), P("b", "h1", 8.0, 16.0))),
    # the bound counts the 0.5 s job as 0.5 s x 2 slots: (1 + 1) / 2 = 1 < 1.5, so the polish runs
    "sub-second work in the bound": (
        [PlanJob("a", 1, 1.0), PlanJob("b", 2, 0.5)], [HostSlots(host="h1", total=2)],
        (P("b", "h1", 0.0, 0.5), P("a", "h1", 0.5, 1.5))),
    # the longest job on the fastest host: 0.5 s / 0.5 = 1 s; the work term (2.5 / 1.5) is the bound
    "sub-second longest job in the bound": (
        [PlanJob("a", 2, 0.5), PlanJob("b", 1, 0.5)],
        [HostSlots(host="h1", total=3, slot_free_at=(1.0, 1.0, 0.0), speed=0.5)],
        (P("b", "h1", 0.0, 1.0), P("a", "h1", 1.0, 2.0))),
}


@pytest.mark.parametrize("case", list(EXACT_PLANS))
def test_exact_plans(case: str) -> None:
    jobs, hosts, placements = EXACT_PLANS[case]
    assert plan(jobs, hosts).placements == placements


def test_pinned_to_an_unknown_host_names_the_known_ones() -> None:
    job = PlanJob("a", 1, 1.0, host_pin="hx")
    assert plan([job], [HostSlots(host="h2", total=1), HostSlots(host="h1", total=1)]).unplaced == (
        ("a", "pinned to host hx, which is not among the hosts to plan on (h1, h2)"),)
    assert plan([job], []).unplaced == (("a", "pinned to host hx, which is not among the hosts to plan on (none)"),)


def _jobs_never_at_the_bound() -> list[PlanJob]:
    # 8 jobs of 10..17 s (108 s) on 3 one-slot hosts: the bound is 36 s, but a host that runs only
    # 2 of them ends by 33 s, leaving >= 75 s to the other two: no order reaches the bound, so the
    # polish runs until its budget is spent
    return [PlanJob(f"j{i}", 1, 10.0 + i) for i in range(8)]


@pytest.mark.parametrize(("budget", "trials"), [(42, 4), (16, 1), (8, 0)])
def test_the_polish_spends_exactly_its_budget(monkeypatch: pytest.MonkeyPatch, budget: int, trials: int) -> None:
    """IMPROVE_BUDGET // jobs - 1 trial plans (42 // 8 - 1 = 4), after the longest-first one."""
    runs = []
    original = list_scheduling.ListScheduler.run

    def counted(self: list_scheduling.ListScheduler, order: list[PlanJob]) -> list_scheduling.SchedulingPass:
        runs.append(1)
        return original(self, order)

    monkeypatch.setattr(scheduler, "IMPROVE_BUDGET", budget)
    monkeypatch.setattr(list_scheduling.ListScheduler, "run", counted)
    plan(_jobs_never_at_the_bound(), [HostSlots(host=f"h{i}", total=1) for i in range(3)])
    assert len(runs) == 1 + trials


# --- work stealing -------------------------------------------------------------------------------


def _idle(name: str, total: int = 1, **kw: object) -> HostSlots:
    return HostSlots(host=name, total=total, **kw)  # type: ignore[arg-type]


def test_nothing_queued_moves_nothing() -> None:
    assert plan_steals({}, [_idle("h1")]) == []
    assert plan_steals({"h1": [], "h2": []}, [_idle("h1"), _idle("h2")]) == []


def test_a_job_too_big_for_its_host_moves_to_one_that_fits() -> None:
    assert plan_steals({"h1": [QueuedJob("big", 3, 10.0)], "h2": []}, [_idle("h1", 2), _idle("h2", 4)]) == [
        Move("big", "h1", "h2")]


def test_a_zero_length_job_ahead_does_not_break_the_projection() -> None:
    """a (0 s) starts and ends at once; b then starts at 0 on h1 too: nothing to move.  (This used to
    crash: the projection dropped b.)"""
    assert plan_steals({"h1": [QueuedJob("a", 1, 0.0), QueuedJob("b", 1, 5.0)], "h2": []},
                       [_idle("h1"), _idle("h2")]) == []


def test_a_move_must_finish_strictly_earlier() -> None:
    """On h1, b waits 0.5 s behind a and ends at 10.5 s.  h2 at speed 0.95 would end it at 10.53 s:
    stay; at speed 1.0, 10 s: move."""
    queue = {"h1": [QueuedJob("a", 1, 0.5), QueuedJob("b", 1, 10.0)], "h2": []}
    assert plan_steals(queue, [_idle("h1"), _idle("h2", speed=0.95)]) == []
    assert plan_steals(queue, [_idle("h1"), _idle("h2", speed=1.0)]) == [Move("b", "h1", "h2")]
    # a tie stays: h1's slot frees at 4 s, so the 12 s job ends at 16 s there; at speed 0.75, 16 s
    tie = {"h1": [QueuedJob("c", 1, 12.0)], "h2": []}
    assert plan_steals(tie, [_idle("h1", slot_free_at=(4.0,)), _idle("h2", speed=0.75)]) == []


def test_a_sub_second_job_moves_by_its_own_length() -> None:
    """h1 frees at 0.3 s, so the 0.5 s job ends at 0.8 s; on h2 it ends at 0.5 s."""
    assert plan_steals({"h1": [QueuedJob("a", 1, 0.5)], "h2": []},
                       [_idle("h1", slot_free_at=(0.3,)), _idle("h2")]) == [Move("a", "h1", "h2")]


def test_a_job_its_agent_starts_now_stays_even_for_a_faster_host() -> None:
    assert plan_steals({"h1": [QueuedJob("a", 1, 5.0)], "h2": []}, [_idle("h1"), _idle("h2", speed=2.0)]) == []


def test_only_slots_free_now_take_work() -> None:
    """h2's slot frees in 0.5 s: not free now, so b (waiting 5 s on h1) stays."""
    queue = {"h1": [QueuedJob("a", 1, 5.0), QueuedJob("b", 1, 5.0)], "h2": []}
    assert plan_steals(queue, [_idle("h1"), _idle("h2", slot_free_at=(0.5,))]) == []
    assert plan_steals(queue, [_idle("h1"), _idle("h2", total=0)]) == []


def test_unknown_busy_slots_free_after_the_mean_queued_estimate() -> None:
    """h1's one slot is busy for an unknown time: taken as the mean of the queued estimates (4 s), so
    a runs 4-6 s and b 6-12 s.  h2 at speed 0.5 would end b at 12 s (not earlier) but a at 4 s."""
    queue = {"h1": [QueuedJob("a", 1, 2.0), QueuedJob("b", 1, 6.0)], "h2": []}
    assert plan_steals(queue, [_idle("h1", busy=1), _idle("h2", speed=0.5)]) == [Move("a", "h1", "h2")]
    # with sub-second estimates the horizon is their mean too (0.25 s): nothing gains on h2
    small = {"h1": [QueuedJob("a", 1, 0.25), QueuedJob("b", 1, 0.25)], "h2": []}
    assert plan_steals(small, [_idle("h1", busy=1), _idle("h2", speed=0.25)]) == []


def test_the_target_keeps_disk_for_its_own_queue_and_for_earlier_moves() -> None:
    # h2's budget of 10 bytes keeps 8 for its own queued c: b (4) does not fit
    queue = {"h1": [QueuedJob("a", 1, 5.0), QueuedJob("b", 1, 5.0, disk_bytes=4)],
             "h2": [QueuedJob("c", 1, 5.0, disk_bytes=8)]}
    assert plan_steals(queue, [_idle("h1"), _idle("h2", 2, disk_free_bytes=10)]) == []
    # an exact fit moves (c: 4, then b: the 6 left); with c at 5, b no longer fits
    queue = {"h1": [QueuedJob("a", 1, 5.0), QueuedJob("b", 1, 5.0, disk_bytes=6), QueuedJob("c", 1, 5.0, disk_bytes=4)],
             "h2": []}
    assert plan_steals(queue, [_idle("h1"), _idle("h2", 2, disk_free_bytes=10)]) == [Move("c", "h1", "h2"),
                                                                                       Move("b", "h1", "h2")]
    queue["h1"][2] = QueuedJob("c", 1, 5.0, disk_bytes=5)
    assert plan_steals(queue, [_idle("h1"), _idle("h2", 2, disk_free_bytes=10)]) == [Move("c", "h1", "h2")]


def test_jobs_on_an_unusable_host_move_first() -> None:
    """h1 is unreachable (drain: never), so its a goes to the one free slot before h2's waiting b."""
    queue = {"h1": [QueuedJob("a", 1, 5.0)], "h2": [QueuedJob("x", 1, 5.0), QueuedJob("b", 1, 5.0)], "h3": []}
    hosts = [_idle("h1", usable=False, reason="unreachable"), _idle("h2"), _idle("h3")]
    assert plan_steals(queue, hosts) == [Move("a", "h1", "h3")]


def test_a_pinned_job_at_the_tail_does_not_shield_the_ones_before_it() -> None:
    queue = {"h1": [QueuedJob("x", 1, 5.0), QueuedJob("b", 1, 5.0), QueuedJob("p", 1, 5.0, host_pin="h1")], "h2": []}
    assert plan_steals(queue, [_idle("h1"), _idle("h2")]) == [Move("b", "h1", "h2")]
