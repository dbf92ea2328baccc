"""The host heals a stall itself (docs/health.md, "Stalls the host heals itself"; issue 25): a trainer that
goes quiet is noticed by the host's agent by the patrol's own signs and limits, its stacks are saved, its
group killed and attempt 2 started with resume, while no gpuq command runs; gpuq's next look records it as
its own stall kill and retry.

The trainer is stdlib Python (no torch), as in test_host_retries.py: it checkpoints every step to
``ckpt.json``, resumes from the file ``resume_args`` passes it, appends ``ATTEMPT PID START_STEP`` to
``launches.log`` when it starts, and hangs silently (no output, no checkpoint) where told to.  The limits
are a few seconds (``GPUQ_STALL_AFTER_S`` and friends).

- on a namespace SSH host: attempt 1 checkpoints then hangs; within the limit and a few seconds the host
  has saved its stacks, killed it and started attempt 2 with ``--resume``; the job ends SUCCEEDED with 2
  attempts, attempt 1 LOST as stalled with its stacks, attempt 2 started by the host.  A hang before the
  first step: the host retries it once, then leaves the second to gpuq, which ends it deadlock_at_start.
- on the local host: gpuq's stall kill races the agent's (gpuq first, both at once): every attempt is
  launched once, none is lost.
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
p.add_argument("--steps", type=int, default=16)
p.add_argument("--step-s", type=float, default=0.2)
p.add_argument("--hang-at", type=int, default=0)  # attempt 1 hangs after this step
p.add_argument("--hang-first", action="store_true")  # every attempt hangs before its first step
p.add_argument("--resume", default="")
a = p.parse_args()
start = json.load(open(a.resume))["step"] if a.resume else 0
with open("launches.log", "a") as f:
    f.write("%s %d %d\\n" % (os.environ["GPUQ_ATTEMPT"], os.getpid(), start))
if a.hang_first:
    time.sleep(10 ** 6)
for step in range(start + 1, a.steps + 1):
    time.sleep(a.step_s)
    with open("ckpt.tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace("ckpt.tmp", "ckpt.json")
    print("step", step, flush=True)
    if step == a.hang_at and os.environ["GPUQ_ATTEMPT"] == "1":
        time.sleep(10 ** 6)
"""
TOML = """\
[run]
command = "train.py {args}"
launcher = "python"
checkpoint = "ckpt.json"
resume_args = "--resume {checkpoint}"
"""
LIMITS = {"GPUQ_STALL_AFTER_S": "3", "GPUQ_STARTUP_GRACE_S": "3", "GPUQ_START_STALL_AFTER_S": "2",
          "GPUQ_KILL_GRACE_S": "2"}
HEALED_WITHIN_S = 3 + 2 + 20  # the limit, the kill's grace, and room for a loaded CI machine


def _project(base: Path, lines: list[str]) -> Path:
    return write_project(base, TRAINER, TOML, lines)


def _first_attempt(ledger_home: Path, job_id: str) -> tuple[str, str]:
    from orchestrator.ledger import Ledger
    ledger = Ledger(ledger_home / "ledger.db")
    try:
        first = ledger.attempt(job_id, 1)
        assert first is not None
        return first.state, first.message
    finally:
        ledger.close()


# --- on a namespace SSH host, with no gpuq command running ---------------------------------------------------


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=1, gpus=1)


def _submit(user: User, tmp_path: Path, line: str) -> Path:
    user.env.update(LIMITS)
    user.add_hosts(1)
    submitted = user.gpuq("submit", str(_project(tmp_path, [line])))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return user.host_dir(0)


