"""One agent per root: the serving agent's lock (agent.lock), its pid file (agent.pid) and its one word
to a parent that waits for it to start (``serve --detach``, gpuq_detach.py).

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write_json, read_json, utc
from gpuq_base.gpuq_procs import boot_id, start_ticks


class AgentLock:
    def __init__(self, lay: Layout, notify_fd: int | None = None) -> None:
        self.lay = lay
        self.fd: int | None = None
        self.notify_fd = notify_fd

    def take(self) -> bool:
        """The root's lock, without waiting: False when another agent holds it."""
        fd = os.open(self.lay.p(P.AGENT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None

    def write_pid(self, slots: dict[str, Any]) -> None:
        pid = os.getpid()
        atomic_write_json(self.lay.p(P.AGENT_PID), {
            "pid": pid, "pgid": os.getpgrp(), "start_ticks": start_ticks(pid), "boot_id": boot_id(),
            "started_at": utc(), "protocol": P.PROTOCOL_VERSION,
            "slots": {"kind": slots["kind"], "ids": slots["ids"]}})

    def remove_pid(self) -> None:
        rec = read_json(self.lay.p(P.AGENT_PID))
        if isinstance(rec, dict) and rec.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(self.lay.p(P.AGENT_PID))

    def holder(self) -> Any:
        """The pid agent.pid names ("?" when it names none)."""
        rec = read_json(self.lay.p(P.AGENT_PID))
        return rec.get("pid") if isinstance(rec, dict) else "?"

    def notify(self, msg: str) -> None:
        """Tell the waiting parent, once, how the start went ("ok PID", "held PID")."""
        if self.notify_fd is not None:
            try:
                os.write(self.notify_fd, (msg + "\n").encode())
                os.close(self.notify_fd)
            except OSError:
                pass
            self.notify_fd = None
