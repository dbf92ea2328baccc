"""scheduler is pure: table-driven cases, no sockets, no clock."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.specs import HostSlots, JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Ledger
from orchestrator.scheduling.estimates import DEFAULT_EST_S_PER_EPOCH, epoch_rates, estimate_s
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.scheduling.stealing import Move, QueuedJob, plan_steals

GB = 10**9


def _hosts(n: int, slots: int) -> list[HostSlots]:
    return [HostSlots(host=f"h{i}", total=slots) for i in range(1, n + 1)]


def _lower_bound(jobs: Sequence[PlanJob], slots: int) -> float:
    return max(sum(j.est_s * j.gpus for j in jobs) / slots, max(j.est_s for j in jobs))


def _check_consistent(result: Plan, jobs: Sequence[PlanJob], hosts: Sequence[HostSlots]) -> None:
    """Every job placed once; on each host, at no time are more slots in use than it has."""
    gpus = {j.job_id: j.gpus for j in jobs}
    assert sorted(p.job_id for p in result.placements) == sorted(a.job_id for a in result.assignments)
    assert len({p.job_id for p in result.placements}) == len(result.placements)
    for h in hosts:
        mine = [p for p in result.placements if p.host == h.host]
        for p in mine:
            in_use = sum(gpus[q.job_id] for q in mine if q.start_s <= p.start_s < q.end_s)
            assert in_use <= h.total


# --- the existing contract ------------------------------------------------------------


def test_longest_first_balances_two_hosts() -> None:
    jobs = [PlanJob("a", 1, 100), PlanJob("b", 1, 90), PlanJob("c", 1, 50), PlanJob("d", 1, 40)]
    result = plan(jobs, [HostSlots(host="h1", total=1), HostSlots(host="h2", total=1)])
    by_host: dict[str, float] = {}
    est = {j.job_id: j.est_s for j in jobs}
    for a in result.assignments:
        by_host[a.host] = by_host.get(a.host, 0) + est[a.job_id]
    assert sorted(by_host.values()) == [140, 140]
    assert result.makespan_s == 140
    assert dict(result.host_finish_s) == {"h1": 140, "h2": 140}


def test_job_too_big_is_unplaced_with_reason() -> None:
    result = plan([PlanJob("big", 4, 10)], [HostSlots(host="h", total=2)])
    assert result.assignments == ()
    assert result.unplaced == (("big", "needs 4 slots (gpus=4); the largest usable host has 2"),)


def test_pin_and_unusable_hosts() -> None:
    hosts = [HostSlots(host="a", total=8), HostSlots(host="b", total=8, usable=False)]
    result = plan([PlanJob("j", 1, 1, host_pin="a"), PlanJob("k", 1, 1, host_pin="b")], hosts)
    assert [(x.job_id, x.host) for x in result.assignments] == [("j", "a")]
    assert result.unplaced[0][0] == "k"


# --- makespan (the benchmark: makespan / ideal <= 1.10) --------------------------------


def test_equal_jobs_fill_every_slot_for_exactly_four_rounds() -> None:
    jobs = [PlanJob(f"j{i:02d}", 1, 600) for i in range(24)]
    result = plan(jobs, _hosts(3, 2))
    assert result.unplaced == ()
    assert result.makespan_s == 4 * 600 == _lower_bound(jobs, 6)
    assert dict(result.host_finish_s) == {"h1": 2400, "h2": 2400, "h3": 2400}
    assert sorted(sum(1 for a in result.assignments if a.host == h) for h in ("h1", "h2", "h3")) == [8, 8, 8]


@pytest.mark.parametrize("seed", range(12))
def test_mixed_durations_within_ten_percent_of_the_lower_bound(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [PlanJob(f"j{i:02d}", 1, rng.uniform(60, 3600)) for i in range(24)]
    hosts = _hosts(3, 2)
    result = plan(jobs, hosts)
    assert result.unplaced == ()
    _check_consistent(result, jobs, hosts)
    assert result.makespan_s <= 1.10 * _lower_bound(jobs, 6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=40))
def test_list_scheduling_bound_holds(durations: list[int]) -> None:
    # Graham: any list schedule on m identical slots ends by sum/m + (1 - 1/m) * longest
    jobs = [PlanJob(f"j{i:02d}", 1, d) for i, d in enumerate(durations)]
    hosts = _hosts(3, 2)
    result = plan(jobs, hosts)
    assert result.unplaced == ()
    _check_consistent(result, jobs, hosts)
    assert result.makespan_s <= sum(durations) / 6 + (1 - 1 / 6) * max(durations) + 1e-6
    assert result.makespan_s == max(p.end_s for p in result.placements)


def test_swaps_fix_what_longest_first_gets_wrong() -> None:
    # LPT on 2 slots: 3+2+2 | 3+2 = 7; the best split is 3+3 | 2+2+2 = 6
    jobs = [PlanJob("a", 1, 3), PlanJob("b", 1, 3), PlanJob("c", 1, 2), PlanJob("d", 1, 2), PlanJob("e", 1, 2)]
    result = plan(jobs, [HostSlots(host="h", total=2)])
    assert result.makespan_s == 6


def _agent(order: Sequence[PlanJob], total: int) -> dict[str, float]:
    """What the host agent does: in created_at order, start each job the moment a slot is free."""
    slots = [0.0] * total
    starts = {}
    for job in order:
        i = min(range(total), key=lambda k: slots[k])
        starts[job.job_id] = slots[i]
        slots[i] += job.est_s
    return starts


@pytest.mark.parametrize("seed", range(5))
def test_the_agent_running_each_hosts_jobs_in_plan_order_reproduces_the_plan(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [PlanJob(f"j{i:02d}", 1, rng.uniform(60, 3600)) for i in range(24)]
    result = plan(jobs, _hosts(3, 2))
    by_id = {j.job_id: j for j in jobs}
    for host in ("h1", "h2", "h3"):
        mine = [p for p in result.placements if p.host == host]
        assert _agent([by_id[p.job_id] for p in mine], 2) == pytest.approx({p.job_id: p.start_s for p in mine})


# --- multi-GPU, disk, unusable hosts, speed --------------------------------------------


def test_two_gpu_job_only_on_a_two_slot_host_and_waits_for_both_slots() -> None:
    hosts = [
        HostSlots(host="small", total=1),
        HostSlots(host="big", total=2, slot_free_at=(0.0, 300.0)),
    ]
    result = plan([PlanJob("pair", 2, 100)], hosts)
    assert [(p.job_id, p.host, p.start_s, p.end_s) for p in result.placements] == [("pair", "big", 300.0, 400.0)]
    assert dict(result.host_finish_s) == {"small": 0.0, "big": 400.0}


def test_busy_slots_without_times_free_at_the_mean_estimate() -> None:
    # h1 has its one slot busy for an unknown time: assumed to free at the mean estimate (100 s)
    result = plan([PlanJob("a", 1, 50), PlanJob("b", 1, 150)], [HostSlots(host="h1", total=1, busy=1),
                                                               HostSlots(host="h2", total=1)])
    assert [(p.job_id, p.host, p.start_s) for p in result.placements] == [("b", "h2", 0.0), ("a", "h1", 100.0)]


def test_disk_budget_is_respected_and_the_reason_names_the_numbers() -> None:
    hosts = [HostSlots(host="a", total=4, disk_free_bytes=25 * GB),
             HostSlots(host="b", total=4, disk_free_bytes=12 * GB)]
    jobs = [PlanJob("j1", 1, 100, disk_bytes=10 * GB), PlanJob("j2", 1, 90, disk_bytes=10 * GB),
            PlanJob("j3", 1, 80, disk_bytes=10 * GB), PlanJob("huge", 1, 10, disk_bytes=30 * GB)]
    result = plan(jobs, hosts)
    placed = {a.job_id: a.host for a in result.assignments}
    # a ties j2 with b on finish and start and wins on name; j3 no longer fits a's 5 GB
    assert placed == {"j1": "a", "j2": "a", "j3": "b"}
    for host in hosts:
        used = sum(j.disk_bytes for j in jobs if placed.get(j.job_id) == host.host)
        assert host.disk_free_bytes is not None and used <= host.disk_free_bytes
    assert result.unplaced == (("huge", "needs 30.0 GB of disk; the most any host has left is 5.0 GB"),)


def test_a_job_that_exactly_fits_the_disk_left_is_placed() -> None:
    """Free space equal to the job's need is enough: the scheduler refuses only a job that needs more."""
    hosts = [HostSlots(host="a", total=2, disk_free_bytes=20 * GB)]
    result = plan([PlanJob("j1", 1, 100, disk_bytes=10 * GB), PlanJob("j2", 1, 90, disk_bytes=10 * GB)], hosts)
    assert sorted((a.job_id, a.host) for a in result.assignments) == [("j1", "a"), ("j2", "a")]
    assert result.unplaced == ()
    exact = plan([PlanJob("x", 1, 5, disk_bytes=12 * GB)], [HostSlots(host="b", total=1, disk_free_bytes=12 * GB)])
    assert [(a.job_id, a.host) for a in exact.assignments] == [("x", "b")] and exact.unplaced == ()


