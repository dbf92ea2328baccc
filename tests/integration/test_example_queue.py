"""The README's first command, as a newcomer runs it: the example sweep on the embedded local host."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration


def test_example_queue_runs_to_success_on_the_local_host(gpuq_home: Path) -> None:
    submitted = run_gpuq("submit", "payload/queue.txt", "--wait", timeout=900)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "warning" not in submitted.stdout + submitted.stderr  # the example configs agree with the queue

    status = run_gpuq("status", "--once")
    assert status.returncode == 0, status.stderr
    assert "SUCCEEDED=8" in status.stdout  # 4 lines, seeds=2 each

    doc = json.loads(run_gpuq("status", "--json").stdout)
    jobs = doc["jobs"]
    assert len(jobs) == 8 and {j["state"] for j in jobs} == {"SUCCEEDED"}
    assert all(j["gpus"] == 2 and j["step"] == j["total_steps"] for j in jobs)

    # two torchrun processes per job: the payload records its world size
    for job in jobs:
        summary = gpuq_home / "local" / "jobs" / job["id"] / "result" / "summary.json"
        assert json.loads(summary.read_text())["world_size"] == 2

    results = run_gpuq("results")
    assert results.returncode == 0 and "final val_acc" in results.stdout
    rows = list(csv.DictReader(io.StringIO(run_gpuq("results", "--csv").stdout)))
    assert len(rows) == len(jobs)
    assert all(0.0 <= float(r["final_val_acc"]) <= 1.0 for r in rows)

    # the README's first command ends here: two seeds per cell, so every cell has an interval
    doc = json.loads(run_gpuq("report", "--format", "json").stdout)
    cells = {c["cell"]: c for c in doc["cells"]}
    assert sorted(cells) == ["baseline", "lr_high", "no_aug", "wide"]
    assert all((c["n_finished"], c["n_total"]) == (2, 2) and c["ci_low"] is not None for c in cells.values())
    assert run_gpuq("report").returncode == 0
