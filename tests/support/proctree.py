"""Process trees of this machine, read from /proc: what a test started, and whether it is gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first, then theirs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_gone(pids: list[int], timeout: float = 20, what: str = "processes survived") -> None:
    """Wait until none of ``pids`` runs; SIGKILL survivors (a test never leaves them behind), then fail."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if running(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, f"{what}: {alive}"
