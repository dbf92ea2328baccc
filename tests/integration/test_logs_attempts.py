"""Earlier attempts' logs and why each attempt ended (docs/cli.md, docs/health.md): ``gpuq logs JOB
--attempt N``, ``gpuq logs JOB --attempts`` and ``gpuq explain JOB``, on the local host with a stdlib
trainer (no torch) that fails its first attempt with an NCCL error (class transient, retried with
resume under retries=1) and succeeds on the second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.context import host_for, open_context
from orchestrator.health import hints
from orchestrator.transfer import evidence
from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration

TRAIN = """\
import os, sys
attempt = int(os.environ["GPUQ_ATTEMPT"])
print(f"attempt {attempt} says hello", flush=True)
if attempt == 1:
    print("Traceback (most recent call last):", flush=True)
    print('  File "train.py", line 6, in <module>', flush=True)
    print("RuntimeError: NCCL error: unhandled system error", flush=True)
    sys.exit(1)
print("trained", flush=True)
"""
TOKEN = "ghp_" + "Q9w8E7r6" * 5  # a token's shape: redacted wherever gpuq shows it


@pytest.fixture
def flaky(gpuq_home: Path, tmp_path: Path) -> tuple[str, Path]:
    """A job whose attempt 1 failed (transient) and attempt 2 succeeded: (its id, its dir on the local host)."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\nverify = []\n')
    (work / "queue.txt").write_text("name=flaky retries=1 --\n")
    done = run_gpuq("submit", str(work / "queue.txt"), "--wait", env={"GPUQ_HEARTBEAT_S": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    (job_dir,) = (gpuq_home / "local" / "jobs").iterdir()
    return job_dir.name, job_dir


def _ok(*args: str) -> str:
    out = run_gpuq(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_each_attempt_has_its_log_its_line_and_its_explanation_and_no_other_does(flaky: tuple[str, Path]) -> None:
    job, _ = flaky
    first, second = _ok("logs", job, "--attempt", "1"), _ok("logs", "flaky", "--attempt", "2")
    assert "attempt 1 says hello" in first and "RuntimeError: NCCL error" in first and "trained" not in first
    assert "attempt 2 says hello" in second and "trained" in second and "NCCL" not in second
    assert _ok("logs", job) == second  # the latest attempt, as ever

    listed = _ok("logs", job, "--attempts").splitlines()
    assert listed[0].split() == ["attempt", "host", "started", "ended", "state/class", "exit", "reason"]
    assert [row.split()[:2] for row in listed[1:]] == [["1", "local"], ["2", "local"]]
    assert re.search(r"\bEXITED/transient\s+1\s+exit 1: trainer exited 1", listed[1]), listed[1]
    assert re.search(r"\bEXITED\s+0\s+exit 0", listed[2]) and "/" not in listed[2].split()[6], listed[2]

    told = _ok("explain", job)
    one, two = told.split("\nattempt 2 on local")
    assert told.startswith(f"job flaky ({job}) of sweep ") and "SUCCEEDED, 2 attempts" in told.splitlines()[0]
    assert "attempt 1 on local: EXITED, exit 1, class transient" in one
    assert "[escalate crash] flaky a1:" in one and "signatures: nccl" in one  # what the patrol recorded
    assert "decision: transient: requeued with resume (retry 1 of 1)" in one
    assert f"hint: {hints.hint('transient', job, 1, 'local')}" in one
    assert f"log: gpuq logs {job} --attempt 1" in one and "stacks:" not in one
    assert "class" not in two and "hint:" not in two and f"log: gpuq logs {job} --attempt 2" in two

    for args in (("logs", job, "--attempt", "3"), ("explain", job, "--attempt", "3")):
        out = run_gpuq(*args)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.strip() == (f"gpuq: job {job} (flaky) has no attempt 3: it has attempts 1 to 2 "
                                      f"(`gpuq logs {job} --attempts` lists them)")
    assert run_gpuq("logs", job, "--attempt", "0").returncode == 2  # attempts count from 1


def test_a_log_brought_home_is_read_at_home_and_saved_stacks_are_shown(flaky: tuple[str, Path],
                                                                        gpuq_home: Path) -> None:
    job, job_dir = flaky
    context = open_context()
    try:  # what the down-when-done stage does before it ends a rented host: the failed attempt's evidence
        row, att, local = context.ledger.job(job), context.ledger.attempt(job, 1), context.ledger.host("local")
        assert att is not None and local is not None
        (got,) = evidence.fetch_evidence(context.ledger, host_for(context, local), [(row, att)],
                                         gpuq_home / "results", gpuq_home / "quarantine")
        assert got.verified, got
    finally:
        context.close()
    (job_dir / "attempts" / "1" / "job.log").unlink()  # gone from the host: the copy at home answers
    assert "RuntimeError: NCCL error" in _ok("logs", job, "--attempt", "1")
    assert "a copy at home: " in _ok("explain", job, "--attempt", "1")

    stacks = job_dir / "attempts" / "2" / "stacks.txt"  # as the agent saves them before a stall kill
    stacks.write_text(f"Thread 42 (idle): MainThread\n    wait (threading.py:320)\n\x1b]0;owned\x07 {TOKEN}\n")
    told = _ok("explain", job)
    assert f"stacks: {stacks} (`gpuq explain {job} --attempt 2 --stacks` prints them)" in told
    assert "Thread 42" not in told
    shown = _ok("explain", job, "--attempt", "2", "--stacks")
    assert "attempt 1 on" not in shown and "    Thread 42 (idle): MainThread" in shown
    assert "wait (threading.py:320)" in shown
    assert TOKEN not in shown and "[redacted]" in shown and "\x1b" not in shown and "\x07" not in shown