def test_a_trainer_that_checkpoints_then_hangs_is_healed_by_its_host_and_gpuq_records_it(
        user: User, tmp_path: Path) -> None:
    root = _submit(user, tmp_path, "name=hangs retries=2 -- --steps 16 --hang-at 4")
    assert wait_for(lambda: "hangs" in job_dirs(root) and checkpointed_step(job_dirs(root)["hangs"]) >= 4,
                    timeout=120)
    job_dir = job_dirs(root)["hangs"]
    second = attempt_dir(job_dir, 2) / protocol.LAUNCH_FILE
    assert wait_for(second.is_file, timeout=HEALED_WITHIN_S), (root / protocol.AGENT_LOG).read_text()[-3000:]
    decided = json.loads((attempt_dir(job_dir, 1) / protocol.NEXT_FILE).read_text())
    assert (decided["by"], decided["attempt"], decided["class"]) == ("host", 2, "stalled"), decided
    assert decided["stacks"].startswith("saved attempts/1/stacks.txt"), decided
    assert "train.py" in (attempt_dir(job_dir, 1) / protocol.STACKS_FILE).read_text()
    ended = json.loads((attempt_dir(job_dir, 1) / protocol.EXIT_FILE).read_text())
    assert ended["wrapper_signal"] == signal.SIGTERM, ended  # the agent's kill: TERM to the group
    assert wait_for(lambda: len(launches(job_dir)) == 2, timeout=60)
    (_, pid, _), (attempt, _, resumed_from) = launches(job_dir)
    assert attempt == 2 and resumed_from >= 4  # resumed from its checkpoint
    assert str(pid) not in user.farm.ssh(0, "sh", "-c", "ps -eo pid=").stdout.split()  # the hung trainer is gone
    spec = json.loads((job_dir / protocol.SPEC_FILE).read_text())
    assert (spec["started_by"], spec["retry"]["left"], spec["retry"]["deadlock_left"]) == ("host", 1, 0), spec

    waited = user.gpuq("wait", "--timeout", "300", timeout=400)
    assert waited.returncode == 0, waited.stdout + waited.stderr + user.logs_of_unfinished()
    (job,) = user.status_doc()["jobs"]
    assert job["state"] == "SUCCEEDED" and job["attempt"] == 2, job
    _, attempts, history = ledger_view(user.home, job["id"])
    assert attempts == [(1, "LOST"), (2, "EXITED")], attempts
    assert _first_attempt(user.home, job["id"])[1] == (
        "stalled: killed group of attempt 1 (killed); where it hung: attempts/1/stacks.txt")  # as gpuq's own
    assert "stalled: requeued with resume (retry 1 of 2)" in history, history
    assert any(m.startswith("started by the host: its agent retried attempt 1 with resume (stalled: ")
               for m in history), history
    assert [a for a, _, _ in launches(job_dir)] == [1, 2]  # each attempt launched once


def test_a_hang_before_the_first_step_is_retried_once_by_the_host_then_ends_deadlock_at_start(
        user: User, tmp_path: Path) -> None:
    root = _submit(user, tmp_path, "name=stuck retries=2 -- --hang-first")
    assert wait_for(lambda: "stuck" in job_dirs(root), timeout=120)
    job_dir = job_dirs(root)["stuck"]
    assert wait_for(lambda: len(launches(job_dir)) == 2, timeout=60 + HEALED_WITHIN_S), \
        (root / protocol.AGENT_LOG).read_text()[-3000:]
    decided = json.loads((attempt_dir(job_dir, 1) / protocol.NEXT_FILE).read_text())
    assert (decided["by"], decided["class"]) == ("host", "deadlock_at_start"), decided
    left = f"STALLED {job_dir.name} a2: stalled before its first step"
    assert wait_for(lambda: left in (root / protocol.AGENT_LOG).read_text(), timeout=HEALED_WITHIN_S)
    assert "left to gpuq" in (root / protocol.AGENT_LOG).read_text().split(left, 1)[1].splitlines()[0]

    def failed() -> bool:  # gpuq's patrol ends the second one: the one retry is spent
        return bool(user.status_doc()["jobs"][0]["state"] == "FAILED")

    assert wait_for(failed, timeout=120, interval=1.0), user.logs_of_unfinished()
    (job,) = user.status_doc()["jobs"]
    _, attempts, history = ledger_view(user.home, job["id"])
    assert attempts == [(1, "LOST"), (2, "LOST")], attempts
    assert _first_attempt(user.home, job["id"])[1].startswith(
        "deadlock_at_start: no step reached; killed group of attempt 1 (killed); where it hung")
    assert any(m.startswith("deadlock_at_start: requeued (retry 1 of 1") for m in history), history
    assert any(m.startswith("deadlock_at_start: stalled before its first step, not retried again") for m in history)
    assert any(m.startswith("started by the host") for m in history)
    assert [a for a, _, _ in launches(job_dir)] == [1, 2]
    assert not attempt_dir(job_dir, 3).exists()


