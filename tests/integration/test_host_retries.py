"""The host heals its own jobs (docs/checkpoints.md, "Who retries what"; issue 25): a trainer killed by
SIGKILL (what the OOM killer or a watchdog does) is retried by the host's agent within seconds, with
resume, while no gpuq command runs; gpuq's next look records that attempt as if it had made it.

The trainer is stdlib Python (no torch): it checkpoints every step to ``ckpt.json`` in its run dir, resumes
from the file ``resume_args`` passes it, and appends ``ATTEMPT PID START_STEP`` to ``launches.log`` when it
starts, so every launch of every attempt is counted, whoever started it.

- on a namespace SSH host (tests/support/testhosts/): the SIGKILLed attempt 1 is followed by attempt 2
  on that host within 30 s, resumed from its checkpoint, started by the host; the job ends SUCCEEDED and
  the next `gpuq status` shows exactly 2 attempts, the ledger's history saying the host started the second;
  with ``retries=0`` the host starts nothing and gpuq settles the job.
- on the local host: the host's retry races gpuq's own requeue (gpuq first, the host first, both at once)
  and a cancel (first, at once): every attempt is launched once, none is lost, a cancel leaves nothing
  running.  The agent is paused (SIGSTOP) where the test needs gpuq to decide first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.core import protocol
from tests.conftest import kill_recorded_groups, run_gpuq, wait_for
from tests.support.gpuquser import User
from tests.support.hostretry import (
    Concurrent,
    agent_pid,
    attempt_dir,
    checkpointed_step,
    job_dirs,
    launches,
    ledger_view,
    write_project,
)
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

TRAINER = """\
import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--step-s", type=float, default=0.25)
p.add_argument("--resume", default="")
p.add_argument("--hold", default="")  # finish only once this file is gone (a test's kills land first)
a = p.parse_args()
start = json.load(open(a.resume))["step"] if a.resume else 0
with open("launches.log", "a") as f:
    f.write("%s %d %d\\n" % (os.environ["GPUQ_ATTEMPT"], os.getpid(), start))
for step in range(start + 1, a.steps + 1):
    time.sleep(a.step_s)
    with open("ckpt.tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace("ckpt.tmp", "ckpt.json")
    print("step", step, flush=True)
while a.hold and os.path.exists(a.hold):
    time.sleep(0.1)
"""
TOML = """\
[run]
command = "train.py {args}"
launcher = "python"
checkpoint = "ckpt.json"
resume_args = "--resume {checkpoint}"
"""
LOCAL_ENV = {"GPUQ_LOCAL_CPU_SLOTS": "5", "GPUQ_HEARTBEAT_S": "1", "GPUQ_KILL_GRACE_S": "2"}


def _project(base: Path, lines: list[str]) -> Path:
    return write_project(base, TRAINER, TOML, lines)


def _trained_past(root: Path, name: str, step: int) -> Path:
    """The job's directory once its attempt 1 has checkpointed past ``step``."""
    assert wait_for(lambda: name in job_dirs(root) and checkpointed_step(job_dirs(root)[name]) >= step,
                    timeout=120), sorted(job_dirs(root))
    return job_dirs(root)[name]


# --- on a namespace SSH host, with no gpuq command running ---------------------------------------------------


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=1, gpus=1)


def _submit(user: User, tmp_path: Path, line: str) -> Path:
    user.add_hosts(1)
    submitted = user.gpuq("submit", str(_project(tmp_path, [line])))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return user.host_dir(0)


