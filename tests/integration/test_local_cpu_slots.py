"""``GPUQ_LOCAL_CPU_SLOTS`` reaches the local agent that already serves (issue 39 item 3): the README's
``GPUQ_LOCAL_CPU_SLOTS=4 gpuq submit`` ran two 2-process jobs one at a time on the 2 slots the agent
took when an earlier submit started it, while the plan (and its projected makespan) assumed 4.

Lean: a stdlib trainer that only sleeps and notes when it ran; one agent, no torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration

NOTED = """import os, sys, time
with open(sys.argv[2], "a") as fh:
    fh.write("%s start %f\\n" % (os.environ["GPUQ_JOB_ID"], time.time()))
time.sleep(float(sys.argv[1]))
with open(sys.argv[2], "a") as fh:
    fh.write("%s end %f\\n" % (os.environ["GPUQ_JOB_ID"], time.time()))
"""


def _project(work: Path, lines: list[str]) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "noted.py").write_text(NOTED)
    (work / "gpuq.toml").write_text('[run]\ncommand = "noted.py {args}"\nlauncher = "python"\n')
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def _agent(home: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((home / "local" / "agent.pid").read_text())
    return doc


def test_a_new_cpu_slot_count_reaches_the_agent_that_serves(gpuq_home: Path, tmp_path: Path) -> None:
    notes = tmp_path / "ran.txt"
    first = _project(tmp_path / "one", [f"name=warm gpus=1 -- 0.2 {notes}"])
    env = {"GPUQ_HOME": str(gpuq_home), "GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_PREFLIGHT": "false"}
    done = run_gpuq("submit", str(first), "--wait", env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    serving = _agent(gpuq_home)
    assert len(serving["slots"]["ids"]) == 2  # the agent that stays (agent_idle_exit_s) has 2 slots

    second = _project(tmp_path / "two", [f"name=a gpus=2 est_min=0.05 -- 3 {notes}",
                                         f"name=b gpus=2 est_min=0.05 -- 3 {notes}"])
    env["GPUQ_LOCAL_CPU_SLOTS"] = "4"
    submitted = run_gpuq("submit", str(second), env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "projected makespan 3 s" in submitted.stdout, submitted.stdout  # side by side on 4 slots
    waited = run_gpuq("wait", env=env, timeout=120)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert _agent(gpuq_home)["pid"] == serving["pid"]  # the same agent, not a restart
    assert len(_agent(gpuq_home)["slots"]["ids"]) == 4
    times: dict[str, dict[str, float]] = {}
    for line in notes.read_text().splitlines():
        job, what, at = line.split()
        times.setdefault(job, {})[what] = float(at)
    runs = [t for t in times.values() if len(times) == 3 and t["end"] - t["start"] > 2.5]
    assert len(runs) == 2, times
    a, b = runs
    assert max(a["start"], b["start"]) < min(a["end"], b["end"]), times  # they ran at the same time, as planned
