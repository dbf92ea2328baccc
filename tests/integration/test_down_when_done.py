"""Billing stops when the work stops (docs/providers.md, "Down when done"), end to end: `gpuq up
--down-when-done` on the fake RunPod, whose pods are real namespace SSH hosts, a short sweep of a
project's own trainer (stdlib, a second a job), and `gpuq watch` until the sweep ends.

Afterwards every pod is gone at the fake, every result and the failed attempt's log and exit record
are at home and verified, and the ledger says when each pod stopped billing.  A pod made to garble a
result on its way home (its `tail`, which serves downloads where sshd has no SFTP, changes bytes of
every metrics.csv it sends) is kept, billing, with an escalation.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from orchestrator.transfer import evidence
from tests.integration.test_cloud import Cloud
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

TRAIN = """\
import sys, time
args = sys.argv[1:]
time.sleep(1.0)
with open("metrics.csv", "w") as fh:
    fh.write("step,val_acc\\n1,0.50\\n2,0.60\\n")
print("trained", args, flush=True)
sys.exit(3 if "--fail" in args else 0)
"""
TOML = '[run]\ncommand = "train.py {args}"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'
# A pod whose downloads garble results: every metrics.csv it sends arrives with its digits changed.
GARBLING_TAIL = """#!/bin/sh
for last; do :; done
case "$last" in
  */metrics.csv) {tail} "$@" | tr 0 9 ;;
  *) exec {tail} "$@" ;;