def test_a_sigkilled_trainer_is_retried_by_its_host_with_resume_and_gpuq_records_it(
        user: User, tmp_path: Path) -> None:
    root = _submit(user, tmp_path, "name=victim retries=2 -- --steps 24 --step-s 0.25")
    job_dir = _trained_past(root, "victim", 3)
    ((attempt, pid, start),) = launches(job_dir)
    assert (attempt, start) == (1, 0)
    user.farm.ssh(0, "kill", "-9", str(pid))  # the host's own pid namespace: as the OOM killer would
    second = attempt_dir(job_dir, 2) / protocol.LAUNCH_FILE
    assert wait_for(second.is_file, timeout=30), (root / protocol.AGENT_LOG).read_text()[-3000:]
    decided = json.loads((attempt_dir(job_dir, 1) / protocol.NEXT_FILE).read_text())
    assert decided["by"] == "host" and decided["attempt"] == 2 and decided["class"] == "killed", decided
    assert wait_for(lambda: len(launches(job_dir)) == 2, timeout=60)
    (_, _, _), (attempt, _, resumed_from) = launches(job_dir)
    assert attempt == 2 and resumed_from >= 3  # resumed from its checkpoint, not from step 0
    argv = next(line for line in (attempt_dir(job_dir, 2) / protocol.JOB_LOG).read_text().splitlines()
                if " argv: " in line)
    assert "--resume" in argv and argv.rstrip(" =").endswith("ckpt.json"), argv
    spec = json.loads((job_dir / protocol.SPEC_FILE).read_text())
    assert spec["attempt"] == 2 and spec["started_by"] == "host" and spec["retry"]["left"] == 1, spec

    waited = user.gpuq("wait", "--timeout", "300", timeout=400)
    assert waited.returncode == 0, waited.stdout + waited.stderr + user.logs_of_unfinished()
    (job,) = user.status_doc()["jobs"]
    assert job["state"] == "SUCCEEDED" and job["attempt"] == 2, job
    _, attempts, history = ledger_view(user.home, job["id"])
    assert attempts == [(1, "EXITED"), (2, "EXITED")], attempts
    assert "killed: requeued with resume (retry 1 of 2)" in history, history
    assert any(m.startswith("started by the host: its agent retried attempt 1 with resume") for m in history)
    assert [a for a, _, _ in launches(job_dir)] == [1, 2]  # each attempt launched once


def test_with_retries_0_the_host_starts_nothing_and_gpuq_settles_the_job(user: User, tmp_path: Path) -> None:
    root = _submit(user, tmp_path, "name=once retries=0 -- --steps 40 --step-s 0.25")
    job_dir = _trained_past(root, "once", 2)
    ((_, pid, _),) = launches(job_dir)
    user.farm.ssh(0, "kill", "-9", str(pid))
    # the agent says the queue is done once it has handled the attempt's end (after deciding on a retry)
    assert wait_for(lambda: " done on " in (root / protocol.AGENT_LOG).read_text(), timeout=60)
    assert not attempt_dir(job_dir, 2).exists() and not (attempt_dir(job_dir, 1) / protocol.NEXT_FILE).exists()
    assert "RETRY" not in (root / protocol.AGENT_LOG).read_text()
    (job,) = user.status_doc()["jobs"]
    assert job["state"] == "LOST" and job["attempt"] == 1, job  # no retries left: `gpuq resume` once fixed
    assert json.loads((attempt_dir(job_dir, 1) / protocol.NEXT_FILE).read_text())["by"] == "controller"
    assert len(launches(job_dir)) == 1


# --- on the local host: the races -------------------------------------------------------------------------


@pytest.fixture
def local(gpuq_home: Path, tmp_path: Path) -> Iterator[tuple[Path, Callable[..., subprocess.CompletedProcess[str]]]]:
    env = dict(LOCAL_ENV, GPUQ_HOME=str(gpuq_home))

    def gpuq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_gpuq(*args, env=env, timeout=timeout)

    yield gpuq_home, gpuq
    kill_recorded_groups(gpuq_home / "local")


def _kill_paused(root: Path, job_dir: Path, then: Callable[[], object]) -> None:
    """SIGKILL the job's trainer while the agent is paused, wait for the attempt's exit record, run
    ``then`` (gpuq decides first), and let the agent go on."""
    agent = agent_pid(root)
    os.kill(agent, signal.SIGSTOP)
    try:
        os.kill(launches(job_dir)[-1][1], signal.SIGKILL)
        assert wait_for((attempt_dir(job_dir, 1) / protocol.EXIT_FILE).is_file, timeout=30)
        then()
    finally:
        os.kill(agent, signal.SIGCONT)


