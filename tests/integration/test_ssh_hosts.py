"""gpuq over real OpenSSH hosts (one per network/PID/mount namespace), as a user drives it: the CLI.

Each test has its own GPUQ_HOME and its own data dir on the hosts, so tests sharing the module's
farm never see each other's files.  Hosts use the `rehearsal` profile: their GPUs come from the
farm's fake nvidia-smi, training runs on CPU with real torchrun.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts.bench_project import TINY_CONFIG
from tests.conftest import ROOT, wait_for
from tests.support.gpuquser import User
from tests.support.lightproject import light_config, light_project, sleeper_project
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

GPUQ = [sys.executable, "-m", "orchestrator"]
EXAMPLE_EPOCHS = 1


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=3, gpus=2)



def _project(tmp_path: Path, lines: list[str], epochs_config: str = TINY_CONFIG) -> Path:
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    (work / "configs" / "tiny.yaml").write_text(epochs_config)
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def _example_queue(tmp_path: Path) -> Path:
    """The README's example project and queue (four jobs of two GPUs each), with EXAMPLE_EPOCHS epochs
    instead of 5-6: placement, launches, pulls and re-submission are the same for any length, and
    the queue exactly as shipped runs in test_example_queue.py."""
    project = tmp_path / "example"
    shutil.copytree(ROOT / "payload", project, ignore=shutil.ignore_patterns("__pycache__", "queue.txt"))
    lines = [line.split("#", 1)[0].split() for line in (ROOT / "payload" / "queue.txt").read_text().splitlines()]
    queue = project / "queue.txt"
    # one seed per line (the shipped queue has seeds=2): four jobs, one more than the three hosts
    kept = [[w[0], w[1], *(x for x in w[3:] if not x.startswith("seeds="))] for w in lines if w]
    queue.write_text("".join(f"{w[0]} {w[1]} {EXAMPLE_EPOCHS} {' '.join(w[2:])}\n" for w in kept))
    assert queue.read_text().count("gpus=2") == 4
    return queue


def test_example_queue_runs_once_per_job_across_three_hosts_and_comes_home_verified(user: User,
                                                                                    tmp_path: Path) -> None:
    user.add_hosts()
    listed = user.gpuq("hosts", "list")
    assert listed.returncode == 0 and all(f"g{i}" in listed.stdout for i in range(3))

    example = _example_queue(tmp_path)
    submitted = user.gpuq("submit", str(example), "--wait", timeout=900)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + user.logs_of_unfinished()
    doc = user.status_doc()
    jobs = doc["jobs"]
    assert len(jobs) == 4 and {j["state"] for j in jobs} == {"SUCCEEDED"}
    assert {j["host"] for j in jobs} <= {"g0", "g1", "g2"} and len({j["host"] for j in jobs}) == 3
    launches = user.launches()
    assert sorted(launches) == sorted(j["id"] for j in jobs)
    assert all(len(hosts) == 1 for hosts in launches.values()), launches  # exactly once, one host each
    # the GPU slots of the fake nvidia-smi were used: each job got two distinct GPUs
    for job in jobs:
        i = int(job["host"][1:])
        # a job stolen from a busy host's inbox runs as attempt 2 on its new host: take the one that launched
        record = json.loads(next(user.host_dir(i).glob(f"jobs/{job['id']}/attempts/*/launch.json")).read_text())
        assert record["kind"] == "gpu" and len(set(record["slots"])) == 2 and record["device"] == "cpu"

    pulled = user.gpuq("pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    sweep = jobs[0]["sweep_id"]
    for job in jobs:
        local = user.home / "results" / sweep / job["id"]
        record = json.loads((local / "PULL_VERIFIED.json").read_text())
        assert record["files"] >= 4 and (local / "ckpt" / "best.pt").is_file()
    results = user.gpuq("results")
    assert results.returncode == 0 and "val_acc" in results.stdout and results.stdout.count("verified") >= 4

    # an unchanged project re-submitted pushes no bundle bytes: the hosts' bundle dirs stay as they are
    # (the reuse check leaves its marker, bundles/.<sha>.verified, beside them: bundle_check.py)
    def bundles(i: int) -> list[Path]:
        return sorted(p for p in user.host_dir(i).glob("bundles/*") if not p.name.startswith("."))

    before = {i: [p.name for p in bundles(i)] for i in range(3)}
    stamps = {i: [p.stat().st_mtime_ns for p in bundles(i)] for i in range(3)}
    again = user.gpuq("submit", str(example), "--rerun")  # run again: the cache would reuse them
    assert again.returncode == 0, again.stderr
    assert before == {i: [p.name for p in bundles(i)] for i in range(3)}
    assert stamps == {i: [p.stat().st_mtime_ns for p in bundles(i)] for i in range(3)}
    assert all(list(user.host_dir(i).glob("bundles/.*.verified")) for i in range(3))  # checked before reuse
    assert "already succeeded" in again.stdout + again.stderr  # the twins are named
    assert "bundle already on g0, g1, g2" in again.stdout
    assert "bundle pushed to g0, g1, g2" in submitted.stdout
    second = re.search(r"^sweep (q[a-z2-7]{6}):", again.stdout, re.M)
    assert second and user.gpuq("cancel", "-y", "--sweep", second.group(1)).returncode == 0


def test_cut_connection_and_stopped_sshd_leave_jobs_running(user: User, farm: HostFarm, tmp_path: Path) -> None:
    user.add_hosts()
    # 40 steps of 0.5 s each (a sleep, no CPU): the jobs outlast the cuts on any machine's load.  The light
    # stdlib trainer (tests/support/lightproject.py): what is under test is the transport, not training
    queue = light_project(tmp_path, {"tiny": light_config(steps=40, step_s=0.5)},
                          [f"configs/tiny.yaml classify 5 name=f{i} gpus=2" for i in range(3)])
    submitted = user.gpuq("submit", str(queue))
    assert submitted.returncode == 0, submitted.stderr

    def running() -> bool:
        return sum(j["state"] == "RUNNING" for j in user.status_doc()["jobs"]) == 3

    assert wait_for(running, timeout=120, interval=1.0), user.status_doc()
    on_host1 = {j["id"] for j in user.status_doc()["jobs"] if j["host"] == "g1"}

    def trainers_on_host1() -> set[int]:  # RUNNING means the wrapper's group lives; torchrun may start later
        return {pid for pid, c in farm.host_processes(1).items() if "train.py" in c}

    assert wait_for(trainers_on_host1, timeout=120, interval=0.5)
    before = trainers_on_host1()
    farm.cut_connections(0)
    assert farm.ssh_sessions(0) == []  # every SSH session of host 0 dropped (its listener stays)
    farm.stop_sshd(1)
    try:
        # checked at once: the job may well finish during the slower checks below
        assert before & trainers_on_host1(), "the training processes on host 1 died with its sshd"
        doc = user.status_doc()
        hosts = {h["name"]: h for h in doc["hosts"]}
        assert hosts["g1"]["unreachable_since"] is not None
        # a transport failure is no verdict on a job: host 1's jobs keep their state and keep running
        assert {j["state"] for j in doc["jobs"] if j["id"] in on_host1} == {"RUNNING"}
        assert hosts["g0"]["unreachable_since"] is None  # the cut link was simply reopened
        shown = user.gpuq("status", "--once")
        assert "unreachable" in shown.stdout
    finally:
        farm.start_sshd(1)
    waited = user.gpuq("wait", timeout=600)
    assert waited.returncode == 0, waited.stdout + waited.stderr + user.logs_of_unfinished()
    doc = user.status_doc()
    assert {j["state"] for j in doc["jobs"]} == {"SUCCEEDED"}
    assert all(len(v) == 1 for v in user.launches().values())
    assert {h["name"]: h["unreachable_since"] for h in doc["hosts"]}["g1"] is None


def test_controller_killed_mid_submit_leaves_a_consistent_ledger(user: User, tmp_path: Path) -> None:
    user.add_hosts()
    queue = _project(tmp_path, [f"configs/tiny.yaml classify 1 name=k{i}" for i in range(4)])
    env = {**os.environ, **user.env}
    for delay in (0.6, 1.2, 1.8):
        proc = subprocess.Popen([*GPUQ, "submit", str(queue)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    # whatever the kills interrupted, the next status/wait finishes every recorded job exactly once
    waited = user.gpuq("wait", timeout=600)
    doc = user.status_doc()
    jobs = user.gpuq("status", "--json", "--all")
    all_jobs = json.loads(jobs.stdout)["jobs"]
    for sweep in {j["sweep_id"] for j in all_jobs}:
        user.gpuq("wait", "--sweep", sweep, timeout=600)
    all_jobs = json.loads(user.gpuq("status", "--json", "--all").stdout)["jobs"]
    assert all(j["state"] == "SUCCEEDED" for j in all_jobs), (waited.stdout, doc, user.logs_of_unfinished())
    launches = user.launches()
    assert sorted(launches) == sorted(j["id"] for j in all_jobs)
    assert all(len(v) == 1 for v in launches.values()), launches
    # every sweep in the ledger is whole: its job count matches what the queue holds
    counts = json.loads(user.gpuq("status", "--json", "--all").stdout)["sweeps"]
    assert all(s["jobs"] == 4 for s in counts), counts


def test_changed_host_key_is_refused_until_the_user_checks_it(host_farm: Callable[..., HostFarm],
                                                              tmp_path: Path) -> None:
    farm = host_farm(n=1, gpus=1)
    home = tmp_path / "home"
    user = User(farm, home, "/root/gpuq-keys")
    address = farm.hosts[0].address
    key = str(farm.client_key)
    refused = user.gpuq("hosts", "add", "g0", f"root@{address}", "--key", key, "--profile", "rehearsal")
    assert refused.returncode != 0 and "unknown SSH host key" in refused.stderr
    assert "--trust-new-host-key" in refused.stderr and "Traceback" not in refused.stderr
    assert not (home / "known_hosts").exists() or address not in (home / "known_hosts").read_text()
    assert "g0" not in user.gpuq("hosts", "list").stdout

    user.add_hosts()
    old_known = (home / "known_hosts").read_text()
    assert oct((home / "known_hosts").stat().st_mode & 0o777) == "0o600"
    new_line = farm.regenerate_host_key(0)
    doc = user.status_doc()
    host = doc["hosts"][0] if doc["hosts"][0]["name"] == "g0" else doc["hosts"][1]
    assert host["unreachable_since"] is not None
    events = user.gpuq("hosts", "show", "g0")
    assert "CHANGED" in events.stdout
    assert (home / "known_hosts").read_text() == old_known  # the old entry is kept as evidence

    again = user.gpuq("hosts", "add", "g1", f"root@{address}", "--key", key, "--profile", "rehearsal",
                      "--trust-new-host-key")
    assert again.returncode != 0 and "CHANGED" in again.stderr  # TOFU never overrides a changed key

    from orchestrator.fleet.host_keys import key_fingerprint

    right = key_fingerprint(" ".join(new_line.split()[:2]))
    wrong = user.gpuq("hosts", "trust", "g0", "--fingerprint", "SHA256:" + "A" * 43)
    assert wrong.returncode != 0 and "nothing changed" in wrong.stderr
    ok = user.gpuq("hosts", "trust", "g0", "--fingerprint", right)
    assert ok.returncode == 0, ok.stderr
    doc = user.status_doc()
    assert [h["unreachable_since"] for h in doc["hosts"] if h["name"] == "g0"] == [None]


def test_shell_metacharacters_in_queue_values_reach_the_job_literally(user: User, farm: HostFarm,
                                                                      tmp_path: Path) -> None:
    user.remote_root = "/root/gpuq-$(touch${IFS}/tmp/pwned-root);`touch${IFS}/tmp/pwned-tick`'q\""
    user.add_hosts(1)
    evil = "configs/x$(touch${IFS}/tmp/pwned);`touch${IFS}/tmp/pwned2`'q\";echo${IFS}hi.yaml"
    work = tmp_path / "project"
    (work / evil).parent.mkdir(parents=True)
    (work / evil).write_text(TINY_CONFIG)
    (work / "queue.txt").write_text(f"{evil} classify 1 name=evil\n")
    assert not any(Path("/tmp").glob("pwned*"))
    submitted = user.gpuq("submit", str(work / "queue.txt"), "--wait", timeout=600)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + user.logs_of_unfinished()
    job = user.status_doc()["jobs"][0]
    assert job["state"] == "SUCCEEDED"
    run_env = next(user.host_dir(0).glob(f"jobs/{job['id']}/attempts/1/run.env")).read_text()
    assert "pwned" in run_env  # the literal text arrived, quoted
    for where in (farm.hosts[0].root_dir / "tmp", Path("/tmp")):
        assert not list(where.glob("pwned*")), f"something executed: {list(where.glob('pwned*'))}"
    pulled = user.gpuq("pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr


def test_controller_killed_mid_pull_then_pull_resumes_and_verifies(user: User, farm: HostFarm,
                                                                   tmp_path: Path) -> None:
    user.add_hosts(1)
    wide = TINY_CONFIG.replace("model: {width: 32, depth: 1", "model: {width: 1024, depth: 2")
    queue = _project(tmp_path, ["configs/tiny.yaml classify 1 name=big"], wide)
    done = user.gpuq("submit", str(queue), "--wait", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    job = user.status_doc()["jobs"][0]
    sweep_dir = user.home / "results" / job["sweep_id"]
    best = next(user.host_dir(0).glob(f"jobs/{job['id']}/ckpt/best.pt"))
    assert best.stat().st_size > 2_000_000

    host = farm.hosts[0]
    slow = ["ip", "netns", "exec", host.netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
            "rate", "4mbit", "burst", "32kbit", "latency", "400ms"]
    subprocess.run(slow, check=True)
    try:
        env = {**os.environ, **user.env}
        proc = subprocess.Popen([*GPUQ, "pull"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        staged = sweep_dir / f"{job['id']}.incoming" / "ckpt" / "best.pt"
        assert wait_for(lambda: staged.is_file() and staged.stat().st_size > 100_000, timeout=60, interval=0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        partial = staged.stat().st_size
        assert 0 < partial < best.stat().st_size
    finally:
        subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
    # killed mid-transfer: nothing is verified, the ledger says so, the partial copy is kept
    results = user.gpuq("results")
    assert "verified" not in results.stdout
    assert not (sweep_dir / job["id"]).exists()

    again = user.gpuq("pull")
    assert again.returncode == 0, again.stdout + again.stderr
    final = sweep_dir / job["id"]
    assert (final / "ckpt" / "best.pt").read_bytes() == best.read_bytes()
    assert json.loads((final / "PULL_VERIFIED.json").read_text())["job_id"] == job["id"]
    assert not (sweep_dir / f"{job['id']}.incoming").exists()
    assert "verified" in user.gpuq("results").stdout


def test_stop_agent_on_an_ssh_host(user: User, tmp_path: Path) -> None:
    """`gpuq hosts stop-agent` over SSH: nothing to stop before any work, refused while the job runs, then the
    idle agent stops at once (docs/cli.md; the local host's case, --force included, is in test_stop_agent.py)."""
    user.env.update({"GPUQ_PATROL_INTERVAL_S": "1", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5"})
    (name,) = user.add_hosts(1)
    none = user.gpuq("hosts", "stop-agent", name)
    assert (none.returncode, none.stdout.strip()) == (0, f"{name}: no agent running; nothing to stop"), none.stderr
    queue = sleeper_project(tmp_path / "project", "name=nap -- 10")
    assert user.gpuq("submit", str(queue)).returncode == 0
    root = user.host_dir(0)
    assert wait_for(lambda: any(root.glob("jobs/*/attempts/1/pgid")), timeout=120)
    pid = json.loads((root / "agent.pid").read_text())["pid"]
    refused = user.gpuq("hosts", "stop-agent", name)
    assert refused.returncode == 2 and f"{name}: agent {pid} has 1 running jobs (nap); not stopped" in refused.stderr
    waited = user.gpuq("wait", "--timeout", "200", timeout=300)
    assert waited.returncode == 0, waited.stdout + waited.stderr + user.logs_of_unfinished()
    assert (root / "agent.pid").is_file()  # idle now, it would linger for its idle timeout
    stopped = user.gpuq("hosts", "stop-agent", name)
    assert (stopped.returncode, stopped.stdout.strip()) == (0, f"{name}: agent {pid} stopped"), stopped.stderr
    assert not (root / "agent.pid").exists()