def test_unknown_disk_is_no_limit_and_a_pinned_overflow_names_the_host() -> None:
    hosts = [HostSlots(host="a", total=1, disk_free_bytes=12 * GB), HostSlots(host="b", total=1)]
    result = plan([PlanJob("x", 1, 5, disk_bytes=30 * GB), PlanJob("y", 1, 5, host_pin="a", disk_bytes=30 * GB)],
                  hosts)
    assert [(a.job_id, a.host) for a in result.assignments] == [("x", "b")]
    assert result.unplaced == (("y", "needs 30.0 GB of disk; host a has 12.0 GB left"),)


@pytest.mark.parametrize(
    ("hosts", "job", "reason"),
    [
        ([HostSlots(host="b", total=2, usable=False, reason="unhealthy: GPU 0 ECC errors"),
          HostSlots(host="c", total=2)],
         PlanJob("k", 1, 1, host_pin="b"), "pinned to host b, which is unhealthy: GPU 0 ECC errors"),
        ([HostSlots(host="b", total=2, usable=False)], PlanJob("k", 1, 1, host_pin="b"),
         "pinned to host b, which is marked unusable"),
        ([HostSlots(host="c", total=2)], PlanJob("k", 1, 1, host_pin="zz"),
         "pinned to host zz, which is not among the hosts to plan on (c)"),
        ([HostSlots(host="c", total=2)], PlanJob("k", 4, 1, host_pin="c"), "needs 4 slots (gpus=4); host c has 2"),
        ([HostSlots(host="b", total=2, usable=False, reason="unhealthy: disk full"),
          HostSlots(host="c", total=2, usable=False, reason="unreachable since 2024-05-01 12:00 UTC")],
         PlanJob("k", 1, 1), "no usable host (b unhealthy: disk full; c unreachable since 2024-05-01 12:00 UTC)"),
        ([], PlanJob("k", 1, 1), "no hosts to run on"),
    ],
)
def test_unplaced_reasons_are_specific(hosts: list[HostSlots], job: PlanJob, reason: str) -> None:
    result = plan([job], hosts)
    assert result.assignments == ()
    assert result.unplaced == (("k", reason),)


