"""Billing stops with the laptop closed (docs/providers.md, "When no gpuq command runs: the host stops itself"),
end to end on the fake providers, whose machines are real namespace SSH hosts with what the provider puts in
them (PID 1's RUNPOD_POD_ID and pod-scoped RUNPOD_API_KEY, or vast.ai's CONTAINER_ID and CONTAINER_API_KEY, and
a `runpodctl` / `vastai` on the PATH that calls the fake's API from inside the host with that key).

A `--down-when-done` sweep's controller (`gpuq watch`) is killed with SIGKILL while both jobs run, and no gpuq
command runs afterwards: each machine stops itself within the lease (plus one agent look) of the later of its
last job's end and the last command that reached it, never while its job runs; its results stay on the stopped
disk; the controller's cloud key is nowhere on the host; the next `gpuq status` records each stop through the
lease gate with its time and cost, and `gpuq resume` starts the machine again and reads what its jobs left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
from tests.integration.test_cloud import RUNPOD_KEY, VAST_KEY, Cloud
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

# 7.2 s: long enough to cover `gpuq up` -> `gpuq submit` here (a host idle for its lease right after `up`
# stops itself, as it should); the agent looks every 5 s (gpuq_selfstop.CHECK_EVERY_S)
LEASE_MIN = 0.12
LOOK_S = 5.0
TRAIN = """\
import sys, time
time.sleep(float(sys.argv[sys.argv.index("--sleep") + 1]))
with open("metrics.csv", "w") as fh:
    fh.write("step,val_acc\\n1,0.50\\n2,0.60\\n")
