"""The examples/ projects on namespace SSH hosts and on the fake vast.ai, driven end to end by the CLI:
example 1's trainer killed -9 mid-run resumes from its own snapshot.pt; example 2 (Hydra, installed by
its setup hook on hosts without network) preempted mid-run continues from its shipped checkpoint."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.integration.test_cloud import Cloud
from tests.support.gpuquser import User
from tests.support.ownproject import copy_example, data_prep_project, host_python, hydra_wheelhouse, offline_pip_env
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration


def _csv_rows(path: Path) -> list[dict[str, str]]:
    try:
        return list(csv.DictReader(path.read_text().splitlines()))
    except OSError:
        return []


def _story(user: User, job_dir: Path) -> str:
    """What a failed wait should show: the job's files on the host, its log's tail, gpuq's view."""
    files = sorted(str(p.relative_to(job_dir)) for p in job_dir.rglob("*")) if job_dir.is_dir() else ["(no job dir)"]
    logs = [f"--- {log}\n{log.read_text(errors='replace')[-2000:]}" for log in job_dir.glob("attempts/*/job.log")]
    return "\n".join([" ".join(files), *logs, json.dumps(user.status_doc()["jobs"])])


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(host_farm(n=1, gpus=2), home, "/root/gpuq-own")
    u.env.update({"GPUQ_STALL_AFTER_S": "60", "GPUQ_STARTUP_GRACE_S": "60", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5",
                  "GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_KILL_GRACE_S": "2", "GPUQ_PATROL_INTERVAL_S": "1"})
    yield u
    u.stop_everything()


def test_ddp_script_killed_minus_nine_resumes_from_its_own_snapshot(user: User, tmp_path: Path) -> None:
    user.add_hosts(1)
    # 0.25-1 s each (by the machine's load): the kill below lands after epoch 2's snapshot and long before
    # the end.  The wait starts as soon as submit returns (its --json names the job: no status call first),
    # and epochs 2..40 leave it ~10 s of window even on an idle machine
    epochs = 45
    queue = copy_example("ddp_snapshot", tmp_path, queue=f"name=victim gpus=2 -- {epochs} 1 --batch_size 16\n")
    submitted = user.gpuq("submit", str(queue), "--json")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    (job,) = json.loads(submitted.stdout)["jobs"]
    root = user.host_dir(0)
    run = root / "jobs" / job["id"] / "run"

    def snapshotted() -> bool:  # a snapshot of epoch >= 2 exists and training goes on
        return (run / "snapshot.pt").is_file() and 2 <= len(_csv_rows(run / "metrics.csv")) < epochs - 5

    assert wait_for(snapshotted, timeout=240, interval=0.3), _story(user, root / "jobs" / job["id"])
    pgid = json.loads((root / "jobs" / job["id"] / "attempts" / "1" / "pgid").read_text())["pgid"]
    user.farm.ssh(0, "kill", "-9", f"-{pgid}")  # the trainer's processes (torchrun and both ranks), no warning
    reached = len(_csv_rows(run / "metrics.csv"))
    assert reached < epochs
    watched = user.gpuq("watch", "--interval", "1", timeout=600)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    doc = user.status_doc()
    (after,) = doc["jobs"]
    assert after["state"] == "SUCCEEDED", (after, user.logs_of_unfinished())
    second = (root / "jobs" / job["id"] / "attempts" / "2" / "job.log").read_text()
    found = re.findall(r"Resuming training from snapshot at Epoch (\d+)", second)
    assert found and int(found[0]) > 0, second[-2000:]  # the script resumed by itself
    epochs_seen = [int(r["epoch"]) for r in _csv_rows(run / "metrics.csv")]
    assert epochs_seen[-1] == epochs and max(epochs_seen) == epochs
    # attempt 2 appends from the epoch after its snapshot: where the epochs go back (or run on) is where
    # attempt 1 ended, and the snapshot it resumed from is no newer than attempt 1's last epoch (the
    # ranks may finish an epoch after the group kill was sent: `reached` is a lower bound only)
    back = next((i for i in range(1, len(epochs_seen)) if epochs_seen[i] <= epochs_seen[i - 1]), None)
    first_last = epochs_seen[back - 1] if back is not None else int(found[0])
    assert reached <= first_last and int(found[0]) <= first_last, (reached, found, epochs_seen)
    assert epochs_seen[back if back is not None else int(found[0])] == int(found[0]) + 1, epochs_seen


