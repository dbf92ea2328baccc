"""The kill path of ``reap --force`` (gpuq_reap.py): never a kill by pattern, by pid only, after
re-checking that pid's start time; SIGTERM, a wait, SIGKILL for the survivors, one outcome each.

stdlib only, Python >= 3.8, Linux.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from gpuq_base.gpuq_procs import proc_stat

TERM_WAIT_S = 10.0
KILL_WAIT_S = 5.0


def same_process(pid: int, ticks: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and st[2] == ticks


def kill_all(ticks: dict[int, int]) -> list[dict[str, Any]]:
    """SIGTERM each (after re-checking its start time), wait, SIGKILL survivors; one outcome each."""
    outcome: dict[int, str] = {}
    for pid, t in sorted(ticks.items()):
        if not same_process(pid, t):
            outcome[pid] = "gone"
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            outcome[pid] = "gone"
        except PermissionError:
            outcome[pid] = "failed: permission denied"
    deadline = time.time() + TERM_WAIT_S
    pending = [p for p in ticks if p not in outcome]
    while pending and time.time() < deadline:
        time.sleep(0.1)
        pending = [p for p in pending if same_process(p, ticks[p])]
    for pid in ticks:
        if pid not in outcome and pid not in pending:
            outcome[pid] = "terminated"
    for pid in pending:
        if not same_process(pid, ticks[pid]):
            outcome[pid] = "terminated"
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            outcome[pid] = "terminated"
        except PermissionError:
            outcome[pid] = "failed: permission denied"
    deadline = time.time() + KILL_WAIT_S
    left = [p for p in pending if p not in outcome]
    while left and time.time() < deadline:
        time.sleep(0.05)
        left = [p for p in left if same_process(p, ticks[p])]
    for pid in pending:
        if pid not in outcome:
            outcome[pid] = "failed: still alive after SIGKILL" if pid in left else "killed"
    return [{"pid": pid, "outcome": outcome[pid]} for pid in sorted(outcome)]
