"""Multi-node jobs over real OpenSSH hosts (a routed tests/support/testhosts/ farm: the hosts reach
each other, as the nodes of one job must), driven through the api.

- ``nodes=2 gpus=1`` (one torchrun per host, static rendezvous on node 0, gloo over the test network)
  trains to the weights of ``gpus=2`` on one host: the same world size, so the same run;
- kill -9 of node 1's whole group mid-run fails the attempt, node 0 is stopped too, and the job
  resumes on two nodes from the newest checkpoint to the weights of an uninterrupted twin;
- a gang that cannot start (one of the two hosts busy) waits in the ledger without holding the free
  host's slots: a one-GPU job runs there meanwhile; the gang starts when the busy host frees.

Every wait is for a state (a checkpoint step, a job's state), never a duration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.cli.statusjson import status_doc
from orchestrator.core.states import JobState
from tests.conftest import kill_recorded_groups, wait_for
from tests.support.lightproject import light_config, light_project
from tests.support.sweepproject import CKPT_EVERY, final_weights, latest_step, tiny_config, write_project
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration





@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=3, gpus=2, routed=True)


class World:
    def __init__(self, ctx: api.Context, dirs: list[Path]) -> None:
        self.ctx, self.dirs = ctx, dirs

    def job(self, name: str) -> object:
        return next(j for j in self.ctx.ledger.jobs() if j.name == name)

    def job_dir(self, host: str, name: str) -> Path:
        return self.dirs[int(host[1:])] / "jobs" / self.job(name).id  # type: ignore[attr-defined]

    def history(self, name: str) -> str:
        job = self.job(name)
        return "\n".join(f"{e.old}->{e.new} {e.message}" for e in self.ctx.ledger.events(subject=job.id))  # type: ignore[attr-defined]


@pytest.fixture
def world(farm: HostFarm, gpuq_home: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    """A context with the farm's hosts s0..s2 (two emulated GPUs each, training on CPU). Worlds are kept to
    two ranks: every rank is a process that imports torch, the suite's largest CPU cost."""
    rel = f"gpuq-{request.node.name[:40]}"
    ctx = api.open_context(overrides={"heartbeat_s": 1, "gang_timeout_s": 120})
    for i, host in enumerate(farm.hosts):
        api.hosts_add(ctx, f"s{i}", f"root@{host.address}", key=str(farm.client_key), profile="rehearsal",
                      root=f"/root/{rel}", trust_new_host_key=True)
    dirs = [h.root_dir / "root" / rel for h in farm.hosts]
    yield World(ctx, dirs)
    for d in dirs:
        kill_recorded_groups(d)
    ctx.close()




def _weights(world: World, name: str) -> str:
    return final_weights(world.job_dir(world.job(name).host, name))  # type: ignore[attr-defined]




def test_two_nodes_train_to_the_weights_of_the_same_world_on_one_host(world: World, tmp_path: Path) -> None:
    queue = write_project(tmp_path, {"tiny": tiny_config(0.0, 512)},
                          ["configs/tiny.yaml classify 2 name=spread nodes=2 gpus=1",
                           "configs/tiny.yaml classify 2 name=packed gpus=2"])
    result = api.submit(world.ctx, queue)
    snap = api.wait(world.ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=400)
    states = {j.name: j.state for j in snap.jobs}
    assert states == {"spread": "SUCCEEDED", "packed": "SUCCEEDED"}, world.history("spread")
    spread = world.job("spread")
    (attempt,) = world.ctx.ledger.attempts(spread.id)  # type: ignore[attr-defined]
    head, peer = attempt.node_hosts()
    assert head == spread.host and peer != head  # type: ignore[attr-defined]
    head_log = (world.job_dir(head, "spread") / "attempts" / "1" / "job.log").read_text()
    peer_log = (world.job_dir(peer, "spread") / "attempts" / "1" / "job.log").read_text()
    assert "--nnodes=2" in head_log and "--node-rank=0" in head_log and "--standalone" not in head_log, head_log
    assert "--node-rank=1" in peer_log and "--nproc-per-node=1" in peer_log, peer_log
    assert "gpuq: node 1 of 2 reaches node 0 at " in peer_log, peer_log
    assert f"attempt 1 runs on 2 nodes: node 0 on {head}, node 1 on {peer}" in world.history("spread")
    shown = {j["name"]: j for j in status_doc(api.status(world.ctx))["jobs"]}  # the job once, with its nodes
    assert shown["spread"]["host"] == head and shown["spread"]["node_hosts"] == [head, peer], shown["spread"]
    assert shown["packed"]["node_hosts"] == []
    assert _weights(world, "spread") == _weights(world, "packed")
    # the head's outputs are the job's: its results are collected, the peer wrote no checkpoint of its own
    assert not (world.job_dir(peer, "spread") / "ckpt" / "LATEST").exists()


