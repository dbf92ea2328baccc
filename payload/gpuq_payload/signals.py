"""SIGTERM/SIGINT handling: the handler only records the signal; the loop acts at a step boundary."""

from __future__ import annotations

import os
import signal
import sys
import time

_received: list[int] = []
_first_at: list[float] = []  # time.monotonic() of the first signal


def install() -> None:
    """Install flag-only handlers for SIGTERM and SIGINT (they record the signal and its time)."""

    def _handler(signum, _frame):
        if not _first_at:
            _first_at.append(time.monotonic())
        _received.append(signum)

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)


def requested() -> bool:
    """True once a SIGTERM or SIGINT arrived."""
    return bool(_received)


def elapsed() -> float | None:
    """Seconds since the first SIGTERM/SIGINT reached this process, or None if none did."""
    return time.monotonic() - _first_at[0] if _first_at else None


def reset() -> None:
    _received.clear()
    _first_at.clear()


def die_with_parent() -> bool:
    """Under torchrun, ask Linux to SIGKILL this worker when its launcher dies (PR_SET_PDEATHSIG).

    torchrun starts each worker in a new session, so a SIGKILL to the launcher's process group
    (OOM kill, ``kill -9 -<pgid>``) would otherwise leave orphaned workers training on.
    Returns True when armed.
    """
    if not os.environ.get("TORCHELASTIC_RUN_ID") or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            return False
        if os.getppid() != parent:  # the launcher died before we armed it
            os.kill(os.getpid(), signal.SIGKILL)
        return True
    except (OSError, AttributeError):
        return False