print("trained", flush=True)
"""
TOML = '[run]\ncommand = "train.py {args}"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'


@pytest.fixture
def make_cloud(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[Callable[[str, int], Cloud]]:
    made: list[Cloud] = []

    def make(provider: str, hosts: int) -> Cloud:
        cloud = Cloud(host_farm(n=hosts, gpus=1), tmp_path, provider)
        cloud.env.update({"GPUQ_LEASE_TIMEOUT_MIN": str(LEASE_MIN), "GPUQ_PATROL_IDLE_INTERVAL_S": "1"})
        made.append(cloud)
        return cloud

    yield make
    for cloud in made:
        cloud.close()


def _rent_and_submit(cloud: Cloud, tmp_path: Path, gpu: str, count: int, sleeps: list[float]) -> list[str]:
    up = cloud.gpuq("up", "--provider", cloud.provider, "--gpu", gpu, "--count", str(count), "--gpus", "1",
                    "--profile", "rehearsal", "--down-when-done")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "cannot stop their own billing" not in up.stderr, up.stderr
    names = sorted(cloud.hosts())
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    lines = [f"name=j{i} host={h} retries=0 -- --sleep {s}" for i, (h, s) in enumerate(zip(names, sleeps, strict=True))]
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    submitted = cloud.gpuq("submit", str(work / "queue.txt"))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return names


def _kill_the_controller_while_all_run(cloud: Cloud, tmp_path: Path, started: Callable[[], bool]) -> float:
    """`gpuq watch` until every job has started on its host, then SIGKILL: the laptop is gone."""
    log = tmp_path / "watch.log"
    with open(log, "wb") as out:
        watch = subprocess.Popen([sys.executable, "-m", "orchestrator", "watch", "--interval", "1"], cwd=ROOT,
                                 env={**os.environ, **cloud.env}, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        running = wait_for(started, timeout=30, interval=0.2)
    finally:
        os.killpg(watch.pid, signal.SIGKILL)
        watch.wait()
    assert running, ([j.state for j in cloud.jobs()], log.read_text())
    return time.time()


def _job_end(cloud: Cloud, instance_id: str, job_id: str) -> float:
    """When the job ended, by its exit record on the host's disk."""
    doc = json.loads((cloud.host_root(instance_id) / "jobs" / job_id / "attempts" / "1" / "exit.json").read_text())
    return datetime.strptime(doc["ended_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def _no_controller_key_on(cloud: Cloud, instance_id: str, key: str) -> None:
    """Neither the host's files nor its PID 1's environment (what the agent reads the provider's variables
    from) hold the controller's cloud key."""
    index = cloud.backend.host_index(instance_id)
    assert index is not None
    h = cloud.farm.hosts[index]
    assert key not in h.init_env.values() and key not in " ".join(h.init_env)
    for sub in ("root", "tmp", "bin"):
        for path in (h.root_dir / sub).rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert key.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(("provider", "sleeps"), [("runpod", [2.0, 16.0]), ("vastai", [2.0])])
def test_with_the_controller_killed_every_machine_stops_itself_after_its_last_job(
        make_cloud: Callable[[str, int], Cloud], tmp_path: Path, provider: str, sleeps: list[float]) -> None:
    """RunPod: two machines, one whose job ends at once and one whose job runs past the lease (it never stops
    while the job runs); vast.ai: one machine, started again by `gpuq resume`, which then reads its job's end."""
    cloud = make_cloud(provider, len(sleeps))
    gpu, key = ("NVIDIA RTX A6000", RUNPOD_KEY) if provider == "runpod" else ("RTX 4090", VAST_KEY)
    names = _rent_and_submit(cloud, tmp_path, gpu, len(sleeps), sleeps)
    rows = cloud.hosts()
    instances = {n: rows[n].instance_id for n in names}
    jobs = {j.host: j for j in cloud.jobs()}
    attempt_dirs = [cloud.host_root(instances[n]) / "jobs" / jobs[n].id / "attempts" / "1" for n in names]
    killed = _kill_the_controller_while_all_run(cloud, tmp_path, lambda: all(d.is_dir() for d in attempt_dirs))

    def stopped(name: str) -> float | None:
        calls = [c for c in cloud.fake.instance_calls if c["instance"] == instances[name] and c["method"] != "GET"]
        return calls[0]["at"] if calls else None

    if len(names) == 2:  # the second job runs past the lease: its machine bills on until it ends
        assert wait_for(lambda: stopped(names[0]) is not None, timeout=25)
        time.sleep(max(0.0, killed + LEASE_MIN * 60 + LOOK_S + 1.0 - time.time()))  # its lease is out too
        assert stopped(names[1]) is None and not (attempt_dirs[1] / "exit.json").exists()
    assert wait_for(lambda: all(stopped(n) is not None for n in names), timeout=sleeps[-1] + 20)
    cloud.backend.wait_idle()
    for name in names:
        calls = [c for c in cloud.fake.instance_calls if c["instance"] == instances[name]]
        assert calls and all(c["allowed"] for c in calls), calls  # with its own key, on itself only
        job_end = _job_end(cloud, instances[name], jobs[name].id)
        at = stopped(name)
        assert at is not None and at >= job_end  # never while its job ran
        root = cloud.host_root(instances[name])  # the stopped disk keeps its results
        contact = (root / "controller_contact").stat().st_mtime  # the last gpuq command that reached it
        assert contact <= killed and at - contact >= LEASE_MIN * 60  # never before its lease ran out
        assert at - max(job_end, contact) <= LEASE_MIN * 60 + LOOK_S + 2.0, (name, at - job_end, at - contact)
        kept = [q.relative_to(root) for q in (root / "jobs" / jobs[name].id).rglob("*") if q.is_file()]
        assert any(q.name == "metrics.csv" for q in kept), kept
        record = json.loads((root / "selfstop.json").read_text())
        assert record["action"] == "stop" and record["mechanism"] == provider
        _no_controller_key_on(cloud, instances[name], key)
    states = {pid: s for pid, s in _states(cloud).items() if pid in instances.values()}
    assert set(states.values()) == {"stopped"}, states  # stopped, never terminated: the disk stays

    looked = time.time()
    status = cloud.gpuq("status", "--once")
    assert status.returncode in (0, 1), status.stdout + status.stderr
    ledger = cloud.ledger()
    try:
        for name in names:
            row = ledger.host(name)
            assert row is not None and row.lease_state == "stopped", (row, status.stdout)
            at = stopped(name)
            assert at is not None and row.lease_changed_at is not None
            # gpuq never saw the jobs end: the latest the machine can have stopped is when gpuq found it
            assert at <= row.lease_changed_at and looked <= row.lease_changed_at <= time.time()
            assert "stopped by itself" in row.lease_reason and "at most $" in row.lease_reason, row.lease_reason
            (found,) = [e for e in ledger.events(name, exact=True) if e.rule == "self_stop"]
            assert "ended unseen" in found.message and jobs[name].name in found.message, found.message
        # the jobs stay as gpuq last saw them: their ends are on the stopped disks, not guessed
        assert {j.state for j in ledger.jobs()} <= {"ASSIGNED", "RUNNING"}
    finally:
        ledger.close()
    before = {n: (r.lease_changed_at, r.lease_reason) for n, r in cloud.hosts().items()}
    again = cloud.gpuq("status", "--once")  # a second look changes nothing
    assert again.returncode in (0, 1)
    assert {n: (r.lease_changed_at, r.lease_reason) for n, r in cloud.hosts().items()} == before

    if provider == "runpod":
        return
    resumed = cloud.gpuq("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert wait_for(lambda: {j.state for j in cloud.jobs()} == {"SUCCEEDED"}, timeout=30), cloud.jobs()
    ledger = cloud.ledger()
    try:  # its own record of the stop, readable again: kept as its claim, inside gpuq's bounds
        (claim,) = [e for e in ledger.events(names[0], exact=True) if e.rule == "self_stop_claim"]
        assert not [e for e in ledger.events(names[0], exact=True) if e.rule == "host_clock"]
    finally:
        ledger.close()
    assert "says it stopped itself at" in claim.message and "never billed" in claim.message, claim.message


def _states(cloud: Cloud) -> dict[str, str]:
    """instance id -> "running" / "stopped" / "gone", as the fake holds it."""
    state = cloud.fake.state()
    if cloud.provider == "runpod":
        return {pid: {"EXITED": "stopped", "RUNNING": "running"}.get(p["status"], "gone")
                for pid, p in state["pods"].items()}
    return {str(iid): "stopped" if i.get("cur_state") == "stopped" else "running"
            for iid, i in state["instances"].items()}