# --- on the local host: gpuq's stall kill racing the agent's ------------------------------------------------


@pytest.fixture
def local(gpuq_home: Path) -> Iterator[tuple[Path, Callable[..., subprocess.CompletedProcess[str]]]]:
    env = dict(LIMITS, GPUQ_HOME=str(gpuq_home), GPUQ_LOCAL_CPU_SLOTS="4", GPUQ_HEARTBEAT_S="1")

    def gpuq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_gpuq(*args, env=env, timeout=timeout)

    yield gpuq_home, gpuq
    kill_recorded_groups(gpuq_home / "local")


@pytest.mark.parametrize("resume_agent", ["after_the_tick", "during_the_tick"])
def test_gpuqs_stall_kill_racing_the_hosts_launches_every_attempt_once(
        local: tuple[Path, Callable[..., subprocess.CompletedProcess[str]]], tmp_path: Path,
        resume_agent: str) -> None:
    home, gpuq = local
    root = home / "local"
    names = ["r1", "r2", "r3"]
    queue = _project(tmp_path, [f"name={n} retries=2 -- --steps 16 --hang-at 2" for n in names])
    assert gpuq("submit", str(queue), "--host", "local").returncode == 0
    assert wait_for(lambda: all(n in job_dirs(root) and launches(job_dirs(root)[n]) for n in names), timeout=120)
    dirs = {n: job_dirs(root)[n] for n in names}
    agent = agent_pid(root)
    os.kill(agent, signal.SIGSTOP)  # the host has not noticed yet: it sees the stall only after gpuq can
    try:
        assert wait_for(lambda: all(checkpointed_step(d) >= 2 for d in dirs.values()), timeout=60)
        time.sleep(5)  # every one of them is quiet past the limit now
        ticking = Concurrent(gpuq, "status")
        if resume_agent == "during_the_tick":  # once gpuq has decided on the first one: the others race
            assert wait_for(lambda: any((attempt_dir(d, 1) / protocol.NEXT_FILE).is_file() for d in dirs.values()),
                            timeout=60, interval=0.05)
            os.kill(agent, signal.SIGCONT)
        assert ticking.succeeded(), ticking.result
    finally:
        os.kill(agent, signal.SIGCONT)
    waited = gpuq("wait", "--timeout", "300", timeout=400)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    jobs = {j["name"]: j for j in json.loads(gpuq("status", "--json").stdout)["jobs"]}
    by_host = []
    for name in names:
        state, attempts, history = ledger_view(home, jobs[name]["id"])
        assert state == "SUCCEEDED" and attempts == [(1, "LOST"), (2, "EXITED")], (name, attempts, history)
        assert [a for a, _, _ in launches(dirs[name])] == [1, 2], name  # never twice, never none
        assert len(list(dirs[name].glob(f"{protocol.ATTEMPTS_DIR}/*/{protocol.LAUNCH_FILE}"))) == 2
        assert launches(dirs[name])[1][2] >= 2, name  # attempt 2 resumed
        assert "stalled: requeued with resume (retry 1 of 2)" in history, (name, history)
        decided = json.loads((attempt_dir(dirs[name], 1) / protocol.NEXT_FILE).read_text())
        started_by_host = any(m.startswith("started by the host") for m in history)
        assert started_by_host == (decided["by"] == "host"), (name, decided, history)
        by_host.append(started_by_host)
        assert not any("not killed" in m or "not saved" in m for m in history), (name, history)  # whose it was
    assert not all(by_host)  # gpuq decided the first one (every one, when the agent waited for the tick)
    if resume_agent == "after_the_tick":
        assert not any(by_host)
