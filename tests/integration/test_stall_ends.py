"""A running attempt the patrol ends, on the local host with real processes and a stdlib trainer
(issue 25): a trainer that hangs before its first step and a user trainer whose metrics file shows a
NaN loss while it keeps running (and billing).

- ``hang``: forks a loader worker, prints "epoch 0", then waits for its first batch forever; no
  heartbeat, no metrics row, no checkpoint.  It is killed at the short ``start_stall_after_s`` (the
  normal stall limit is a minute), once retried, and ends ``deadlock_at_start`` (FAILED) after its
  second attempt, each attempt with a ``stacks.txt`` that names where it hung: the trainer's own
  functions by ``py-spy dump`` when py-spy is on PATH, else the kernel's stacks and wait channels of
  both processes from /proc.
- ``nan``: a ``[run] metrics`` CSV whose train_loss turns NaN at step 2, then keeps training for
  ten minutes: the tick that reads the NaN ends it as ``divergence`` (one ``nan`` finding: ended in
  the tick that saw it), never retried.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.core import protocol
from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration

TRAINER = textwrap.dedent("""
    import argparse, os, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--mode")
    a = p.parse_args()

    def loader_worker():
        while True:
            time.sleep(1)

    def wait_for_first_batch(worker):
        os.waitpid(worker, 0)  # the worker never sends one

    if a.mode == "hang":
        worker = os.fork()
        if worker == 0:
            loader_worker()
        print("epoch 0", flush=True)  # the last word: silence from here, both processes in place
        wait_for_first_batch(worker)
    else:
        with open("metrics.csv", "w") as f:
            f.write("step,train_loss\\n1,0.9\\n")
            f.flush()
            time.sleep(0.5)
            f.write("2,nan\\n")
            f.flush()
            for step in range(3, 1200):
                time.sleep(0.5)
                print("step", step, flush=True)
""")

TOML = """\
[run]
command = "train.py {args}"
launcher = "python"
metrics = "metrics.csv"
metric = "train_loss"
mode = "min"
"""

# the normal stall limit is a minute: only the start's own limit can end the hanging job this soon
ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1", "GPUQ_STALL_AFTER_S": "60",
       "GPUQ_STARTUP_GRACE_S": "2", "GPUQ_START_STALL_AFTER_S": "3", "GPUQ_KILL_GRACE_S": "1"}


def _py_spy_dir() -> str | None:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    return os.path.dirname(found) if found else None


def _submit(project: Path, queue: str, env: dict[str, str]) -> dict[str, dict[str, object]]:
    project.mkdir()
    (project / "train.py").write_text(TRAINER)
    (project / "gpuq.toml").write_text(TOML)
    (project / "queue.txt").write_text(queue)
    done = run_gpuq("submit", str(project / "queue.txt"), "--host", "local", "--wait", env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # every job failed
    status = json.loads(run_gpuq("status", "--json", env=env).stdout)
    return {str(j["name"]): j for j in status["jobs"]}


def _attempts(home: Path, job_id: str) -> list[tuple[int, str, str]]:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        return conn.execute("SELECT number, state, message FROM attempt WHERE job_id = ? ORDER BY number",
                            (job_id,)).fetchall()
    finally:
        conn.close()


def _events(home: Path, job_id: str) -> list[tuple[str, str]]:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        return conn.execute("SELECT rule, message FROM event WHERE subject = ? ORDER BY id", (job_id,)).fetchall()
    finally:
        conn.close()


def _deadlocked_twice(home: Path, job: dict[str, object]) -> list[str]:
    """The job's two attempts ended deadlock_at_start, it is FAILED; their stacks.txt texts."""
    job_id = str(job["id"])
    assert job["state"] == "FAILED", job
    attempts = _attempts(home, job_id)
    assert [(n, state) for n, state, _ in attempts] == [(1, "LOST"), (2, "LOST")], attempts  # exactly one retry
    assert all(m.startswith("deadlock_at_start: no step reached") and "where it hung: attempts/" in m
               for _, _, m in attempts), attempts
    reasons = [m for rule, m in _events(home, job_id) if m.startswith("deadlock_at_start: ")]
    assert any("requeued (retry 1 of 1" in m for m in reasons) and any("not retried again" in m and
                                                                       "num_workers=0" in m for m in reasons), reasons
    texts = []
    for n in (1, 2):
        stacks = home / "local" / protocol.JOBS_DIR / job_id / protocol.ATTEMPTS_DIR / str(n) / protocol.STACKS_FILE
        texts.append(stacks.read_text())
    return texts


def test_a_hang_before_the_first_step_is_retried_once_with_py_spy_stacks_and_a_nan_ends_at_once(
        gpuq_home: Path, tmp_path: Path) -> None:
    spy = _py_spy_dir()
    if spy is None:
        pytest.skip("py-spy is not installed")
    env = dict(ENV, PATH=spy + os.pathsep + os.environ.get("PATH", ""))
    jobs = _submit(tmp_path / "proj", "name=hangs -- --mode hang\nname=diverges -- --mode nan\n", env)

    for text in _deadlocked_twice(gpuq_home, jobs["hangs"]):
        assert "by py-spy dump" in text and "2 process(es)" in text, text
        assert "wait_for_first_batch (train.py:" in text and "loader_worker (train.py:" in text, text

    nan = jobs["diverges"]
    attempts = _attempts(gpuq_home, str(nan["id"]))
    assert nan["state"] == "FAILED" and [(n, s) for n, s, _ in attempts] == [(1, "LOST")], attempts  # not retried
    message = attempts[0][2]
    assert message.startswith("divergence: non-finite train_loss=nan at step 2; gpuq ended attempt 1 (killed)")
    assert "gradient clipping" in message
    events = _events(gpuq_home, str(nan["id"]))
    assert [m for rule, m in events if rule == "nan"] == ["diverges: non-finite train_loss=nan at step 2"]
    assert any(m.startswith("divergence error: never retried") for _, m in events), events
    adir = gpuq_home / "local" / protocol.JOBS_DIR / str(nan["id"]) / protocol.ATTEMPTS_DIR / "1"
    assert not (adir / protocol.STACKS_FILE).exists()  # a divergence is not a hang: no stacks
    assert "step 1199" not in (adir / protocol.JOB_LOG).read_text()  # ended, not trained out


def test_without_py_spy_the_stacks_come_from_proc(gpuq_home: Path, tmp_path: Path) -> None:
    # a python whose directory holds no py-spy (the base interpreter, by a link: the agent is stdlib only),
    # and a PATH without one
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(os.path.realpath(sys.executable))
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "py-spy")))
    assert shutil.which("py-spy", path=path) is None
    env = dict(ENV, PATH=path, GPUQ_LOCAL_PYTHON=str(bindir / "python3"))
    jobs = _submit(tmp_path / "proj", "name=hangs -- --mode hang\n", env)

    for text in _deadlocked_twice(gpuq_home, jobs["hangs"]):
        assert "by /proc (no py-spy on PATH" in text and "2 process(es)" in text, text
        sections = [s for s in text.split("\n\n") if s.startswith("process ")]
        assert len(sections) == 2, text
        for section in sections:
            assert "train.py --mode hang" in section and "state S (sleeping)" in section, section
            assert "kernel stack:" in section and "threads: 1" in section, section