esac
"""


@pytest.fixture
def cloud(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[Cloud]:
    made = Cloud(host_farm(n=2, gpus=1, sftp=False), tmp_path, "runpod")  # files travel over exec channels
    made.env["GPUQ_PATROL_IDLE_INTERVAL_S"] = "1"
    try:
        yield made
    finally:
        made.close()


def _up(cloud: Cloud, *flags: str) -> list[str]:
    up = cloud.gpuq("up", "--provider", "runpod", "--gpu", "NVIDIA RTX A6000", "--count", "2", "--gpus", "1",
                    "--profile", "rehearsal", *flags)
    assert up.returncode == 0, up.stdout + up.stderr
    hosts = cloud.hosts()
    assert all(h.down_when_done and h.lease_state == "running" for h in hosts.values())
    return sorted(hosts)


def _submit(cloud: Cloud, tmp_path: Path, lines: list[str]) -> None:
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    (work / "queue.txt").write_text("".join(line + "\n" for line in lines))
    submitted = cloud.gpuq("submit", str(work / "queue.txt"))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr


def _watch(cloud: Cloud) -> str:
    watched = cloud.gpuq("watch", "--interval", "1", "--max-hours", "0.1", timeout=420)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "done after" in watched.stdout, watched.stdout
    return watched.stdout


def _pods(cloud: Cloud) -> dict[str, str]:
    """instance id -> status of every pod the fake still lists."""
    return {pid: pod["status"] for pid, pod in cloud.fake.state()["pods"].items()}


def _findings(cloud: Cloud, host: str, rule: str) -> list[tuple[str, str]]:
    ledger = cloud.ledger()
    try:
        return [(e.severity, e.message) for e in ledger.events(host, exact=True) if e.rule == rule]
    finally:
        ledger.close()


def test_after_watch_both_pods_are_terminated_with_every_result_verified_at_home(cloud: Cloud,
                                                                                   tmp_path: Path) -> None:
    h0, h1 = _up(cloud, "--down-when-done")
    instances = {name: row.instance_id for name, row in cloud.hosts().items()}
    _submit(cloud, tmp_path, [f"name=a_ok host={h0} -- --lr 1", f"name=a_fail host={h0} retries=0 -- --fail",
                              f"name=b_ok host={h1} -- --lr 2"])
    out = _watch(cloud)

    assert out.count("terminated, down when done") == 2, out
    alive = {pid: status for pid, status in _pods(cloud).items() if status != "TERMINATED"}
    assert not set(instances.values()) & set(alive), (alive, out)  # the fake lists neither as billing
    ledger = cloud.ledger()
    try:
        jobs = {j.name: j for j in ledger.jobs()}
        # exit 3 is a transient failure: with no retries left the job waits for `gpuq resume` (LOST), from
        # the checkpoint shipped home: it does not keep its pod billing
        assert {n: j.state for n, j in jobs.items()} == {"a_ok": "SUCCEEDED", "a_fail": "LOST", "b_ok": "SUCCEEDED"}
        pulls = ledger.verified_pulls(j.id for j in jobs.values())
        assert set(pulls) == {jobs["a_ok"].id, jobs["b_ok"].id}
        for name in ("a_ok", "b_ok"):
            local = Path(pulls[jobs[name].id].local_dir)
            assert (local / "run" / "metrics.csv").read_text() == "step,val_acc\n1,0.50\n2,0.60\n"
            assert json.loads((local / "PULL_VERIFIED.json").read_text())["job_id"] == jobs[name].id
        failed = jobs["a_fail"]
        home = evidence.local_dir(cloud.home / "results", failed, 1)
        assert evidence.is_home(cloud.home / "results", failed, 1)
        assert "trained" in (home / "job.log").read_text()
        assert json.loads((home / "exit.json").read_text())["wrapper_code"] == ledger.attempt(failed.id, 1).exit_code
        for name in (h0, h1):
            row = ledger.host(name)
            assert row is not None and row.lease_state == "terminated" and row.lease_changed_at is not None
            last_end = max(a.ended_at or 0.0 for a in ledger.attempts() if a.host == name)
            assert last_end <= row.lease_changed_at  # it stopped billing after its last job, not before
            (done,) = [(sev, msg) for sev, msg in _findings(cloud, name, "down_when_done")]
            assert done[0] == "info" and "stopped billing at" in done[1] and "$" in done[1], done
    finally:
        ledger.close()


def test_a_pod_that_garbles_a_result_is_kept_with_an_escalation(cloud: Cloud, tmp_path: Path) -> None:
    cloud.env["GPUQ_AUTO_DOWN"] = "true"  # the setting instead of the flag
    h0, h1 = _up(cloud)
    instances = {name: row.instance_id for name, row in cloud.hosts().items()}
    index = cloud.backend.host_index(instances[h1])
    assert index is not None
    shim = cloud.farm.hosts[index].root_dir / "root" / "shim"
    shim.mkdir()
    tail = shutil.which("tail")
    assert tail is not None
    (shim / "tail").write_text(GARBLING_TAIL.format(tail=tail))
    os.chmod(shim / "tail", 0o755)
    cloud.farm.set_sshd_extra(index, f"SetEnv PATH=/root/shim:{os.environ.get('PATH', '/usr/bin:/bin')}")
    _submit(cloud, tmp_path, [f"name=a_ok host={h0} -- --lr 1", f"name=b_ok host={h1} -- --lr 2"])
    out = _watch(cloud)

    pods = _pods(cloud)
    assert pods.get(instances[h1]) == "RUNNING", (pods, out)  # kept: its result did not come home verified
    assert pods.get(instances[h0], "TERMINATED") == "TERMINATED", (pods, out)
    hosts = cloud.hosts()
    assert hosts[h1].lease_state == "running" and hosts[h0].lease_state == "terminated"
    (kept,) = _findings(cloud, h1, "unverified_result")
    assert kept[0] == "escalate" and "b_ok: quarantined" in kept[1] and "sha256" in kept[1], kept
    quarantined = list((cloud.home / "quarantine").iterdir())
    assert len(quarantined) == 1 and (quarantined[0] / "run" / "metrics.csv").read_text() != (
        "step,val_acc\n1,0.50\n2,0.60\n")
    ledger = Ledger(cloud.home / "ledger.db")
    try:
        jobs = {j.name: j for j in ledger.jobs()}
        assert set(ledger.verified_pulls(j.id for j in jobs.values())) == {jobs["a_ok"].id}
    finally:
        ledger.close()
    refused = cloud.gpuq("down", h1, "--yes")  # the teardown gate agrees: its result is not home
    assert refused.returncode != 0 and "not pulled and verified" in refused.stderr, refused.stderr


def test_a_pod_that_fails_its_preflight_is_ended_and_replaced_by_itself(cloud: Cloud, tmp_path: Path) -> None:
    """The first machine comes up with uncorrectable ECC errors on its GPU: `gpuq up --down-when-done`
    terminates it (it would bill, getting no job) and rents one machine of the same shape in its place,
    which then runs the sweep and goes when it is done."""
    faulty: list[str] = []

    def first_one_faulty(index: int, instance_id: str, fresh: bool) -> None:
        if fresh and not faulty:
            faulty.append(instance_id)
            cloud.farm.set_gpu_ecc(index, 0, uncorrected=3)

    cloud.backend.on_up = first_one_faulty
    up = cloud.gpuq("up", "--provider", "runpod", "--gpu", "NVIDIA RTX A6000", "--count", "1", "--gpus", "1",
                    "--profile", "rehearsal", "--down-when-done")
    assert up.returncode == 0, up.stdout + up.stderr
    hosts = cloud.hosts()
    (bad,) = [h for h in hosts.values() if h.instance_id == faulty[0]]
    (good,) = [h for h in hosts.values() if h.name != bad.name]
    assert f"{bad.name}: failed its GPU preflight; gpuq terminated it and rented {good.name} in its place" in up.stdout
    assert f"{good.name}: runpod {good.instance_id}" in up.stdout and "preflight PASS" in up.stdout, up.stdout
    assert bad.lease_state == "terminated" and "failed its GPU preflight" in bad.lease_reason
    assert "uncorrectable ECC" in bad.lease_reason, bad.lease_reason
    assert good.replaces == bad.name and good.down_when_done and good.lease_state == "running"
    assert _pods(cloud).get(bad.instance_id, "TERMINATED") == "TERMINATED"  # the fake bills it no more

    _submit(cloud, tmp_path, ["name=one -- --lr 1"])
    _watch(cloud)
    assert [j.state for j in cloud.jobs()] == ["SUCCEEDED"]
    assert cloud.hosts()[good.name].lease_state == "terminated"
    assert all(status == "TERMINATED" for status in _pods(cloud).values())
