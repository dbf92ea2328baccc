"""`gpu=` / `gpu_mem=` in the pure scheduler: a job that asks for hardware goes only to hosts whose GPUs
match, whichever path finds its host (tried one by one, or the slot index of a large fleet), is stolen
only onto one, and waits with a reason that names what it needs and what each host has."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.specs import HostSlots
from orchestrator.scheduling import list_scheduling, scheduler
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed, host_matches
from orchestrator.scheduling.placements import PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.scheduling.stealing import QueuedJob, plan_steals

A100 = ("NVIDIA A100-SXM4-80GB",), 81920.0
H100 = ("NVIDIA H100 80GB HBM3",), 81559.0
A10 = ("NVIDIA A10",), 23028.0
CARDS = [A100, H100, A10, ((), None), (None, None)]  # the last two: no GPUs, unknown
NEEDS = [ANY_GPU, GpuNeed(("A100",)), GpuNeed((), 40.0), GpuNeed(("A100", "H100"), 79.0), GpuNeed(("A10",))]


def _host(name: str, card: tuple[tuple[str, ...] | None, float | None], total: int = 2, **kw: object) -> HostSlots:
    return HostSlots(host=name, total=total, gpu_models=card[0], gpu_mem_mib=card[1], **kw)  # type: ignore[arg-type]


@contextmanager
def knobs(swap_budget: int, index_from: int) -> Iterator[None]:
    old = scheduler.IMPROVE_BUDGET, list_scheduling.INDEX_FROM_HOSTS
    scheduler.IMPROVE_BUDGET, list_scheduling.INDEX_FROM_HOSTS = swap_budget, index_from
    try:
        yield
    finally:
        scheduler.IMPROVE_BUDGET, list_scheduling.INDEX_FROM_HOSTS = old


def _matches(job: PlanJob, host: HostSlots) -> bool:
    return host_matches(job.need, host.gpu_models, host.gpu_mem_mib)


def test_a_big_memory_job_waits_for_the_big_card_while_the_small_one_is_free() -> None:
    hosts = [_host("small", A10, total=4), _host("big", A100, total=1)]
    jobs = [PlanJob(f"b{i}", 1, 600.0, need=GpuNeed((), 80.0)) for i in range(3)] + [PlanJob("p", 1, 60.0)]
    done = plan(jobs, hosts)
    where = {a.job_id: a.host for a in done.assignments}
    assert where == {"b0": "big", "b1": "big", "b2": "big", "p": "small"}
    assert sorted(p.start_s for p in done.placements if p.host == "big") == [0.0, 600.0, 1200.0]


def test_no_host_with_the_model_leaves_the_job_unplaced_with_every_host_named() -> None:
    hosts = [_host("a", A10), _host("b", A100), _host("c", (None, None)), _host("d", H100, usable=False,
                                                                                   reason="held: unhealthy")]
    done = plan([PlanJob("j", 1, 60.0, need=GpuNeed(("L40S",)))], hosts)
    assert done.unplaced == (("j", "needs gpu=L40S: no host has one (hosts: a: NVIDIA A10 24.1 GB, b: NVIDIA "
                                   "A100-SXM4-80GB 85.9 GB, c: GPUs not known yet, d: NVIDIA H100 80GB HBM3 85.5 GB); "
                                   "1 of them not probed yet (`gpuq status` probes them)"),)
    only_held = plan([PlanJob("j", 1, 60.0, need=GpuNeed(("H100",)))], hosts)
    assert only_held.unplaced == (("j", "needs gpu=H100: the hosts that match are not usable (d held: unhealthy)"),)
    pinned = plan([PlanJob("j", 1, 60.0, host_pin="a", need=GpuNeed((), 25.0))], hosts)
    assert pinned.unplaced == (("j", "needs gpu_mem=25: no host has that much GPU memory (hosts: a: NVIDIA A10 "
                                     "24.1 GB)"),)
    assert plan([PlanJob("j", 1, 60.0, need=GpuNeed(("A100",)))], hosts).assignments[0].host == "b"


def test_a_multi_node_job_spans_only_matching_hosts() -> None:
    hosts = [_host("a1", A100), _host("a2", A100), _host("s1", A10), _host("s2", A10)]
    hosts = [h.model_copy(update={"gang": True}) for h in hosts]
    done = plan([PlanJob("m", 2, 60.0, nodes=2, need=GpuNeed(("A100",)))], hosts)
    (placed,) = done.assignments
    assert {placed.host, *placed.peers} == {"a1", "a2"}
    three = plan([PlanJob("m", 2, 60.0, nodes=3, need=GpuNeed(("A100",)))], hosts)
    assert three.unplaced and three.unplaced[0][1].startswith("needs 3 nodes with gpus=2 each"), three.unplaced


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[PlanJob], list[HostSlots]]:
    count = draw(st.integers(1, 40))
    hosts = [_host(f"h{i:02d}", draw(st.sampled_from(CARDS)), total=draw(st.integers(1, 4)),
                   speed=draw(st.sampled_from([1.0, 1.0, 2.0])),
                   slot_free_at=()) for i in range(count)]
    jobs = [PlanJob(f"j{i:02d}", draw(st.integers(1, 3)), draw(st.sampled_from([60.0, 600.0, 900.0, 3600.0])),
                    need=draw(st.sampled_from(NEEDS))) for i in range(draw(st.integers(1, 30)))]
    return jobs, hosts


@settings(max_examples=60, deadline=None)
@given(instances(), st.sampled_from([0, 2000]))
def test_every_job_lands_on_a_host_that_matches_whichever_path_finds_it(case: tuple[list[PlanJob], list[HostSlots]],
                                                                         swap_budget: int) -> None:
    jobs, hosts = case
    by_name = {h.host: h for h in hosts}
    with knobs(swap_budget, 0):  # the slot index answers every job not pinned
        indexed = plan(jobs, hosts)
    with knobs(swap_budget, 10**9):  # every host tried one by one
        each = plan(jobs, hosts)
    assert indexed == each
    need = {j.job_id: j for j in jobs}
    for a in indexed.assignments:
        assert _matches(need[a.job_id], by_name[a.host])
    for job_id, why in indexed.unplaced:  # every host is usable: one that asks for what none has says what
        if need[job_id].need and not any(_matches(need[job_id], h) for h in hosts):
            assert why.startswith(f"needs {need[job_id].need.text()}: no host has ")


@settings(max_examples=40, deadline=None)
@given(instances())
def test_one_ask_plans_as_if_only_the_matching_hosts_were_there(case: tuple[list[PlanJob], list[HostSlots]]) -> None:
    jobs, hosts = case
    need = GpuNeed(("A100", "H100"))
    asked = [replace(j, need=need) for j in jobs]
    matching = [h for h in hosts if host_matches(need, h.gpu_models, h.gpu_mem_mib)]
    with knobs(0, 10**9):  # list scheduling alone: idle hosts no job may use change nothing
        got = plan(asked, hosts)
        alone = plan([replace(j, need=ANY_GPU) for j in jobs], matching)
    assert got.placements == alone.placements
    if matching:
        assert [j for j, _ in got.unplaced] == [j for j, _ in alone.unplaced]
    else:
        assert all(why.startswith("needs gpu=A100|H100: no host has one") for _, why in got.unplaced)


@settings(max_examples=40, deadline=None)
@given(instances(), st.randoms(use_true_random=False))
def test_gpu_facts_change_no_plan_of_jobs_that_ask_for_none(case: tuple[list[PlanJob], list[HostSlots]],
                                                            rng: random.Random) -> None:
    jobs, hosts = case
    plain = [replace(j, need=ANY_GPU) for j in jobs]
    bare = [h.model_copy(update={"gpu_models": None, "gpu_mem_mib": None}) for h in hosts]
    shuffled = [h.model_copy(update=dict(zip(("gpu_models", "gpu_mem_mib"), rng.choice(CARDS), strict=True)))
                for h in hosts]
    for index_from in (0, 10**9):
        with knobs(scheduler.IMPROVE_BUDGET, index_from):
            assert plan(plain, shuffled) == plan(plain, bare)


def test_stealing_moves_a_job_only_to_a_host_that_matches() -> None:
    busy = HostSlots(host="busy", total=1, slot_free_at=(600.0,), gpu_models=A100[0], gpu_mem_mib=A100[1])
    small = HostSlots(host="small", total=2, gpu_models=A10[0], gpu_mem_mib=A10[1])
    big = HostSlots(host="big", total=1, gpu_models=H100[0], gpu_mem_mib=H100[1])
    queued: dict[str, Sequence[QueuedJob]] = {"busy": [QueuedJob("x", 1, 600.0, need=GpuNeed((), 79.0)),
                                                       QueuedJob("y", 1, 600.0, need=GpuNeed(("A100",)))],
                                              "small": [], "big": []}
    moves = plan_steals(queued, [busy, small, big])
    assert {(m.job_id, m.to_host) for m in moves} == {("x", "big")}  # y: no free host has an A100
    free = plan_steals({"busy": [QueuedJob("z", 1, 600.0)], "small": [], "big": []}, [busy, small, big])
    assert [m.job_id for m in free] == ["z"]
