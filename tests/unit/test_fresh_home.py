"""A fresh ``$GPUQ_HOME`` as a newcomer meets it (issue 39 item 13): ``gpuq hosts list`` shows ``local``
(the first submit registers it; the listing writes nothing), and ``gpuq status`` hints at the first
command."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq


def test_a_fresh_home_lists_local_and_hints_at_submit(gpuq_home: Path) -> None:
    env = {"GPUQ_HOME": str(gpuq_home), "COLUMNS": "120"}
    listed = run_gpuq("hosts", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert row[:2] == ["local", "local"] and "not registered yet (the first submit)" in listed.stdout
    doc = json.loads(run_gpuq("hosts", "list", "--json", env=env).stdout)
    assert [(h["name"], h["kind"], h["root"]) for h in doc["hosts"]] == [("local", "local", str(gpuq_home / "local"))]
    assert Ledger(gpuq_home / "ledger.db").hosts() == [] and not (gpuq_home / "local").exists()  # nothing written
    status = run_gpuq("status", "--once", "--no-probe", env=env)
    assert status.returncode == 0 and "no sweeps yet; `gpuq submit QUEUE`" in status.stdout, status.stdout
