"""A trainer killed by a signal gpuq did not send is retried with resume (docs/health.md).

On the local host with gpuq's own payload (torchrun, gloo on CPU): `kill -9` of the rank processes
while the wrapper survives (what the kernel's OOM killer or a watchdog does to a worker) ends the
attempt with a signal death that is no verdict on the code: the job is requeued with resume within
``retries=`` and ends with the same weights as an identical job that ran without interruption.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from scripts.bench_project import TINY_CONFIG
from tests.conftest import kill_recorded_groups, run_gpuq, wait_for
from tests.support.proctree import assert_gone, descendants

pytestmark = pytest.mark.integration

CKPT_EVERY = 4


def _config(step_sleep_s: float) -> str:
    text = (TINY_CONFIG.replace("n_train: 256", "n_train: 1024")
            .replace("ckpt_every_steps: 0", f"ckpt_every_steps: {CKPT_EVERY}"))
    # TEST HOOK: slow steps (no effect on the weights) so the kill always lands mid-run
    return text + (f"test_hook_step_sleep_s: {step_sleep_s}\n" if step_sleep_s else "")


def _job_dir(root: Path, name: str) -> Path | None:
    for spec in root.glob("jobs/*/spec.json"):
        if json.loads(spec.read_text()).get("name") == name:
            return spec.parent
    return None


def _latest_step(job_dir: Path) -> int:
    try:
        return int(json.loads((job_dir / "ckpt" / "LATEST").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _ranks(job_dir: Path) -> list[int]:
    """The trainer's worker processes: below the launcher, which is below the wrapper (the group leader)."""
    wrapper = int(json.loads((job_dir / "attempts" / "1" / "pgid").read_text())["pgid"])
    below = descendants(wrapper)
    children = set()
    for pid in below:
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == wrapper:
            children.add(pid)
    return [pid for pid in below if pid not in children]


def test_ranks_killed_minus_nine_are_retried_with_resume_to_identical_weights(tmp_path: Path) -> None:
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "victim.yaml").write_text(_config(0.05))
    (work / "configs" / "twin.yaml").write_text(_config(0.0))  # the same run, never interrupted
    (work / "queue.txt").write_text("configs/victim.yaml classify 2 name=victim gpus=1 retries=1\n"
                                    "configs/twin.yaml classify 2 name=twin gpus=1\n")
    home = tmp_path / "home"
    env = {"GPUQ_HOME": str(home), "GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1"}
    root = home / "local"
    try:
        submitted = run_gpuq("submit", str(work / "queue.txt"), "--host", "local", env=env)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert wait_for(lambda: (d := _job_dir(root, "victim")) is not None and _latest_step(d) >= 2 * CKPT_EVERY,
                        timeout=300, interval=0.2)
        victim = _job_dir(root, "victim")
        assert victim is not None and not (victim / "attempts" / "1" / "exit.json").exists()  # mid-run
        ranks = _ranks(victim)
        assert ranks
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        assert_gone(ranks)
        waited = run_gpuq("wait", "--timeout", "600", env=env, timeout=700)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        ledger = Ledger(home / "ledger.db")
        try:
            jobs = {j.name: j for j in ledger.jobs()}
            first = ledger.attempts(jobs["victim"].id)[0]
            events = [e.message for e in ledger.events(subject=jobs["victim"].id, limit=200)]
        finally:
            ledger.close()
        assert jobs["victim"].state == "SUCCEEDED" and jobs["twin"].state == "SUCCEEDED"
        assert jobs["victim"].attempt_count == 2 and jobs["twin"].attempt_count == 1
        assert first.state == "EXITED" and first.exit_code not in (0, None), first
        assert any("killed: requeued with resume" in m for m in events), events
        log = (victim / "attempts" / "2" / "job.log").read_text()
        resumed = [line for line in log.splitlines() if "GPUQ_RESUMED" in line]
        assert resumed and int(resumed[0].split("step=")[1].split()[0]) >= 2 * CKPT_EVERY, log[-2000:]
        twin = _job_dir(root, "twin")
        assert twin is not None
        weights = [json.loads((d / "result" / "summary.json").read_text())["weights_sha256"] for d in (victim, twin)]
        assert weights[0] == weights[1]
    finally:
        kill_recorded_groups(root)