def test_setup_that_prepares_data_serves_every_job_on_an_ssh_host(user: User, tmp_path: Path) -> None:
    user.add_hosts(1)
    queue = data_prep_project(tmp_path, queue="name=a gpus=1 -- 1\nname=b gpus=1 -- 2\n")
    submitted = user.gpuq("submit", str(queue))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    watched = user.gpuq("watch", "--interval", "1", timeout=300)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    jobs = user.status_doc()["jobs"]
    assert {j["state"] for j in jobs} == {"SUCCEEDED"}, user.logs_of_unfinished()
    root = user.host_dir(0)
    for job in jobs:  # a root trainer read the hook's data and could write neither it nor beside it
        assert (root / "jobs" / job["id"] / "run" / "metrics.csv").read_text().splitlines()[1] == "1,1000,0"
    (log,) = root.glob("setup/*/setup.log")
    assert log.read_text().count("prepared data/train.txt") == 1


@pytest.fixture
def hydra_cloud(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[Cloud]:
    python, venv = host_python()  # torch importable, hydra not: the setup hook must install it
    try:
        cloud = Cloud(host_farm(n=2, gpus=1, python=str(python)), tmp_path, "vastai")  # gpuq's spot market
        yield cloud
        cloud.close()
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_hydra_app_preempted_on_vastai_resumes_from_its_shipped_checkpoint(hydra_cloud: Cloud,
                                                                          tmp_path: Path) -> None:
    cloud = hydra_cloud
    # the pod goes after 3 epochs and one patrol; the epochs the trainer runs meanwhile (one torch thread:
    # offline_pip_env) must leave it mid-run.  The replacement trains the rest at about 0.06 s of CPU an
    # epoch, so a wide margin costs little
    epochs = 60
    queue = copy_example("hydra_csv", tmp_path,
                         queue=f"name=h gpus=1 -- model.width=64 optim.lr=1e-2 epochs={epochs} data.size=8192\n")
    # the hosts have no network: the setup hook's pip installs from a wheelhouse they can read
    toml = queue.parent / "gpuq.toml"
    toml.write_text(toml.read_text() + offline_pip_env(hydra_wheelhouse()))
    up = cloud.gpuq("up", "--provider", "vastai", "--gpu", "RTX 4090", "--count", "1", "--gpus", "1",
                    "--spot", "--bid", "0.3", "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    submitted = cloud.gpuq("submit", str(queue))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    (job,) = cloud.jobs()
    victim = job.host
    pod = cloud.hosts()[victim].instance_id
    root = cloud.host_root(pod)
    run = root / "jobs" / job.id / "run"
    assert wait_for(lambda: len(_csv_rows(run / "metrics.csv")) >= 3, timeout=300, interval=0.3), \
        (list(root.glob("setup/*/setup.log")), [p.read_text()[-2000:] for p in root.glob("jobs/*/attempts/*/job.log")])
    assert list(root.glob("setup/*/ok.json"))  # the setup hook ran (pip install -r requirements.txt) and passed
    before_ship = len(_csv_rows(run / "metrics.csv"))
    assert cloud.gpuq("patrol").returncode == 0  # a tick ships the job's checkpoint.pt home, verified
    shipped = list((cloud.home / "checkpoints" / job.id).rglob("checkpoint.pt"))
    assert shipped, list((cloud.home / "checkpoints").rglob("*"))
    reached = len(_csv_rows(run / "metrics.csv"))
    assert reached < epochs - 5  # still mid-run when the pod goes
    cloud.fake.preempt(pod)  # outbid: paused at once, no signal
    cloud.backend.wait_idle()
    cloud.fake.terminate_externally(pod)  # and then gone (its disk too): only the shipped copy is left
    cloud.backend.wait_idle()
    patrolled = cloud.gpuq("patrol")
    assert patrolled.returncode == 0, patrolled.stdout + patrolled.stderr
    resumed = cloud.gpuq("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "replaced by" in resumed.stdout and "resumed 1 job(s)" in resumed.stdout, resumed.stdout
    waited = cloud.gpuq("wait", "--timeout", "600", timeout=700)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    (after,) = cloud.jobs()
    assert after.state == "SUCCEEDED" and after.attempt_count >= 2, after
    new_root = cloud.host_root(cloud.hosts()[after.host].instance_id)
    new_run = new_root / "jobs" / job.id / "run"
    log = (new_root / "jobs" / job.id / "attempts" / str(after.attempt_count) / "job.log").read_text()
    at = re.findall(r"resumed from (\S+) at epoch (\d+)", log)
    assert at, log[-2000:]
    start = int(at[0][1])
    assert before_ship - 1 <= start <= reached, (before_ship, start, reached)  # the shipped copy, not epoch 0
    rows = _csv_rows(new_run / "metrics.csv")
    marked = [r for r in rows if r["resumed"] == "1"]
    assert marked and int(marked[-1]["epoch"]) == start + 1, rows  # the CSV shows where it resumed
    assert int(rows[-1]["epoch"]) == epochs
    assert list(new_root.glob("setup/*/ok.json"))  # the replacement ran the setup hook too
