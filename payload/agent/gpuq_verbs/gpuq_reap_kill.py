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
    sent = _signal_each(sorted(ticks), ticks, signal.SIGTERM, "gone", outcome)
    pending = _survivors(sent, ticks, TERM_WAIT_S, 0.1)
    for pid in sent:
        if pid not in pending:
            outcome[pid] = "terminated"
    sent = _signal_each(pending, ticks, signal.SIGKILL, "terminated", outcome)
    left = _survivors(sent, ticks, KILL_WAIT_S, 0.05)
    for pid in sent:
        outcome[pid] = "failed: still alive after SIGKILL" if pid in left else "killed"
    return [{"pid": pid, "outcome": outcome[pid]} for pid in sorted(outcome)]


def _signal_each(pids: list[int], ticks: dict[int, int], sig: int, gone: str, outcome: dict[int, str]) -> list[int]:
    """Send ``sig`` to each pid still the process it was (its start time re-checked); one already gone gets
    ``gone`` in ``outcome``, one we may not signal a failure.  The pids signalled, in order."""
    sent = []
    for pid in pids:
        if not same_process(pid, ticks[pid]):
            outcome[pid] = gone
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            outcome[pid] = gone
        except PermissionError:
            outcome[pid] = "failed: permission denied"
        else:
            sent.append(pid)
    return sent


def _survivors(pids: list[int], ticks: dict[int, int], wait_s: float, poll_s: float) -> list[int]:
    """The pids still alive (the same processes) after waiting up to ``wait_s`` for them to exit."""
    deadline = time.time() + wait_s
    left = list(pids)
    while left and time.time() < deadline:
        time.sleep(poll_s)
        left = [p for p in left if same_process(p, ticks[p])]
    return left
