"""examples/hf_trainer, a Hugging Face ``Trainer`` project run unchanged on the embedded local host
(docs/checkpoints.md, "Directory checkpoints"): killed -9 mid-run, the job resumes from its newest
complete ``checkpoint-N/`` directory (its own log says so), never from one a kill left half-written,
and succeeds; the pull brings its checkpoint directories home file by file, verified.

Lean on purpose: one job, a one-layer model, 12 steps; two trainer processes in all (transformers'
import costs seconds of CPU).  Needs transformers and accelerate (the example's requirements.txt).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import run_gpuq, wait_for
from tests.support.ownproject import copy_example

pytestmark = pytest.mark.integration

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1", "GPUQ_KILL_GRACE_S": "2",
       "GPUQ_STALL_AFTER_S": "300", "GPUQ_STARTUP_GRACE_S": "300", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5",
       "GPUQ_PATROL_INTERVAL_S": "1"}


def test_hf_trainer_killed_minus_nine_resumes_from_its_newest_complete_checkpoint_dir(
        gpuq_home: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    queue = copy_example("hf_trainer", tmp_path, queue="name=hf -- --max_steps 12 --save_steps 2 --step_sleep 0.4\n")
    submitted = run_gpuq("submit", str(queue), "--host", "local", env=ENV)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    (job,) = json.loads(run_gpuq("status", "--json", env=ENV).stdout)["jobs"]
    jdir = gpuq_home / "local" / "jobs" / job["id"]
    out = jdir / "run" / "out"

    def saved_twice() -> bool:  # checkpoint-4 complete, and training goes on
        return (out / "checkpoint-4" / "trainer_state.json").is_file()

    assert wait_for(saved_twice, timeout=300, interval=0.3), (jdir / "attempts" / "1" / "job.log").read_text()[-3000:]
    pgid = json.loads((jdir / "attempts" / "1" / "pgid").read_text())["pgid"]
    os.killpg(pgid, signal.SIGKILL)  # no warning, no last save
    done_steps = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert done_steps < 12
    # what a kill in the middle of a save leaves: the newest directory has weights and no trainer_state.json
    half = out / "checkpoint-11"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half written")
    later = time.time() + 5
    os.utime(half / "model.safetensors", (later, later))
    watched = run_gpuq("watch", "--interval", "1", env=ENV, timeout=600)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    (after,) = json.loads(run_gpuq("status", "--json", env=ENV).stdout)["jobs"]
    second = (jdir / "attempts" / "2" / "job.log").read_text()
    assert after["state"] == "SUCCEEDED", second[-3000:]
    picked = re.findall(r"^gpuq: resuming from checkpoint out/checkpoint-(\d+)$", second, re.MULTILINE)
    own = re.findall(r"^resuming from \S+/out/checkpoint-(\d+) at step (\d+)$", second, re.MULTILINE)
    assert picked and own and picked[0] == own[0][0] == own[0][1], second[-3000:]  # the trainer's own word
    assert 4 <= int(picked[0]) <= done_steps and picked[0] != "11", (picked, done_steps)
    assert "done at step 12" in second
    assert not (jdir / "attempts" / "3").exists()
    pulled = run_gpuq("pull", env=ENV)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    (home,) = (gpuq_home / "results").glob(f"*/{job['id']}")
    assert (home / "run" / "out" / "checkpoint-12" / "model.safetensors").is_file()
    assert (home / "run" / "out" / "checkpoint-12" / "trainer_state.json").is_file()
    assert (home / "run" / "out" / "checkpoint-11" / "model.safetensors").read_bytes() == b"half written"
