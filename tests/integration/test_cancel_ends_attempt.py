"""An attempt always ends (docs/cost.md), as a user meets it on the local host: `gpuq cancel` of a running job
ends its attempt in the ledger, `gpuq explain` says when it ended, and its hours in `gpuq results --csv`
stop growing with the wall clock."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_gpuq, wait_for
from tests.support.lightproject import light_config, light_project

pytestmark = pytest.mark.integration


def _hours(env: dict[str, str]) -> str:
    table = run_gpuq("results", "--csv", env=env)
    assert table.returncode == 0, table.stderr
    (row,) = list(csv.DictReader(io.StringIO(table.stdout)))
    return row["cpu_hours"]


def test_a_cancelled_running_job_ends_its_attempt_and_stops_costing(gpuq_home: Path, tmp_path: Path) -> None:
    queue = light_project(tmp_path, {"long": light_config(steps=600, step_s=0.5)}, ["configs/long.yaml t 1"])
    env = {"GPUQ_LOCAL_CPU_SLOTS": "1", "GPUQ_KILL_GRACE_S": "5", "GPUQ_HEARTBEAT_S": "1"}
    submitted = run_gpuq("submit", str(queue), "--json", env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["jobs"][0]["id"]

    def running() -> bool:
        snap = json.loads(run_gpuq("status", "--json", env=env).stdout)
        return snap["jobs"][0]["state"] == "RUNNING"

    assert wait_for(running, timeout=120, interval=1.0)
    cancelled = run_gpuq("cancel", job_id, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    try:
        ((state, started, ended, dispatched, seen_running, seen_ended),) = conn.execute(
            "SELECT state, started_at, ended_at, created_at, seen_running_at, seen_ended_at FROM attempt"
        ).fetchall()
    finally:
        conn.close()
    assert state == "KILLED" and started is not None and ended is not None and ended >= started
    assert dispatched <= started <= seen_running and ended <= seen_ended  # billed within what gpuq saw
    explained = run_gpuq("explain", job_id, env=env)
    assert explained.returncode == 0, explained.stderr
    assert "attempt 1 on local: KILLED" in explained.stdout and "ended -" not in explained.stdout
    first = _hours(env)
    run_gpuq("status", env=env)  # a tick later, the same hours: the end is recorded, not the clock
    assert _hours(env) == first and float(first) > 0
