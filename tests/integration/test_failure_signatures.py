"""An exhausted /dev/shm, from a real process (issue 25): a real ``DataLoader(num_workers=2)`` in a mount
namespace whose /dev/shm is a 1 MiB tmpfs (tests/support/shm_loader.py: one torch import, forked workers).
Its workers fail both real ways, torch's shared-memory ENOSPC and a worker's Bus error; each log, scanned
as the agent scans it and classed as the tick classes it, is ``shm_exhausted``: never retried, with the
fix (--shm-size / --ipc=host, fewer workers, the file_system sharing strategy), never a full data disk.

The other new signatures come from logs recorded once (tests/unit/test_failure_classes.py); torchrun's
rank-1 exception runs for real in tests/integration/test_peer_death.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.health import failures, patrol
from orchestrator.host_documents import Scan
from tests.support.agentmodule import load_agent_module
from tests.support.wire import entry

pytestmark = pytest.mark.integration

LOADER = Path(__file__).resolve().parents[1] / "support" / "shm_loader.py"
MOUNT = "mount -t tmpfs -o size=1m tmpfs /dev/shm"


def _namespace() -> list[str] | str:
    """The unshare argv that gives a process a /dev/shm of its own (as root: a mount namespace; else a user
    namespace too), or why this machine cannot."""
    if shutil.which("unshare") is None:
        return "no unshare(1) (util-linux) on this machine"
    flags = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    probe = subprocess.run(["unshare", *flags, "sh", "-c", MOUNT], capture_output=True, text=True, timeout=30,
                           check=False)
    if probe.returncode != 0:
        return f"unshare {' '.join(flags)} cannot mount a tmpfs on /dev/shm here: {probe.stderr.strip()[:200]}"
    return ["unshare", *flags]


def test_a_dataloader_outgrowing_dev_shm_is_shm_exhausted_never_retried(tmp_path: Path) -> None:
    unshare = _namespace()
    if isinstance(unshare, str):
        pytest.skip(unshare)
    ran = subprocess.run([*unshare, "sh", "-c", f'{MOUNT} && exec "$0" "$1"', sys.executable, str(LOADER)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split() == ["enospc", "RuntimeError", "bus", "RuntimeError"], ran.stdout + ran.stderr
    scan_log = load_agent_module("gpuq_watch.gpuq_scan").scan_log
    said = {"enospc": "No space left on device", "bus": "is killed by signal: Bus error"}
    for mode, words in said.items():
        log = tmp_path / f"{mode}.log"
        assert words in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]
        scan = Scan.model_validate(scan_log(str(log), 0))
        names = {h.signature for h in scan.hits}
        assert "shm_exhausted" in names and "disk_full" not in names, (mode, scan.hits)
        klass = failures.classify(1, 1, scan.hits, scan.traceback)
        assert klass == "shm_exhausted", (mode, scan.hits)
        decision = failures.decide(klass, 1, 5)
        assert decision.action == "fail", decision  # retries left, still never retried
        assert "--shm-size" in decision.reason and "--ipc=host" in decision.reason, decision
        assert "set_sharing_strategy('file_system')" in decision.reason and "prune" not in decision.reason
        crash = [f for f in patrol.job_findings("h", patrol.JobView("c000000000001", "loader", 1),
                                                entry({"state": "exited", "scan": scan.model_dump()}), 0.0,
                                                patrol.Thresholds()) if f.rule == "crash"]
        assert crash and "Traceback (most recent call last)" not in crash[0].message, crash