def test_one_node_killed_fails_the_attempt_and_both_resume_from_the_checkpoint(world: World, farm: HostFarm,
                                                                              tmp_path: Path) -> None:
    # a world of 2 over 2048 samples: 64 steps, ~13 s of sleeps, so the kill always lands mid-run
    queue = write_project(tmp_path, {"victim": tiny_config(0.2, 2048), "twin": tiny_config(0.0, 2048)},
                          ["configs/victim.yaml classify 2 name=victim nodes=2 gpus=1 retries=1",
                           "configs/twin.yaml classify 2 name=twin gpus=2"])
    result = api.submit(world.ctx, queue)
    victim = world.job("victim")
    (first,) = world.ctx.ledger.attempts(victim.id)  # type: ignore[attr-defined]
    head, peer = first.node_hosts()
    head_dir = world.job_dir(head, "victim")
    pgid_file = world.job_dir(peer, "victim") / "attempts" / "1" / "pgid"
    assert wait_for(lambda: latest_step(head_dir) >= 2 * CKPT_EVERY and pgid_file.is_file(), timeout=300,
                    interval=0.2), world.history("victim")
    pgid = int(json.loads(pgid_file.read_text())["pgid"])  # in the host's own pid namespace
    killed = farm.ssh(int(peer[1:]), "kill", "-9", f"-{pgid}")
    assert killed.returncode == 0, killed
    snap = api.wait(world.ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=500)
    states = {j.name: j.state for j in snap.jobs}
    assert states == {"victim": "SUCCEEDED", "twin": "SUCCEEDED"}, world.history("victim")
    attempts = world.ctx.ledger.attempts(victim.id)  # type: ignore[attr-defined]
    assert [a.number for a in attempts] == [1, 2], world.history("victim")
    # whichever node's end was seen first stands for the attempt (node 0's ranks fail as soon as their
    # peer is gone); either way the attempt failed, counted once, and no part of it lingers
    assert attempts[0].state in ("LOST", "EXITED") and attempts[0].exit_code != 0, attempts[0]
    assert attempts[0].message.startswith("exit ") and (f"node 1 on {peer}" in attempts[0].message
                                                        or f"node 0 on {head}" in attempts[0].message)
    for name in (head, peer):
        assert (world.job_dir(name, "victim") / "attempts" / "1" / "exit.json").is_file(), name
    second = attempts[1]
    new_head = second.node_hosts()[0]
    log = (world.job_dir(new_head, "victim") / "attempts" / "2" / "job.log").read_text()
    resumed = [line for line in log.splitlines() if "GPUQ_RESUMED" in line]
    assert resumed and int(resumed[0].split("step=")[1].split()[0]) >= 2 * CKPT_EVERY, log[-3000:]
    for name in second.node_hosts():  # every node had the checkpoint it resumed from
        assert (world.job_dir(name, "victim") / "ckpt" / "LATEST").is_file()
    logs = {n: (world.job_dir(n, "victim") / "attempts" / "2" / "job.log").read_text() for n in second.node_hosts()}
    assert _weights(world, "victim") == _weights(world, "twin"), (world.history("victim"), logs)


def test_a_gang_that_cannot_start_waits_without_holding_the_free_hosts_slots(
        world: World, farm: HostFarm, tmp_path: Path) -> None:
    """s0 and s1 each have one of their two GPUs busy (jobs of 256 steps of 1 s: they outlast the
    test's waits); s2 is free.  Every job is the light stdlib trainer.  The two-node job cannot start
    (it needs two hosts with two GPUs free at once): it waits QUEUED in the ledger, nothing of it
    reaches any host, and a one-GPU job submitted with it runs on s2 meanwhile.  Once the busy jobs
    are cancelled, the two-node job runs."""
    # the busy jobs are the light stdlib trainer (tests/support/lightproject.py): they only hold a GPU each
    busy = light_project(tmp_path / "busy", {"hold": light_config(steps=256, step_s=1.0)},
                         ["configs/hold.yaml classify 1 name=hold0 gpus=1 host=s0 est_min=2",
                          "configs/hold.yaml classify 1 name=hold1 gpus=1 host=s1 est_min=2"])
    first = api.submit(world.ctx, busy)
    assert wait_for(lambda: (api.status(world.ctx), {world.job(n).state for n in ("hold0", "hold1")})[1]  # type: ignore[attr-defined]
                    == {"RUNNING"}, timeout=300, interval=0.5), world.history("hold0")
    # the gang and the one-GPU job are light too: where and when they run is the subject here; two nodes
    # training one world under torchrun are test_two_nodes_train_to_the_weights_of_the_same_world_on_one_host's
    queue = light_project(tmp_path / "gang", {"quick": light_config(steps=4, step_s=0.2)},
                          ["configs/quick.yaml classify 1 name=wide nodes=2 gpus=2 est_min=1",
                           "configs/quick.yaml classify 1 name=small gpus=1 host=s2 est_min=0.1"])
    second = api.submit(world.ctx, queue)
    wide = world.job("wide")
    assert wide.state == JobState.QUEUED.value and wide.attempt_count == 0, world.history("wide")  # type: ignore[attr-defined]
    assert "still queued: waiting for 2 hosts with its GPUs free at once" in world.history("wide")
    assert wait_for(lambda: (api.status(world.ctx), world.job("small").state)[1] == "SUCCEEDED", timeout=300,  # type: ignore[attr-defined]
                    interval=0.5), world.history("small")
    assert {world.job(n).state for n in ("hold0", "hold1")} == {"RUNNING"}  # type: ignore[attr-defined]
    assert world.job("wide").state == JobState.QUEUED.value, world.history("wide")  # type: ignore[attr-defined]
    for d in world.dirs:  # the waiting gang holds nothing on any host
        assert not (d / "inbox" / f"{wide.id}.json").exists() and not (d / "jobs" / wide.id).exists()  # type: ignore[attr-defined]
    api.cancel(world.ctx, sweep=first.sweep_id)
    snap = api.wait(world.ctx, sweep=second.sweep_id, interval_s=0.5, timeout_s=500)
    assert {j.state for j in snap.jobs} == {"SUCCEEDED"}, world.history("wide")
    (attempt,) = world.ctx.ledger.attempts(wide.id)  # type: ignore[attr-defined]
    assert len(set(attempt.node_hosts())) == 2
