"""Several hosts through the real api: packing, fan-out, work stealing, exactly-once.

The hosts here are FakeHosts (real host agents under separate roots on this machine, reached
without SSH) so placement and stealing are exercised quickly; the same flows over real OpenSSH
hosts in namespaces live in test_ssh_hosts.py and test_ssh_work_stealing.py.  The jobs are the
light stdlib trainer (tests/support/lightproject.py): what is under test is where and how often
they run, not what they train.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.core.states import JobState
from orchestrator.ledger import HostRow
from tests.conftest import kill_recorded_groups
from tests.support.fakehost import FakeHost
from tests.support.lightproject import light_config, light_project

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(gpuq_home: Path, tmp_path: Path) -> Iterator[tuple[api.Context, dict[str, FakeHost]]]:
    ctx = api.open_context(overrides={"heartbeat_s": 1, "agent_idle_exit_s": 30})
    hosts: dict[str, FakeHost] = {}
    for name in ("a", "b", "c"):
        host = FakeHost(tmp_path / f"host-{name}", name=name)
        Path(host.root).mkdir(parents=True)
        host.agent_flags = ("--cpu-slots", "1")
        ctx.ledger.add_host(HostRow(name=name, kind="ssh", target=f"fake@{name}", root=host.root,
                                    slots_kind="cpu", slots_total=1, created_at=0))
        ctx.fleet._hosts[name] = host  # the Fleet hands out these instead of SSH connections
        hosts[name] = host
    yield ctx, hosts
    for host in hosts.values():
        kill_recorded_groups(Path(host.root))
    ctx.close()


def _project(tmp_path: Path, lines: list[str]) -> Path:
    return light_project(tmp_path, {"tiny": light_config(steps=4, step_s=0.5)}, lines)  # ~2 s a job


def _launches(hosts: dict[str, FakeHost]) -> dict[str, list[str]]:
    """job id -> hosts whose agent launched an attempt of it (from the launch records on disk)."""
    seen: dict[str, list[str]] = {}
    for name, host in hosts.items():
        for launch in Path(host.root).glob("jobs/*/attempts/*/launch.json"):
            seen.setdefault(launch.parents[2].name, []).append(name)
    return seen


def test_submit_fans_out_over_remote_hosts_and_runs_each_job_once(fleet, tmp_path: Path) -> None:
    ctx, hosts = fleet
    queue = _project(tmp_path, [f"configs/tiny.yaml classify 1 name=j{i}" for i in range(6)])
    result = api.submit(ctx, queue)
    assert not result.launch_error
    # 6 equal jobs on 3 one-slot hosts: two each, and the local host takes no part
    per_host: dict[str, int] = {}
    for host in result.placements.values():
        per_host[host] = per_host.get(host, 0) + 1
    assert per_host == {"a": 2, "b": 2, "c": 2}
    assert ctx.ledger.host("local") is None

    snap = api.wait(ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=240)
    assert {j.state for j in snap.jobs} == {JobState.SUCCEEDED.value}
    launches = _launches(hosts)
    assert sorted(launches) == sorted(j.id for j in snap.jobs)
    assert all(len(v) == 1 for v in launches.values()), launches
    # the bundle went to each host once, by hash
    for host in hosts.values():
        assert len(list(Path(host.root).glob("bundles/*/MANIFEST.json"))) == 1


def test_idle_host_steals_unstarted_jobs_and_nothing_runs_twice(fleet, tmp_path: Path) -> None:
    ctx, hosts = fleet
    queue = _project(tmp_path, [f"configs/tiny.yaml classify 1 name=s{i}" for i in range(4)])
    hosts["b"].down = hosts["c"].down = True  # b and c cannot take the bundle: all four go to a
    result = api.submit(ctx, queue)
    assert set(result.placements.values()) == {"a"}
    assert any("host b left out" in w for w in result.warnings)
    hosts["b"].down = hosts["c"].down = False  # back: the next ticks move a's waiting jobs over
    snap = api.wait(ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=240)
    assert {j.state for j in snap.jobs} == {JobState.SUCCEEDED.value}
    ran_on = {j.id: j.host for j in snap.jobs}
    assert set(ran_on.values()) - {"a"}, f"no job moved to an idle host: {ran_on}"
    launches = _launches(hosts)
    assert all(len(v) == 1 for v in launches.values()), launches
    for job in snap.jobs:
        assert launches[job.id] == [job.host]
    moved = [e for j in snap.jobs for e in ctx.ledger.events(subject=j.id) if "work stealing" in e.message]
    assert moved
    # the source agent kept the withdrawn spec as evidence; it never ran there
    withdrawn = [p.stem for p in Path(hosts["a"].root).glob("withdrawn/*.json")]
    assert withdrawn and all(launches[w] != ["a"] for w in withdrawn)
    spec = json.loads((Path(hosts["a"].root) / "withdrawn" / f"{withdrawn[0]}.json").read_text())
    assert spec["job_id"] == withdrawn[0]


def test_a_sweep_restricted_to_one_host_is_never_moved(fleet, tmp_path: Path) -> None:
    ctx, hosts = fleet
    queue = _project(tmp_path, [f"configs/tiny.yaml classify 1 name=r{i}" for i in range(3)])
    result = api.submit(ctx, queue, hosts=("a",))
    snap = api.wait(ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=240)
    assert {j.state for j in snap.jobs} == {JobState.SUCCEEDED.value}
    assert {j.host for j in snap.jobs} == {"a"}
    assert not list(Path(hosts["b"].root).glob("jobs/*"))
