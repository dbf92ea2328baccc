"""The agent's ``status`` verb runs on every host at every tick from a read-only bundle without bytecode,
so each module it imports is compiled from source on every call: it loads the results collector
(gpuq_inbox and what it pulls in) only when results are asked for, and the Slurm view only on a login
node (docs/performance.md, agent status)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "payload" / "agent" / "gpuq_agent.py"
ON_DEMAND = {"gpuq_records.gpuq_inbox", "gpuq_records.gpuq_outputs", "gpuq_slurmmode.gpuq_slurm_view"}
# the self-stop's webhook client: imported only where a notice is sent (20-100 ms a call otherwise)
WEBHOOK = {"urllib.request", "http.client", "email.parser", "ssl"}


def imported_by_status(root: Path, *extra: str) -> set[str]:
    ran = subprocess.run(
        [sys.executable, "-X", "importtime", str(AGENT), "--root", str(root), "status", "--json", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("{") or "gpuq.status/1" in ran.stdout, ran.stdout[:200]
    return {line.rpartition("|")[2].strip() for line in ran.stderr.splitlines() if line.startswith("import time:")}


def test_a_plain_status_leaves_the_results_collector_and_slurm_view_unloaded(tmp_path: Path) -> None:
    mods = imported_by_status(tmp_path)
    assert "gpuq_verbs.gpuq_status" in mods  # the probe did see the verb's imports
    assert not mods & ON_DEMAND, sorted(mods & ON_DEMAND)
    assert not mods & WEBHOOK, sorted(mods & WEBHOOK)


def test_asking_for_results_loads_the_collector(tmp_path: Path) -> None:
    assert "gpuq_records.gpuq_inbox" in imported_by_status(tmp_path, "--results-for", "j1")
