"""Work stealing over real OpenSSH hosts (tests/support/testhosts/ farm), driven through the api.

A busy host's unstarted jobs move to hosts that came free; nothing runs twice (one launch.json per
attempt, only on the host that ran it); a job the busy host claimed meanwhile stays where it is.
The FakeHost flavour of these flows is tests/integration/test_multihost.py.

Every wait is for a state (a job RUNNING, a launch record on a host), never a duration: the job
that keeps the busy host busy sleeps in every step, so it is still running when the idle hosts come
back.  The jobs are the light stdlib trainer (tests/support/lightproject.py): what is under test is
where and how often they run, not what they train.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.core.states import JobState
from orchestrator.scheduling.estimates import epoch_rates
from orchestrator.tick.probe import probe
from orchestrator.tick.steal import steal
from tests.conftest import kill_recorded_groups, wait_for
from tests.support.lightproject import light_config, light_project
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

HOLD_CONFIG = light_config(steps=8, step_s=1.5)  # ~12 s of a busy slot


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=3, gpus=1)


@pytest.fixture
def setup(farm: HostFarm, gpuq_home: Path, tmp_path: Path,
          request: pytest.FixtureRequest) -> Iterator[tuple[api.Context, list[Path]]]:
    """A context with the farm's hosts s0..s2 (one GPU each) under a data dir of this test's own."""
    rel = f"gpuq-{request.node.name[:40]}"
    ctx = api.open_context(overrides={"heartbeat_s": 1})
    for i, host in enumerate(farm.hosts):
        api.hosts_add(ctx, f"s{i}", f"root@{host.address}", key=str(farm.client_key), profile="rehearsal",
                      root=f"/root/{rel}", trust_new_host_key=True)
    dirs = [h.root_dir / "root" / rel for h in farm.hosts]
    yield ctx, dirs
    for i in range(len(farm.hosts)):
        farm.start_sshd(i)
    for d in dirs:
        kill_recorded_groups(d)
    ctx.close()


def _project(tmp_path: Path, lines: list[str]) -> Path:
    return light_project(tmp_path, {"tiny": light_config(steps=4, step_s=0.5), "hold": HOLD_CONFIG}, lines)


def _launches(dirs: list[Path]) -> dict[str, list[str]]:
    """job id -> the hosts whose agent launched an attempt of it (launch.json, one per attempt)."""
    seen: dict[str, list[str]] = {}
    for i, d in enumerate(dirs):
        for launch in d.glob("jobs/*/attempts/*/launch.json"):
            seen.setdefault(launch.parents[2].name, []).append(f"s{i}")
    return seen


def _submit_to_s0_only(ctx: api.Context, farm: HostFarm, queue: Path) -> api.SubmitResult:
    farm.stop_sshd(1)
    farm.stop_sshd(2)
    result = api.submit(ctx, queue)
    assert set(result.placements.values()) == {"s0"}, result.placements
    return result


def _running_on_s0(ctx: api.Context, job_id: str) -> bool:
    """One status tick (which cannot steal yet: the other hosts are down), then the job's state."""
    api.status(ctx)
    job = ctx.ledger.job(job_id)
    return job.state == JobState.RUNNING.value and job.host == "s0"


def test_a_busy_hosts_unstarted_jobs_move_and_nothing_runs_twice(
        farm: HostFarm, setup: tuple[api.Context, list[Path]], tmp_path: Path) -> None:
    ctx, dirs = setup
    queue = _project(tmp_path, ["configs/hold.yaml classify 1 name=hold est_min=5",
                                *[f"configs/tiny.yaml classify 1 name=w{i} est_min=1" for i in range(3)]])
    result = _submit_to_s0_only(ctx, farm, queue)
    hold = next(j for j, _ in result.placements.items() if ctx.ledger.job(j).name == "hold")
    # s0 (one GPU) runs the held job; the other three wait in its inbox
    assert wait_for(lambda: _running_on_s0(ctx, hold), timeout=180, interval=0.5), api.status(ctx).jobs
    farm.start_sshd(1)
    farm.start_sshd(2)
    snap = api.wait(ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=300)
    assert {j.state for j in snap.jobs} == {JobState.SUCCEEDED.value}
    ran_on = {j.id: j.host for j in snap.jobs}
    assert ran_on[hold] == "s0"  # the running job never moves
    moved = {j for j, h in ran_on.items() if h != "s0"}
    assert moved, f"no waiting job moved to an idle host: {ran_on}"
    launches = _launches(dirs)
    # exactly once: one launch record per job, on the host the ledger says ran it
    assert launches == {j: [h] for j, h in ran_on.items()}
    for job_id in moved:
        attempts = ctx.ledger.attempts(job_id)
        assert (attempts[0].number, attempts[0].host, attempts[0].state) == (1, "s0", "KILLED")
        assert attempts[-1].host == ran_on[job_id] and attempts[-1].state == "EXITED"
        assert any("work stealing" in e.message for e in ctx.ledger.events(subject=job_id))
        # the busy host kept the withdrawn spec as evidence and never launched it
        assert (dirs[0] / "withdrawn" / f"{job_id}.json").is_file()
        assert not list((dirs[0] / "jobs" / job_id).glob("attempts/*/launch.json"))


def test_a_job_the_busy_host_claimed_meanwhile_stays(
        farm: HostFarm, setup: tuple[api.Context, list[Path]], tmp_path: Path) -> None:
    """The steal is planned from a probe taken while the job waited; by the time the withdraw reaches
    the busy host, its agent has claimed the job: the withdraw refuses and nothing moves."""
    ctx, dirs = setup
    queue = _project(tmp_path, ["configs/hold.yaml classify 1 name=hold est_min=5",
                                "configs/tiny.yaml classify 1 name=late est_min=1"])
    result = _submit_to_s0_only(ctx, farm, queue)
    by_name = {ctx.ledger.job(j).name: j for j in result.placements}
    hold, late = by_name["hold"], by_name["late"]
    assert wait_for(lambda: _running_on_s0(ctx, hold), timeout=180, interval=0.5)
    farm.start_sshd(1)
    farm.start_sshd(2)
    rows = ctx.ledger.hosts()
    stale = [probe(ctx.fleet.host(r), r.agent_bundle, ctx.settings) for r in rows if r.kind != "local"]
    s0 = next(p for p in stale if p.host == "s0")
    assert {d.job_id: d.state for d in s0.document.jobs}.get(late) == "queued", s0.doc
    assert all(p.reachable for p in stale)
    # the busy host finishes its job and claims the waiting one
    assert wait_for(lambda: any((dirs[0] / "jobs" / late).glob("attempts/*/launch.json")), timeout=240,
                    interval=0.5)
    moves = steal(ctx.ledger, ctx.fleet, ctx.settings, stale, epoch_rates(ctx.ledger.run_history()))
    assert moves == []
    job = ctx.ledger.job(late)
    assert (job.host, job.attempt_count) == ("s0", 1)
    assert [(a.number, a.host) for a in ctx.ledger.attempts(late)] == [(1, "s0")]
    assert not (dirs[0] / "withdrawn" / f"{late}.json").exists()
    snap = api.wait(ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=300)
    assert {j.state for j in snap.jobs} == {JobState.SUCCEEDED.value}
    assert _launches(dirs) == {hold: ["s0"], late: ["s0"]}
