"""A setup hook that echoes its forwarded token and fails: the token reaches no ledger event, no
attempt row and no `gpuq status --json` (issue 23 item 6, controller side; docs/security.md)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_gpuq, wait_for
from tests.support.ownproject import copy_example

pytestmark = pytest.mark.integration

TOKEN = "hf-echoed-token-9b2e7c4a1d"
ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1", "LEAKY_TOKEN": TOKEN,
       "GPUQ_FORWARD_ENV_ALLOW": "LEAKY_TOKEN"}  # the user allows the project to forward it


def test_a_setup_hook_echoing_its_token_leaks_it_nowhere_the_controller_keeps(gpuq_home: Path,
                                                                                 tmp_path: Path) -> None:
    hook = ('forward_env = ["LEAKY_TOKEN"]\n'
            'setup = "echo using $LEAKY_TOKEN; echo token=$LEAKY_TOKEN >&2; exit 3"\n')
    queue = copy_example("ddp_snapshot", tmp_path, queue="name=a gpus=1 -- 2 1\n", toml_extra=hook)
    submitted = run_gpuq("submit", str(queue), "--host", "local", env=ENV)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    seen: list[str] = []

    def setup_failure_reported() -> bool:
        out = run_gpuq("status", "--once", env=ENV)
        seen.append(out.stdout + out.stderr)
        return "setup failed" in out.stdout

    assert wait_for(setup_failure_reported, timeout=120, interval=1.0), seen[-1:]
    doc = run_gpuq("status", "--json", env=ENV)
    assert doc.returncode == 0 and json.loads(doc.stdout)["jobs"], doc.stderr
    with sqlite3.connect(gpuq_home / "ledger.db") as db:
        events = [m for (m,) in db.execute("SELECT message FROM event")]
        attempts = [m for (m,) in db.execute("SELECT message FROM attempt")]
    # the agent redacts first ("[redacted]"); the controller catches what reaches it unredacted
    assert any("[redacted" in m for m in events + attempts), (events, attempts)
    assert not [m for m in events if TOKEN in m], events
    assert not [m for m in attempts if TOKEN in m], attempts
    assert TOKEN not in doc.stdout and TOKEN not in seen[-1]
