"""`gpuq hosts stop-agent HOST` on the embedded local host (docs/cli.md, issue 29 item 9): refused while its
agent runs a job (exit 2, naming it), forced it stops and the job keeps running to SUCCEEDED, an idle
agent stops at once, and with none left it says so.  The SSH case is in test_ssh_hosts.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_gpuq, wait_for
from tests.support.lightproject import sleeper_project

pytestmark = [pytest.mark.integration, pytest.mark.honest]

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1", "GPUQ_PATROL_INTERVAL_S": "1",
       "GPUQ_PATROL_MIN_INTERVAL_S": "0.5"}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_stop_agent_on_the_local_host(gpuq_home: Path, tmp_path: Path) -> None:
    queue = sleeper_project(tmp_path / "project", "name=nap -- 20")
    submitted = run_gpuq("submit", str(queue), "--host", "local", env=ENV)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    root = gpuq_home / "local"
    assert wait_for(lambda: any(root.glob("jobs/*/attempts/1/pgid")), timeout=60)
    pid = json.loads((root / "agent.pid").read_text())["pid"]

    refused = run_gpuq("hosts", "stop-agent", "local", env=ENV)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip() == (f"gpuq: local: agent {pid} has 1 running jobs (nap); not stopped (--force "
                                      "stops it anyway: running jobs keep running and the next agent adopts them)")
    assert _alive(pid)

    forced = run_gpuq("hosts", "stop-agent", "local", "--force", env=ENV)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.strip() == (f"local: agent {pid} stopped (forced: 1 running jobs (nap); running jobs keep "
                                     "running, the next agent adopts them)")
    assert not _alive(pid) and not (root / "agent.pid").exists()
    waited = run_gpuq("wait", "--timeout", "120", env=ENV, timeout=200)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    (job,) = json.loads(run_gpuq("status", "--json", env=ENV).stdout)["jobs"]
    assert job["state"] == "SUCCEEDED" and "slept" in next(root.glob("jobs/*/attempts/1/job.log")).read_text()

    again = sleeper_project(tmp_path / "second", "name=short -- 0")  # an agent again, idle once it is done
    assert run_gpuq("submit", str(again), "--host", "local", "--wait", env=ENV, timeout=200).returncode == 0
    idle = json.loads((root / "agent.pid").read_text())["pid"]
    assert _alive(idle)
    stopped = run_gpuq("hosts", "stop-agent", "local", env=ENV)
    assert (stopped.returncode, stopped.stdout.strip()) == (0, f"local: agent {idle} stopped"), stopped.stderr
    assert not _alive(idle) and not (root / "agent.pid").exists()
    none = run_gpuq("hosts", "stop-agent", "local", env=ENV)
    assert (none.returncode, none.stdout.strip()) == (0, "local: no agent running; nothing to stop")
    assert os.environ.get("GPUQ_HOME") == str(gpuq_home)
