"""Files under GPUQ_ROOT: safe read/write primitives, the root's layout, the job documents.

stdlib only, Python >= 3.8.  Readers never raise (a missing or half-written file reads as None);
writers of shared documents go through tmp + fsync + rename, so a reader sees the old or the new
file, never half of one.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any

from gpuq_base import gpuq_protocol as P

# --- primitives ---------------------------------------------------------------------------------


def utc(t: float | None = None) -> str:
    """ISO 8601 UTC with milliseconds: 2024-05-01T12:00:00.123Z."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_json(path: str) -> Any:
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def atomic_write(path: str, data: str) -> None:
    """tmp in the same directory, fsync, rename: readers see the old or the new file, never half."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, sort_keys=True) + "\n")


def append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def touch(path: str) -> None:
    with open(path, "a"):
        pass
    os.utime(path, None)


def mkdirs(*paths: str) -> None:
    for p in paths:
        os.makedirs(p, exist_ok=True)


def mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def sha256_hex(path: str) -> str:
    """Hex sha256 of a file's content; raises OSError when it cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str) -> str | None:
    """Hex sha256 of a file's content, or None when it cannot be read."""
    try:
        return sha256_hex(path)
    except OSError:
        return None


# --- the root's layout ----------------------------------------------------------------------------


class Layout:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def p(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def job(self, job_id: str, *parts: str) -> str:
        return self.p(P.JOBS_DIR, job_id, *parts)

    def attempt(self, job_id: str, attempt: Any, *parts: str) -> str:
        return self.p(P.JOBS_DIR, job_id, P.ATTEMPTS_DIR, str(attempt), *parts)

    def log(self, msg: str) -> None:
        with contextlib.suppress(OSError):
            append_line(self.p(P.AGENT_LOG), msg)


PRIVATE_UMASK = 0o077  # everything the agent creates is its user's alone (dirs 0700, files 0600)


def make_private(root: str) -> None:
    """The root itself 0700 when it is ours and more open: what others could otherwise read under
    it (bundles unpacked by the controller, specs, logs, checkpoints) is out of their reach."""
    with contextlib.suppress(OSError):
        st = os.stat(root)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(root, 0o700)


def list_specs(dirpath: str) -> list[str]:
    """Job ids of the specs in inbox/, claimed/ or withdrawn/ (tmp files and dot files skipped)."""
    try:
        names = os.listdir(dirpath)
    except OSError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))


# --- job documents --------------------------------------------------------------------------------


def exit_record(job_id: str, attempt: int, wrapper_code: int, phase: str, message: str,
                started_at: float | None = None, trainer_code: int | None = None,
                sig: int | None = None, heartbeat: Any = None,
                best_sha256: str | None = None) -> dict[str, Any]:
    """The exit.json document of an attempt (gpuq_protocol.py lists its fields)."""
    hb = heartbeat if isinstance(heartbeat, dict) else {}
    now = time.time()
    return {"job_id": job_id, "attempt": attempt, "wrapper_code": wrapper_code,
            "trainer_code": trainer_code, "signal": sig, "phase": phase,
            "started_at": utc(started_at if started_at is not None else now), "ended_at": utc(now),
            "last_step": hb.get("step"), "last_epoch": hb.get("epoch"), "best_sha256": best_sha256,
            "durable": "disabled", "message": message}
