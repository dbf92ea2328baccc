"""/proc, signals and the commands the farm runs (by recorded pid and start time, never by name)."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.testhosts.host import TestHost


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, comm, start time in clock ticks) of a live (non-zombie) process, else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    comm = st[st.index("(") + 1:st.rindex(")")]
    rest = st[st.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), comm, int(rest[19])


def pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def all_pids() -> Iterator[int]:
    for d in os.listdir("/proc"):
        if d.isdigit():
            yield int(d)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@contextlib.contextmanager
def _holding_pidns(h: TestHost) -> Iterator[None]:
    """Keep host h's PID namespace referenced (an open nsfs fd), so that its inode number, which is how
    gpuq's test hosts name a namespace, is not handed to a new namespace while the host is being emptied."""
    fd = -1
    if h.init_pid and h.init_alive():
        with contextlib.suppress(OSError):
            fd = os.open(f"/proc/{h.init_pid}/ns/pid", os.O_RDONLY)
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False, timeout=60)
    if check and res.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res


def _wait(pred: Any, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads may race
    tmp.write_text(text)
    os.replace(tmp, path)


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"