def test_a_host_retry_racing_gpuqs_requeue_launches_every_attempt_once(
        local: tuple[Path, Callable[..., subprocess.CompletedProcess[str]]], tmp_path: Path) -> None:
    home, gpuq = local
    root = home / "local"
    at_once = {"kill_then_tick": -1.0, "tick_then_kill": 0.0, "kill_mid_tick": 0.5}  # kill at (s after the tick)
    names = ["gpuq_first", "host_first", *at_once]
    hold = tmp_path / "hold"  # no trainer finishes before every kill of the race has landed, however slow the machine
    hold.touch()
    queue = _project(tmp_path, [f"name={n} retries=2 -- --steps 36 --step-s 0.25 --hold {hold}" for n in names])
    assert gpuq("submit", str(queue), "--host", "local").returncode == 0
    dirs = {n: _trained_past(root, n, 2) for n in names}

    def tick() -> None:
        ticked = gpuq("status")
        assert ticked.returncode == 0, ticked.stdout + ticked.stderr

    _kill_paused(root, dirs["gpuq_first"], tick)  # gpuq settles attempt 1 and starts attempt 2 itself
    os.kill(launches(dirs["host_first"])[-1][1], signal.SIGKILL)
    assert wait_for((attempt_dir(dirs["host_first"], 2) / protocol.LAUNCH_FILE).is_file, timeout=30)
    for name, kill_at in at_once.items():  # both at once, in either order
        if kill_at < 0:
            os.kill(launches(dirs[name])[-1][1], signal.SIGKILL)
        ticking = Concurrent(gpuq, "status")
        if kill_at >= 0:
            time.sleep(kill_at)
            os.kill(launches(dirs[name])[-1][1], signal.SIGKILL)
        assert ticking.succeeded(), ticking.result

    hold.unlink()
    waited = gpuq("wait", "--timeout", "300", timeout=400)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    jobs = {j["name"]: j for j in json.loads(gpuq("status", "--json").stdout)["jobs"]}
    for name in names:
        state, attempts, history = ledger_view(home, jobs[name]["id"])
        launched = [a for a, _, _ in launches(dirs[name])]
        assert state == "SUCCEEDED" and attempts == [(1, "EXITED"), (2, "EXITED")], (name, attempts, history)
        assert launched == [1, 2], (name, launched)  # never twice, never none
        assert len(list(dirs[name].glob(f"{protocol.ATTEMPTS_DIR}/*/{protocol.LAUNCH_FILE}"))) == 2
        assert launches(dirs[name])[1][2] >= 2, name  # attempt 2 resumed
        by_host = any(m.startswith("started by the host") for m in history)
        decided = json.loads((attempt_dir(dirs[name], 1) / protocol.NEXT_FILE).read_text())
        assert by_host == (decided["by"] == "host"), (name, decided, history)
        assert history.count("killed: requeued with resume (retry 1 of 2)") == 2, (name, history)  # LOST, QUEUED
    assert not any(m.startswith("started by the host") for m in ledger_view(home, jobs["gpuq_first"]["id"])[2])
    assert any(m.startswith("started by the host") for m in ledger_view(home, jobs["host_first"]["id"])[2])


def test_a_cancel_racing_a_host_retry_leaves_nothing_running(
        local: tuple[Path, Callable[..., subprocess.CompletedProcess[str]]], tmp_path: Path) -> None:
    home, gpuq = local
    root = home / "local"
    names = ["cancel_first", "kill_then_cancel", "cancel_then_kill"]
    queue = _project(tmp_path, [f"name={n} retries=2 -- --steps 200 --step-s 0.25" for n in names])
    assert gpuq("submit", str(queue), "--host", "local").returncode == 0
    dirs = {n: _trained_past(root, n, 2) for n in names}
    ids = {n: d.name for n, d in dirs.items()}

    def cancel(name: str) -> subprocess.CompletedProcess[str]:
        done = gpuq("cancel", ids[name])
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    _kill_paused(root, dirs["cancel_first"], lambda: cancel("cancel_first"))
    os.kill(launches(dirs["kill_then_cancel"])[-1][1], signal.SIGKILL)
    cancel("kill_then_cancel")
    cancelling = Concurrent(gpuq, "cancel", ids["cancel_then_kill"])
    os.kill(launches(dirs["cancel_then_kill"])[-1][1], signal.SIGKILL)
    assert cancelling.succeeded(), cancelling.result

    def settled(job_dir: Path) -> bool:  # every attempt launched has ended: nothing of the job runs
        return all((launch.parent / protocol.EXIT_FILE).is_file()
                   for launch in job_dir.glob(f"{protocol.ATTEMPTS_DIR}/*/{protocol.LAUNCH_FILE}"))

    for name in names:
        assert wait_for(lambda name=name: settled(dirs[name]), timeout=60), name
        state, attempts, _ = ledger_view(home, ids[name])
        launched = [a for a, _, _ in launches(dirs[name])]
        assert state == "CANCELLED", (name, state, attempts)
        assert launched in ([1], [1, 2]), (name, launched)  # at most the host's one retry, never twice
        started = {int(p.parent.name) for p in dirs[name].glob(f"{protocol.ATTEMPTS_DIR}/*/{protocol.LAUNCH_FILE}")}
        assert started <= {n for n, _ in attempts}, (name, started, attempts)  # the ledger knows each one
        for _, pid, _ in launches(dirs[name]):
            assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert [a for a, _, _ in launches(dirs["cancel_first"])] == [1]  # cancelled first: the host never retried
    assert not attempt_dir(dirs["cancel_first"], 2).exists()
