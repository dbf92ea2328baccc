"""The serving loop's wake-up (gpuq_serve.py): the agent's signal handlers and a self-pipe every signal
writes to, so a child's exit or a stop ends the wait between two rounds at once.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
from typing import Any, Callable


class Wakeup:
    """A self-pipe the signals write to (``signal.set_wakeup_fd``) and the loop waits on."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def install(self, on_stop: Callable[[int, Any], None]) -> None:
        """The pipe made non-blocking and every signal's wake-up; SIGCHLD only wakes the loop, SIGTERM
        and SIGINT call ``on_stop``, SIGHUP is ignored."""
        for fd in (self.r, self.w):
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        signal.set_wakeup_fd(self.w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def wait(self, timeout_s: float) -> None:
        """Until a signal arrives or ``timeout_s`` passes; then the pipe is drained."""
        try:
            select.select([self.r], [], [], timeout_s)
            while True:
                os.read(self.r, 4096)
        except (OSError, ValueError):
            pass