def test_unusable_host_is_skipped() -> None:
    hosts = [HostSlots(host="a", total=8, usable=False, reason="unreachable since 10:00"), HostSlots(host="b", total=1)]
    result = plan([PlanJob(f"j{i}", 1, 10) for i in range(3)], hosts)
    assert {a.host for a in result.assignments} == {"b"}
    assert result.makespan_s == 30
    assert "a" not in result.host_finish_s


def test_speed_factor_prefers_the_faster_host() -> None:
    hosts = [HostSlots(host="a-slow", total=1, speed=1.0), HostSlots(host="z-fast", total=1, speed=2.0)]
    result = plan([PlanJob("j", 1, 100)], hosts)
    assert [(p.host, p.end_s) for p in result.placements] == [("z-fast", 50.0)]
    # a 4x host runs three 100 s jobs back to back (25, 50, 75) before the slow host would finish one
    hosts = [HostSlots(host="a-slow", total=1), HostSlots(host="z-fast", total=1, speed=4.0)]
    result = plan([PlanJob(f"j{i}", 1, 100) for i in range(3)], hosts)
    assert [(p.job_id, p.host, p.end_s) for p in result.placements] == [
        ("j0", "z-fast", 25.0), ("j1", "z-fast", 50.0), ("j2", "z-fast", 75.0)]
    # a fourth would finish at 100 either way: the earlier start (the idle slow host) wins the tie
    result = plan([PlanJob(f"j{i}", 1, 100) for i in range(4)], hosts)
    assert [(p.job_id, p.host) for p in result.placements][:2] == [("j0", "z-fast"), ("j3", "a-slow")]
    assert result.makespan_s == 100.0


def test_host_slots_validate_slot_times_and_speed() -> None:
    with pytest.raises(ValueError, match="slot_free_at has 1 entries for 2 slots"):
        HostSlots(host="a", total=2, slot_free_at=(0.0,))
    with pytest.raises(ValueError):
        HostSlots(host="a", total=2, speed=0)


