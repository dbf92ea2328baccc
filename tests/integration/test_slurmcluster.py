"""The Slurm test cluster itself (tests/support/slurmcluster/): real slurmctld/slurmd/munged on a
routed farm of test hosts, driven over SSH from the login node as gpuq drives it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import slurmcluster
from tests.support.slurmcluster import SlurmCluster
from tests.support.testhosts import FarmFactory, pid_ns

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(host_farm_module: FarmFactory) -> Iterator[SlurmCluster]:
    """One cluster for the module (login host 0, compute hosts 1 and 2, 2 GPUs and 2 CPUs each); a
    test that breaks a node mends it before it ends."""
    problem = slurmcluster.requirements_problem()
    if problem:
        pytest.skip(problem)
    farm = host_farm_module(n=3, gpus=2, routed=True)
    with SlurmCluster(farm) as c:
        yield c


def _count(path: Path) -> int:
    try:
        return int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0


def test_cluster_is_up_and_reachable_over_ssh(cluster: SlurmCluster) -> None:
    assert cluster.node_states() == dict.fromkeys(cluster.nodes, "idle")
    assert cluster.start_seconds > 0
    # a plain SSH session on the login node finds the cluster: SLURM_CONF comes from sshd's SetEnv
    out = cluster.check_login('echo "$SLURM_CONF"; sinfo -h -o "%P %a %l %D %G"').splitlines()
    assert out[0] == str(cluster.conf)
    assert out[1].split()[:4] == ["gpu*", "up", "infinite", "2"]
    assert "gpu:2" in out[1]
    assert not Path("/etc/slurm/slurm.conf").exists()  # nothing written to the machine's /etc
    # the routed farm: hosts reach each other through per-veth forwarding (ip_forward left alone)
    farm = cluster.farm
    for h in farm.hosts:
        assert Path(f"/proc/sys/net/ipv4/conf/{h.veth}/forwarding").read_text().strip() == "1"
    probe = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=2).close()"
    assert farm.ssh(cluster.compute[-1], "python3", "-c", probe, farm.hosts[cluster.login].address).returncode == 0
    # every daemon lives in its own host's PID namespace
    for kind, hosts in (("munged", [cluster.login, *cluster.compute]), ("slurmctld", [cluster.login]),
                        ("slurmd", list(cluster.compute))):
        for i in hosts:
            pid = cluster.daemon_pid(kind, i)
            assert pid is not None and pid_ns(pid) == farm.hosts[i].pidns, (kind, i)


def test_batch_job_writes_shared_dir_and_completes(cluster: SlurmCluster) -> None:
    job = cluster.sbatch(wrap='echo "$(hostname) $SLURM_JOB_ID" > "out-$SLURM_JOB_ID.txt"')
    done = cluster.wait_job(job, {"COMPLETED", "FAILED"}, timeout=20)
    assert (done.state, done.reason) == ("COMPLETED", "None")
    assert done.nodes in cluster.nodes
    out = cluster.shared_dir / f"out-{job}.txt"
    assert out.read_text() == f"{done.nodes} {job}\n"  # the test process sees it...
    assert cluster.check_login(["cat", str(out)]) == f"{done.nodes} {job}\n"  # ...and the login node
    # ended jobs stay in `squeue --states=all` (MinJobAge=600); plain squeue hides them
    assert [(j.job_id, j.state) for j in cluster.squeue(job)] == [(job, "COMPLETED")]
    assert cluster.check_login(["squeue", "-h", f"--jobs={job}"]) == ""
    assert cluster.show_job(job)["ExitCode"] == "0:0"


def test_gres_gpus_set_cuda_visible_devices(cluster: SlurmCluster) -> None:
    one = cluster.sbatch("--gres=gpu:1", wrap='echo "$CUDA_VISIBLE_DEVICES" > "gpu-$SLURM_JOB_ID.txt"')
    two = cluster.sbatch("--gres=gpu:2", wrap='echo "$CUDA_VISIBLE_DEVICES" > "gpu-$SLURM_JOB_ID.txt"')
    for job in (one, two):
        assert cluster.wait_job(job, {"COMPLETED", "FAILED"}, timeout=20).state == "COMPLETED"
    assert (cluster.shared_dir / f"gpu-{one}.txt").read_text().strip() in ("0", "1")
    assert (cluster.shared_dir / f"gpu-{two}.txt").read_text().strip() == "0,1"
    # more GPUs than a node has: rejected at submission
    res = cluster.ssh_login(["sbatch", "--gres=gpu:3", "--wrap=true"])
    assert res.returncode != 0 and "Requested node configuration is not available" in res.stderr


def test_requeue_restarts_a_running_job(cluster: SlurmCluster) -> None:
    counter = cluster.shared_dir / "requeue-counter"
    job = cluster.sbatch(script=f"#!/bin/sh\nn=$(cat {counter} 2>/dev/null || echo 0)\n"
                                f"echo $((n + 1)) > {counter}\nexec sleep 300\n")
    cluster.wait_job(job, {"RUNNING"})
    assert cluster.wait_for(lambda: _count(counter) == 1, 10)
    cluster.requeue(job)
    pending = cluster.wait_job(job, {"PENDING"}, timeout=10)
    assert pending.reason == "BeginTime"  # held for cred_expire (5 s) before it may start again
    assert cluster.wait_for(lambda: _count(counter) == 2, 20), cluster.log_tails()
    assert cluster.wait_job(job, {"RUNNING"}).state == "RUNNING"
    assert cluster.show_job(job)["Restarts"] == "1"
    cluster.scancel(job)
    cluster.wait_job(job, {"CANCELLED"})


def test_scancel_and_unknown_job_ids(cluster: SlurmCluster) -> None:
    running = cluster.sbatch(wrap="sleep 300")
    cluster.wait_job(running, {"RUNNING"})
    cluster.scancel(running)
    cancelled = cluster.wait_job(running, {"CANCELLED"})
    assert cancelled.reason == "None"
    # an id slurmctld does not know (never was, or purged after MinJobAge): squeue fails...
    res = cluster.ssh_login(["squeue", "-h", "--jobs=999999"])
    assert res.returncode == 1 and "Invalid job id specified" in res.stderr
    assert cluster.job(999999) is None
    # ...but among known ones it is silently left out
    res = cluster.ssh_login(["squeue", "-h", "--states=all", "-o", "%i %T", f"--jobs={running},999999"])
    assert res.returncode == 0 and res.stdout.split() == [running, "CANCELLED"]
    # squeue --json works without extra plugins (openapi/v0.0.38) and lists ended jobs too
    by_id = {str(j["job_id"]): j for j in cluster.squeue_json()}
    assert by_id[running]["job_state"] == "CANCELLED"


def test_stopped_slurmd_fails_its_jobs_and_requeues_requeueable_ones(cluster: SlurmCluster) -> None:
    node = cluster.nodes[0]
    counter = cluster.shared_dir / "nodefail-counter"
    plain = cluster.sbatch("--no-requeue", f"--nodelist={node}", wrap="sleep 300")
    requeueable = cluster.sbatch("--requeue", f"--nodelist={node}", wrap=f"echo x >> {counter}; exec sleep 300")
    for job in (plain, requeueable):
        cluster.wait_job(job, {"RUNNING"})
    assert cluster.wait_for(lambda: counter.exists() and len(counter.read_text().split()) == 1, 10)
    t0 = time.monotonic()
    cluster.stop_slurmd(node, jobs=True)  # the node crashes: slurmd and the jobs' processes die
    try:
        failed = cluster.wait_job(plain, {"NODE_FAIL"}, timeout=30)
        took = time.monotonic() - t0
        assert failed.reason == "NodeDown" and failed.nodes == node
        requeued = cluster.job(requeueable)
        assert requeued is not None and requeued.state == "PENDING", requeued
        assert cluster.node_states()[node] in ("down*", "down"), took
    finally:
        cluster.start_slurmd(node)  # back (ReturnToService=2): the requeued job runs again there
    assert cluster.wait_for(lambda: len(counter.read_text().split()) == 2, 20), cluster.log_tails()
    assert cluster.wait_job(requeueable, {"RUNNING"}).nodes == node
    assert cluster.show_job(requeueable)["Restarts"] == "1"
    assert cluster.job(plain).state == "NODE_FAIL"  # type: ignore[union-attr]
    cluster.scancel(requeueable)
    cluster.wait_job(requeueable, {"CANCELLED"})
    assert cluster.node_states() == dict.fromkeys(cluster.nodes, "idle")


def test_time_limit_gives_timeout(cluster: SlurmCluster) -> None:
    """Slurm's smallest time limit is a minute, and slurmctld checks limits every 30 s; moving a running
    job's EndTime to now makes it TIMEOUT at the next check (under 31 s, not 60-90 s)."""
    job = cluster.sbatch("--time=10", wrap="sleep 300")
    cluster.wait_job(job, {"RUNNING"})
    # StartTime and "now" are whole seconds: in the second the job started, EndTime=now would be a time
    # limit of 0 and is refused ("Invalid time specified"); from the next second on it is taken
    deadline = time.monotonic() + 10
    while True:
        moved = cluster.ssh_login(["scontrol", "update", f"JobId={job}", "EndTime=now"])
        if moved.returncode == 0 or "Invalid time specified" not in moved.stdout + moved.stderr \
                or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert moved.returncode == 0, moved.stdout + moved.stderr + cluster.log_tails()
    ended = cluster.wait_job(job, {"TIMEOUT"}, timeout=45)
    assert ended.reason == "TimeLimit"
    assert cluster.show_job(job)["ExitCode"] == "0:15"  # SIGTERM


def test_teardown_kills_daemons_and_removes_shared_dir(host_farm: FarmFactory) -> None:
    problem = slurmcluster.requirements_problem()
    if problem:
        pytest.skip(problem)
    farm = host_farm(n=2, gpus=1, routed=True)
    c = SlurmCluster(farm, login=0, compute=(1,), gpus_per_node=1, cpus_per_node=1).start()
    pids = [p for p in (c.daemon_pid(k, i) for k in ("munged", "slurmctld", "slurmd") for i in (0, 1)) if p]
    assert len(pids) == 4 and c.shared_dir.is_dir()
    assert str(c.shared_dir) in json.loads(farm.state_file.read_text())["attached_dirs"]  # `down` removes it too
    c.teardown()
    c.teardown()  # idempotent
    assert not c.shared_dir.exists()
    assert not [p for p in pids if os.path.exists(f"/proc/{p}") and pid_ns(p) in {h.pidns for h in farm.hosts}]
    assert farm.ssh(0, "true").returncode == 0  # the farm is untouched
