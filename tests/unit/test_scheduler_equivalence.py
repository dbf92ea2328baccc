"""The scheduler after its scaling work plans exactly what it planned before.

``tests/support/scheduler_reference/`` is ``orchestrator/scheduling/scheduler.py`` as it was before (the oracle).
Random job and host sets go through both; ``plan`` and ``plan_steals`` must give equal results, to the
last bit of every time, including the reasons of unplaced jobs, and raise the same errors where the
old one raised.  Nothing is excluded: identical jobs (which the swap pass skips), a job id given twice,
host names given twice, unusable and unknown hosts, too-large jobs, gangs, disk budgets and every
swap budget from "spent at once" to "walks every pair" are all drawn.

The swap budget (``IMPROVE_BUDGET``) is set equal in both modules for each case, small enough that
the old code stays fast on these sizes; the budget only scales how many trial plans each may try.
The drawn plans run with the new code's slot index on (``INDEX_FROM_HOSTS`` = 0) or at its default,
which leaves fleets this small to trying each host, as the old code did.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import astuple
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.specs import DEFAULT_EPOCHS, HostSlots
from orchestrator.scheduling import list_scheduling, scheduler, stealing
from orchestrator.scheduling.estimates import DEFAULT_EST_S_PER_EPOCH
from orchestrator.scheduling.placements import PlanJob
from orchestrator.scheduling.stealing import QueuedJob
from tests.support import scheduler_reference as reference

GB = 10**9
UNKNOWN_EST = DEFAULT_EST_S_PER_EPOCH * DEFAULT_EPOCHS  # what estimate_s guesses when nothing is known
ESTIMATES = [0.0, 1e-9, 0.5, 60.0, 600.0, 600.0, 900.0, 3600.0, UNKNOWN_EST, UNKNOWN_EST, -5.0, 1234.567, float("inf")]
SLOT_TIMES = [0.0, 0.0, 0.0, 30.0, 60.0, 600.5, 3600.0, 1e7]


INDEX_FROM = [0, 0, list_scheduling.INDEX_FROM_HOSTS]  # 0: the slot index serves every job not pinned, on any fleet


@contextmanager
def knobs(swap_budget: int, index_from: int) -> Iterator[None]:
    """The same swap budget in the new module and in the oracle, and when the new one uses its slot index
    (its answers must not depend on that), for one comparison."""
    old = scheduler.IMPROVE_BUDGET, reference.IMPROVE_BUDGET, list_scheduling.INDEX_FROM_HOSTS
    scheduler.IMPROVE_BUDGET = reference.IMPROVE_BUDGET = swap_budget
    list_scheduling.INDEX_FROM_HOSTS = index_from
    try:
        yield
    finally:
        scheduler.IMPROVE_BUDGET, reference.IMPROVE_BUDGET, list_scheduling.INDEX_FROM_HOSTS = old


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "returned", call()
    except Exception as error:  # the oracle may raise on odd input: then the new code must raise the same
        return "raised", type(error).__name__


def plan_fields(plan: Any) -> tuple[Any, ...]:
    """A plan of either module as plain values (their Placement classes differ; Assignment is shared)."""
    return (plan.assignments, plan.unplaced, tuple(astuple(p) for p in plan.placements), dict(plan.host_finish_s),
            plan.makespan_s)


def assert_same_plan(jobs: Sequence[PlanJob], hosts: Sequence[HostSlots], swap_budget: int,
                     index_from: int = list_scheduling.INDEX_FROM_HOSTS) -> None:
    with knobs(swap_budget, index_from):
        old = outcome(lambda: plan_fields(reference.plan(jobs, hosts)))
        new = outcome(lambda: plan_fields(scheduler.plan(jobs, hosts)))
    assert new == old


def assert_same_steals(queued: Mapping[str, Sequence[QueuedJob]], hosts: Sequence[HostSlots]) -> None:
    old = outcome(lambda: [astuple(m) for m in reference.plan_steals(queued, hosts)])
    new = outcome(lambda: [astuple(m) for m in stealing.plan_steals(queued, hosts)])
    assert new == old


# --- drawn inputs ----------------------------------------------------------------------------------


@st.composite
def host_sets(draw: st.DrawFn, most: int = 7) -> list[HostSlots]:
    hosts = []
    for i in range(draw(st.integers(0, most))):
        twice = i > 0 and draw(st.integers(0, 14)) == 0  # a host name given twice
        total = draw(st.sampled_from([0, 1, 2, 3, 4, 8, 8, 8]))
        timed = draw(st.booleans())
        hosts.append(HostSlots(
            host=f"h{draw(st.integers(0, i - 1))}" if twice else f"h{i}",
            total=total,
            busy=draw(st.integers(0, total + 1)),
            slot_free_at=tuple(draw(st.lists(st.sampled_from(SLOT_TIMES), min_size=total, max_size=total)))
            if timed else (),
            usable=draw(st.sampled_from([True] * 6 + [False])),
            reason=draw(st.sampled_from(["", "unreachable since 10:00"])),
            disk_free_bytes=draw(st.sampled_from([None, None, None, 0, -5, 3 * GB, 10 * GB, 100 * GB])),
            job_slots=draw(st.sampled_from([0, 0, 0, 0, 1, 2])),
            max_gpus=draw(st.sampled_from([None, None, None, 1, 2, 4])),
            max_nodes=draw(st.sampled_from([1, 1, 1, 2, 3])),
            gang=draw(st.booleans()),
            speed=draw(st.sampled_from([1.0, 1.0, 1.0, 0.5, 1.5, 2.0, 0.3])),
        ))
    return hosts


@st.composite
def job_sets(draw: st.DrawFn, most: int = 12) -> list[PlanJob]:
    jobs: list[PlanJob] = []
    for i in range(draw(st.integers(0, most))):
        if jobs and draw(st.integers(0, 3)) == 0:  # the same shape again: the swap pass skips such pairs
            like = draw(st.sampled_from(jobs))
            jobs.append(PlanJob(f"j{i:02d}", like.gpus, like.est_s, like.host_pin, like.disk_bytes, like.nodes))
            continue
        twice = jobs and draw(st.integers(0, 20)) == 0  # a job id given twice
        jobs.append(PlanJob(
            draw(st.sampled_from(jobs)).job_id if twice else f"j{i:02d}",
            gpus=draw(st.sampled_from([0, 1, 1, 1, 2, 2, 4, 8, 9])),
            est_s=draw(st.sampled_from(ESTIMATES)),
            host_pin=draw(st.sampled_from([None] * 8 + ["h0", "h1", "h2", "elsewhere"])),
            disk_bytes=draw(st.sampled_from([0, 0, 0, GB, 5 * GB, 50 * GB])),
            nodes=draw(st.sampled_from([1, 1, 1, 1, 2, 3])),
        ))
    return jobs


@st.composite
def queues(draw: st.DrawFn, hosts: Sequence[HostSlots]) -> dict[str, list[QueuedJob]]:
    names = [h.host for h in hosts] + ["unknown"]
    queued: dict[str, list[QueuedJob]] = {}
    serial = 0
    for name in draw(st.lists(st.sampled_from(names), unique=True)):
        queue: list[QueuedJob] = []
        for _ in range(draw(st.integers(0, 25))):
            serial += 1
            if queue and draw(st.integers(0, 30)) == 0:  # the same job twice, or its id twice
                again = draw(st.sampled_from(queue))
                queue.append(again if draw(st.booleans()) else QueuedJob(again.job_id, 1, 60.0))
                continue
            queue.append(QueuedJob(
                f"q{serial:03d}",
                gpus=draw(st.sampled_from([0, 1, 1, 1, 1, 2, 2, 4, 9])),
                est_s=draw(st.sampled_from(ESTIMATES)),
                host_pin=draw(st.sampled_from([None] * 10 + [name])),
                disk_bytes=draw(st.sampled_from([0, 0, 0, GB, 20 * GB])),
            ))
        queued[name] = queue
    return queued


@st.composite
def few_shapes(draw: st.DrawFn) -> tuple[list[PlanJob], list[HostSlots]]:
    """Jobs of two to four shapes on one to three small hosts: the swap pass accepts swaps often, and
    which pairs it skips (same shape) decides which trials its budget pays for."""
    shapes = draw(st.lists(st.tuples(st.integers(1, 3), st.sampled_from([1.0, 2.0, 3.0, 5.0, 7.0, 0.5])),
                           min_size=2, max_size=4))
    jobs = [PlanJob(f"j{i:02d}", *draw(st.sampled_from(shapes))) for i in range(draw(st.integers(3, 14)))]
    hosts = [HostSlots(host=f"h{i}", total=draw(st.integers(1, 4)), speed=draw(st.sampled_from([1.0, 1.0, 2.0])),
                       slot_free_at=()) for i in range(draw(st.integers(1, 3)))]
    return jobs, hosts


@st.composite
def busy_fleets(draw: st.DrawFn) -> list[HostSlots]:
    """Hosts whose slots free at various times (sources) and hosts with slots free now (targets)."""
    hosts = []
    for i in range(draw(st.integers(2, 6))):
        total = draw(st.integers(1, 6))
        hosts.append(HostSlots(
            host=f"h{i}", total=total,
            slot_free_at=tuple(draw(st.lists(st.sampled_from([0.0, 0.0, 50.0, 100.0, 250.0, 900.0]),
                                             min_size=total, max_size=total))),
            usable=draw(st.sampled_from([True] * 9 + [False])),
            disk_free_bytes=draw(st.sampled_from([None, None, 2 * GB])),
            speed=draw(st.sampled_from([1.0, 1.0, 0.5, 2.0])),
        ))
    return hosts


@st.composite
def long_inboxes(draw: st.DrawFn, hosts: Sequence[HostSlots]) -> dict[str, list[QueuedJob]]:
    """Inboxes of mixed sizes and lengths, where backfilling makes jobs start out of inbox order."""
    queued: dict[str, list[QueuedJob]] = {}
    for h in hosts:
        queued[h.host] = [QueuedJob(f"{h.host}-{k}", draw(st.sampled_from([1, 1, 2, 3])),
                                    draw(st.sampled_from([0.0, 40.0, 100.0, 100.0, 300.0, 1000.0])),
                                    disk_bytes=draw(st.sampled_from([0, 0, GB])))
                          for k in range(draw(st.integers(0, 12)))]
    return queued


# --- the properties --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(jobs=job_sets(), hosts=host_sets(), swap_budget=st.sampled_from([0, 1, 5, 13, 40, 120, 400, 1500]),
       index_from=st.sampled_from(INDEX_FROM))
def test_plan_equals_the_reference(jobs: list[PlanJob], hosts: list[HostSlots], swap_budget: int,
                                   index_from: int) -> None:
    assert_same_plan(jobs, hosts, swap_budget, index_from)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), hosts=host_sets())
def test_plan_steals_equals_the_reference(data: st.DataObject, hosts: list[HostSlots]) -> None:
    assert_same_steals(data.draw(queues(hosts)), hosts)


@settings(max_examples=300, deadline=None)
@given(case=few_shapes(), swap_budget=st.integers(2, 300), index_from=st.sampled_from(INDEX_FROM))
def test_plans_of_few_shapes_equal_the_reference(case: tuple[list[PlanJob], list[HostSlots]],
                                                 swap_budget: int, index_from: int) -> None:
    assert_same_plan(*case, swap_budget, index_from)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), hosts=busy_fleets())
def test_stealing_between_busy_and_idle_hosts_equals_the_reference(data: st.DataObject,
                                                                   hosts: list[HostSlots]) -> None:
    assert_same_steals(data.draw(long_inboxes(hosts)), hosts)


def _fleet(rng: random.Random, count: int) -> list[HostSlots]:
    """Many interchangeable hosts (a few kinds), some busy: heaps with many members and many updates."""
    kinds = [dict(speed=1.0), dict(speed=1.5), dict(speed=1.0, disk_free_bytes=40 * GB), dict(speed=2.0, gang=True)]
    hosts = []
    for i in range(count):
        kind: dict[str, Any] = rng.choice(kinds)
        free = tuple(rng.choice(SLOT_TIMES[:6]) for _ in range(8)) if rng.random() < 0.3 else ()
        hosts.append(HostSlots(host=f"h{i:02d}", total=8, slot_free_at=free, **kind))
    return hosts


def test_larger_plans_equal_the_reference() -> None:
    """Sizes the drawn cases do not reach: 24-48 hosts of a few kinds, 60-400 jobs of few shapes."""
    for seed in range(6):
        rng = random.Random(seed)
        hosts = _fleet(rng, rng.choice([24, 48]))
        jobs = [PlanJob(f"j{i:03d}", rng.choice([1, 1, 1, 2, 4, 8]), rng.choice(ESTIMATES[:9]),
                        host_pin=f"h{rng.randrange(24):02d}" if rng.random() < 0.03 else None,
                        disk_bytes=rng.choice([0, 0, 5 * GB]), nodes=rng.choice([1] * 12 + [2]))
                for i in range(rng.choice([60, 150, 400]))]
        assert_same_plan(jobs, hosts, swap_budget=len(jobs) * rng.choice([2, 5]))


def test_many_identical_jobs_and_a_few_others_equal_the_reference() -> None:
    """The filed case in small: a long run of one shape, whose pairs the swap pass skips, around a few
    other jobs; budgets of 1 and 3 trial plans (the old code walked every pair even once spent)."""
    hosts = [HostSlots(host=f"h{i}", total=8) for i in range(6)]
    for seed, trials in ((0, 1), (1, 3)):
        rng = random.Random(seed)
        jobs = [PlanJob(f"j{i:03d}", 1, 600.0) for i in range(500)]
        for k in rng.sample(range(500), 4):
            jobs[k] = PlanJob(jobs[k].job_id, 2, 300.0)
        assert_same_plan(jobs, hosts, swap_budget=len(jobs) * (trials + 1))


def test_stealing_from_long_queues_equals_the_reference() -> None:
    """Busy hosts with 60-150 queued jobs each, idle hosts to take them: many moves from one source."""
    for seed in range(4):
        rng = random.Random(seed)
        hosts = [HostSlots(host=f"b{i}", total=8, slot_free_at=tuple(rng.uniform(60, 3600) for _ in range(8)))
                 for i in range(4)]
        hosts += [HostSlots(host=f"i{i}", total=8, speed=rng.choice([1.0, 2.0]),
                            disk_free_bytes=rng.choice([None, 30 * GB])) for i in range(4)]
        queued = {h.host: [QueuedJob(f"{h.host}-{k}", rng.choice([1, 1, 1, 2]),
                                     rng.choice([0.0, 600.0, 1800.0, 3600.0]), disk_bytes=rng.choice([0, GB]))
                           for k in range(rng.choice([60, 150]))]
                  for h in hosts[:4]}
        queued["gone"] = [QueuedJob(f"gone-{k}", 1, 600.0) for k in range(10)]
        assert_same_steals(queued, hosts)


def test_a_move_that_lets_a_waiting_job_start_sooner_projects_its_source_again() -> None:
    """``b`` backfilled ahead of the 2-slot ``a`` and moves to ``t``; then ``a`` starts at 120 s, not 150 s,
    and ends at 220 s, before ``u`` (2 slots at 100/230 speed) would finish it (230 s): ``a`` stays.
    Kept projections would still say 250 s and move ``a`` too."""
    hosts = [HostSlots(host="s", total=2, slot_free_at=(100.0, 120.0)), HostSlots(host="t", total=1),
             HostSlots(host="u", total=2, speed=100 / 230)]
    assert_same_steals({"s": [QueuedJob("a", 2, 100.0), QueuedJob("b", 1, 50.0)]}, hosts)


def test_jobs_that_could_not_move_are_tried_again_after_their_source_changes() -> None:
    """Moving ``short`` lets ``wide`` start at 1000 s, which pushes ``long`` from 1000-2000 s to 2040-3040 s:
    ``long``, which could not gain on ``t`` (2000 s there) before, now moves too."""
    hosts = [HostSlots(host="s", total=3, slot_free_at=(0.0, 900.0, 900.0)), HostSlots(host="t", total=2, speed=0.5)]
    queued = {"s": [QueuedJob("first", 1, 1000.0), QueuedJob("zero", 2, 0.0), QueuedJob("short", 1, 40.0),
                    QueuedJob("wide", 3, 40.0), QueuedJob("wider", 3, 1000.0), QueuedJob("long", 1, 1000.0)]}
    assert_same_steals(queued, hosts)