@pytest.mark.parametrize("seed", range(5))
def test_assignments_run_in_non_decreasing_planned_start_per_host(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [PlanJob(f"j{i:02d}", rng.choice([1, 1, 1, 2]), rng.uniform(10, 1000)) for i in range(30)]
    hosts = [HostSlots(host="a", total=2, slot_free_at=(0.0, 200.0)), HostSlots(host="b", total=4),
             HostSlots(host="c", total=1, speed=1.5)]
    result = plan(jobs, hosts)
    assert result.unplaced == ()
    _check_consistent(result, jobs, hosts)
    assert [(a.job_id, a.host) for a in result.assignments] == [(p.job_id, p.host) for p in result.placements]
    for h in hosts:
        starts = [p.start_s for p in result.placements if p.host == h.host]
        assert starts == sorted(starts)
    assert not any(p.host == "c" for p in result.placements if p.job_id in {j.job_id for j in jobs if j.gpus == 2})


def test_plan_is_deterministic() -> None:
    jobs = [PlanJob(f"j{i}", 1, 100) for i in range(7)]
    assert plan(jobs, _hosts(2, 2)) == plan(list(reversed(jobs)), _hosts(2, 2))


# --- estimates ------------------------------------------------------------------------


HISTORY = [
    ("configs/a.yaml", "classify", 10, 1200.0),  # 120 s/epoch
    ("configs/a.yaml", "classify", 20, 2000.0),  # 100 s/epoch
    ("configs/b.yaml", "classify", 5, 100.0),  # 20 s/epoch
    ("configs/c.yaml", "lm", 0, 50.0),  # no epochs: ignored
]


@pytest.mark.parametrize(
    ("config", "task", "epochs", "est_min", "expected"),
    [
        ("configs/a.yaml", "classify", 10, 3.0, 180.0),  # est_min wins
        ("configs/a.yaml", "classify", 10, None, 1100.0),  # same config + task: mean 110 s/epoch
        ("configs/new.yaml", "classify", 10, None, 800.0),  # same task: mean(120, 100, 20) = 80 s/epoch
        ("configs/new.yaml", "lm", 10, None, 10 * DEFAULT_EST_S_PER_EPOCH),  # nothing similar: default
    ],
)
def test_estimate_sources_in_order(config: str, task: str, epochs: int, est_min: float | None,
                                   expected: float) -> None:
    for history in (HISTORY, epoch_rates(HISTORY)):
        got = estimate_s(config=config, task=task, epochs=epochs, est_min=est_min, history=history)
        assert got == pytest.approx(expected)


def test_history_estimate_beats_the_default() -> None:
    # the default would call both jobs equal; history knows "slow" takes 10x longer per epoch
    history = [("slow.yaml", "t", 2, 1200.0), ("fast.yaml", "t", 2, 120.0)]
    jobs = [PlanJob(name, 1, estimate_s(config=f"{name}.yaml", task="t", epochs=4, history=history))
            for name in ("fast", "slow", "fast2")]
    assert [j.est_s for j in jobs] == [240.0, 2400.0, 4 * 330.0]
    result = plan(jobs, _hosts(2, 1))
    # with the history the long job gets a host of its own: makespan 2400, not 2400 + something
    assert result.makespan_s == 2400.0
    assert [p.job_id for p in result.placements if p.host == result.placements[0].host] == ["slow"]


def test_ledger_run_history_feeds_estimates(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    specs = [JobSpec(name=f"j{i}", config="configs/a.yaml", task="classify", epochs=10, config_sha256="0" * 64,
                     line=i + 1) for i in range(4)]
    rows = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="...", jobs=specs,
                            default_retries=1)
    ok, failed, resumed, running = (r.id for r in rows)
    for job, code, resume in ((ok, 0, ""), (failed, 2, ""), (resumed, 0, "ckpt/step-5.pt")):
        ledger.start_attempt(job, host="h", bundle_sha="s" * 64, resume_from=resume)
        ledger.update_attempt(job, 1, started_at=1000.0, ended_at=1500.0, exit_code=code)
        ledger.transition(job, AttemptState.EXITED, attempt=1)
        ledger.transition(job, JobState.SUCCEEDED if code == 0 else JobState.FAILED)
    ledger.start_attempt(running, host="h", bundle_sha="s" * 64)
    ledger.update_attempt(running, 1, started_at=1000.0)
    assert ledger.run_history() == [("configs/a.yaml", "classify", 10, 500.0)]
    assert estimate_s(config="configs/a.yaml", task="classify", epochs=4, history=ledger.run_history()) == 200.0
    ledger.close()


# --- work stealing --------------------------------------------------------------------


def _q(*ids: str, gpus: int = 1, est: float = 100.0, pin: str | None = None) -> list[QueuedJob]:
    return [QueuedJob(i, gpus, est, pin) for i in ids]


def test_idle_host_takes_the_tail_of_a_busy_hosts_queue() -> None:
    hosts = [HostSlots(host="busy", total=2, slot_free_at=(500.0, 600.0)), HostSlots(host="idle", total=2)]
    moves = plan_steals({"busy": _q("q1", "q2", "q3"), "idle": []}, hosts)
    assert moves == [Move("q3", "busy", "idle"), Move("q2", "busy", "idle")]


def test_most_loaded_host_gives_first() -> None:
    hosts = [HostSlots(host="a", total=1, slot_free_at=(100.0,)), HostSlots(host="b", total=1, slot_free_at=(900.0,)),
             HostSlots(host="idle", total=1)]
    assert plan_steals({"a": _q("a1"), "b": _q("b1"), "idle": []}, hosts) == [Move("b1", "b", "idle")]


@pytest.mark.parametrize(
    ("queued", "hosts", "expected"),
    [
        # a pinned job never moves, even when another host is idle
        ({"busy": _q("p1", pin="busy"), "idle": []},
         [HostSlots(host="busy", total=1, busy=1), HostSlots(host="idle", total=1)], []),
        # no target has a slot free now
        ({"busy": _q("q1"), "other": []},
         [HostSlots(host="busy", total=1, slot_free_at=(500.0,)), HostSlots(host="other", total=1, busy=1)], []),
        # the jobs start now on their own host: nothing waits, nothing moves
        ({"h": _q("q1", "q2"), "idle": []}, [HostSlots(host="h", total=2), HostSlots(host="idle", total=2)], []),
        # no ping-pong: "other" has 1 free slot and 1 queued job of its own, so it is no target;
        # and "busy" is no target for other's job either (that one starts now at home)
        ({"busy": _q("b1"), "other": _q("o1")},
         [HostSlots(host="busy", total=1, slot_free_at=(500.0,)), HostSlots(host="other", total=1)], []),
        # a 2-GPU job needs 2 free slots on the target
        ({"busy": _q("big", gpus=2), "idle": []},
         [HostSlots(host="busy", total=2, busy=2), HostSlots(host="idle", total=2, slot_free_at=(0.0, 50.0))], []),
        # an unusable host is no target
        ({"busy": _q("q1"), "down": []},
         [HostSlots(host="busy", total=1, busy=1), HostSlots(host="down", total=4, usable=False)], []),
        # moving to a much slower host would finish later than waiting: stay
        ({"fast": _q("q1"), "slow": []},
         [HostSlots(host="fast", total=1, slot_free_at=(10.0,), speed=4.0), HostSlots(host="slow", total=1, speed=0.5)],
         []),
        # the target's disk budget (after its own queue) must hold the job
        ({"busy": [QueuedJob("q1", 1, 100.0, disk_bytes=10 * GB)], "idle": []},
         [HostSlots(host="busy", total=1, busy=1), HostSlots(host="idle", total=1, disk_free_bytes=5 * GB)], []),
    ],
)
def test_no_move(queued: dict[str, list[QueuedJob]], hosts: list[HostSlots], expected: list[Move]) -> None:
    assert plan_steals(queued, hosts) == expected


def test_target_takes_no_more_than_its_free_slots_after_its_own_queue() -> None:
    # "mid" has 3 free slots and 1 queued job of its own: it can take 2 more, no more
    hosts = [HostSlots(host="busy", total=1, busy=1), HostSlots(host="mid", total=4, slot_free_at=(0, 0, 0, 900))]
    moves = plan_steals({"busy": _q("b1", "b2", "b3", "b4"), "mid": _q("m1")}, hosts)
    assert moves == [Move("b4", "busy", "mid"), Move("b3", "busy", "mid")]
    assert len({m.job_id for m in moves}) == len(moves)


def test_jobs_on_an_unreachable_host_move_to_free_slots() -> None:
    hosts = [HostSlots(host="gone", total=2, usable=False, reason="unreachable since 10:00"),
             HostSlots(host="ok", total=1)]
    assert plan_steals({"gone": _q("g1", "g2")}, hosts) == [Move("g2", "gone", "ok")]


def test_backfill_the_agent_would_do_is_not_stolen() -> None:
    # "h" has 1 free slot: its 2-GPU head job waits, the 1-GPU job behind it backfills now (stays);
    # the 2-GPU job moves to the host with 2 free slots
    hosts = [HostSlots(host="h", total=2, slot_free_at=(0.0, 700.0)), HostSlots(host="idle", total=2)]
    assert plan_steals({"h": [QueuedJob("pair", 2, 100.0), QueuedJob("solo", 1, 100.0)]}, hosts) == [
        Move("pair", "h", "idle")
    ]
