"""examples/hf_trainer, a Hugging Face ``Trainer`` project run unchanged (docs/checkpoints.md, "Directory
checkpoints"), on the embedded local host and on a namespace SSH host at once: each job killed -9 mid-run
resumes from its newest complete ``checkpoint-N/`` directory (its own log says so), never from one a kill
left half-written, and succeeds; the pull brings its checkpoint directories home file by file, verified.

Lean on purpose: one job per host, run side by side under one `gpuq watch`; a one-layer model, 16 short
steps; four trainer processes in all (transformers' import costs seconds of CPU each).  Needs transformers
and accelerate (the example's requirements.txt: the setup hook's pip finds them installed, offline).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.support.gpuquser import User
from tests.support.ownproject import copy_example
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration
pytest.importorskip("transformers", reason="the example's trainer needs transformers")
pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")

STEPS = 16  # a checkpoint-N/ every 2 steps; the kill lands after checkpoint-4 with 12 steps (>= 6 s) to go
HALF = STEPS - 1  # a step the trainer never saves at: the half-written directory planted below
LINE = f"-- --max_steps {STEPS} --save_steps 2 --step_sleep 0.5\n"
# the setup hook's pip finds the requirements installed and never looks further (the hosts have no network);
# one OpenMP thread, MKL's too: a tiny model's second thread only spins (about a quarter of each trainer's CPU)
ENV_LINE = ('env = { PIP_NO_INDEX = "1", PIP_DISABLE_PIP_VERSION_CHECK = "1", OMP_NUM_THREADS = "1", '
            'MKL_NUM_THREADS = "1" }\n')


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], gpuq_home: Path) -> Iterator[User]:
    u = User(host_farm(n=1, gpus=1), gpuq_home, "/root/gpuq-hf")
    u.env.update({"GPUQ_LOCAL_CPU_SLOTS": "1", "GPUQ_KILL_GRACE_S": "2", "GPUQ_STALL_AFTER_S": "300",
                  "GPUQ_STARTUP_GRACE_S": "300", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5", "GPUQ_PATROL_INTERVAL_S": "1",
                  "GPUQ_PREFLIGHT_SAMPLES": "1"})
    yield u
    u.stop_everything()  # the SSH host's; gpuq_home's teardown ends the local host's


def _complete_steps(out: Path) -> list[int]:
    """The steps of the checkpoint directories whose trainer_state.json (HF writes it last) is whole JSON."""
    steps = []
    for state in out.glob("checkpoint-*/trainer_state.json"):
        try:
            json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        steps.append(int(state.parent.name.split("-")[1]))
    return sorted(steps)


class Job:
    """One job of the example on one host: where its files are and how to kill its trainer there."""

    def __init__(self, user: User, job_id: str, sweep: str, host: str) -> None:
        self.id, self.sweep, self.host, self.user = job_id, sweep, host, user
        root = user.home / "local" if host == "local" else user.host_dir(0)
        self.jdir = root / "jobs" / job_id
        self.out = self.jdir / "run" / "out"
        self.killed_at: list[int] | None = None  # the complete checkpoints there were when the kill landed

    def log(self, attempt: int) -> str:
        path = self.jdir / "attempts" / str(attempt) / "job.log"
        return path.read_text(errors="replace") if path.is_file() else f"(no {path})"

    def kill_once_saved_twice(self) -> bool:
        """Once checkpoint-4 is complete (training goes on): kill -9 the trainer's whole group, no warning,
        with the newest directory half-written (a host's agent may start the retry at once)."""
        if self.killed_at is None and 4 in _complete_steps(self.out):
            pgid = json.loads((self.jdir / "attempts" / "1" / "pgid").read_text())["pgid"]
            self.plant_half_written()
            if self.host == "local":
                os.killpg(pgid, signal.SIGKILL)
            else:
                killed = self.user.farm.ssh(0, "kill", "-9", f"-{pgid}")
                assert killed.returncode == 0, killed.stderr
            self.killed_at = _complete_steps(self.out)
        return self.killed_at is not None

    def plant_half_written(self) -> None:
        """What a kill in the middle of a save leaves: the newest directory, weights and no trainer_state.json
        (at a step the trainer never saves at, so it never completes it)."""
        half = self.out / f"checkpoint-{HALF}"
        half.mkdir()
        (half / "model.safetensors").write_bytes(b"half written")
        later = time.time() + 5
        os.utime(half / "model.safetensors", (later, later))


def _story(user: User, jobs: list[Job]) -> str:
    """What a failed wait should show: every attempt's log tail and gpuq's view of the jobs."""
    status = user.gpuq("status", "--all", "--json")
    logs = [f"--- {job.host} attempt {n}\n{job.log(n)[-2000:]}" for job in jobs for n in (1, 2, 3)]
    return "\n".join([*logs, status.stdout[-4000:], status.stderr[-2000:]])


def test_hf_trainer_killed_minus_nine_on_local_and_ssh_hosts_resumes_from_its_newest_complete_checkpoint_dir(
        user: User, tmp_path: Path) -> None:
    user.add_hosts(1)
    queue = copy_example("hf_trainer", tmp_path, queue=f"name=hf-local {LINE}", toml_extra=ENV_LINE)
    (queue.parent / "ssh.txt").write_text(f"name=hf-ssh gpus=1 {LINE}")
    jobs = []
    for path, host in ((queue, "local"), (queue.parent / "ssh.txt", "g0")):
        submitted = user.gpuq("submit", str(path), "--host", host, "--json")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        doc = json.loads(submitted.stdout)
        (job,) = doc["jobs"]
        jobs.append(Job(user, job["id"], doc["sweep"], host))

    def both_killed() -> bool:
        return all([job.kill_once_saved_twice() for job in jobs])

    assert wait_for(both_killed, timeout=300, interval=0.2), _story(user, jobs)
    for job in jobs:
        assert job.killed_at and max(job.killed_at) < STEPS, (job.host, job.killed_at)  # killed mid-run
    watched = user.gpuq("watch", "--interval", "1", "--max-hours", "0.1", timeout=600)
    assert watched.returncode == 0, (watched.stdout[-3000:], watched.stderr, _story(user, jobs))
    status = user.gpuq("status", "--all", "--json")  # two sweeps, both finished
    assert status.returncode == 0, status.stderr
    states = {j["id"]: j["state"] for j in json.loads(status.stdout)["jobs"]}
    for job in jobs:
        second = job.log(2)
        assert states[job.id] == "SUCCEEDED", (job.host, second[-3000:])
        picked = re.findall(r"^gpuq: resuming from checkpoint out/checkpoint-(\d+)$", second, re.MULTILINE)
        own = re.findall(r"^resuming from \S+/out/checkpoint-(\d+) at step (\d+)$", second, re.MULTILINE)
        assert picked and own and picked[0] == own[0][0] == own[0][1], (job.host, second[-3000:])  # its own word
        assert job.killed_at is not None and int(picked[0]) == max(job.killed_at), (job.host, picked, job.killed_at)
        assert f"done at step {STEPS}" in second, (job.host, second[-3000:])
        assert not (job.jdir / "attempts" / "3").exists(), job.host
    for job in jobs:
        pulled = user.gpuq("pull", "--sweep", job.sweep)
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        (home,) = (user.home / "results").glob(f"*/{job.id}")
        last = home / "run" / "out" / f"checkpoint-{STEPS}"
        assert (last / "model.safetensors").is_file() and (last / "trainer_state.json").is_file(), job.host
        assert json.loads((last / "trainer_state.json").read_text())["global_step"] == STEPS
        assert (home / "run" / "out" / f"checkpoint-{HALF}" / "model.safetensors").read_bytes() == b"half written"
