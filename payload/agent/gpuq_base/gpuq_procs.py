"""Processes and process groups, by /proc: identity (pid + start_ticks + boot_id), liveness, signals.

stdlib only, Python >= 3.8, Linux.  A recorded group is {"pgid", "start_ticks", "boot_id"} (the pgid
file of an attempt); nothing is ever signalled without that identity holding.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import mtime, read_json, read_text


HELPER_MARK = "GPUQ_WRAPPER_HELPER"  # in the environment of each process gpuq's wrapper starts for itself


def helper_env(env: Any = None) -> dict[str, str]:
    """``env`` (default: this process's) marked as a helper's: a process gpuq's wrapper starts for itself
    beside the trainer (nvidia-smi for the memory samples, the provenance probe), never the attempt's own."""
    out = dict(os.environ if env is None else env)
    out[HELPER_MARK] = "1"
    return out


def is_helper(pid: int) -> bool:
    """Whether ``pid`` was started with ``helper_env`` (or by such a process): not one of the attempt's."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return (HELPER_MARK + "=1").encode() in data.split(b"\0")


def boot_id() -> str:
    return (read_text("/proc/sys/kernel/random/boot_id") or "").strip()


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgid, start_ticks) of a process, or None when it does not exist."""
    text = read_text("/proc/%d/stat" % pid)
    if not text:
        return None
    rest = text[text.rfind(")") + 2:].split()
    try:
        return rest[0], int(rest[2]), int(rest[19])  # fields 3, 5 and 22
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    st = proc_stat(pid)
    return st[2] if st else None


def proc_cmdline(pid: int) -> list[str]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def leader_alive(pid: Any, ticks: Any, boot: Any) -> bool:
    """The recorded process (pid + start_ticks + boot_id) still runs and is not a zombie."""
    if not isinstance(pid, int) or pid <= 1 or boot != boot_id():
        return False
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and st[2] == ticks


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, by one scan of /proc."""
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st and st[1] == pgid and st[0] not in ("Z", "X"):
            out.append(int(name))
    return out


def become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: orphaned descendants (torchrun starts its workers in new sessions,
    out of our process group) are re-parented to this process instead of init, so the wrapper can
    still find and end them.  Linux only; False where unavailable."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # 36 = PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children files of each thread, recursively)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir("/proc/%d/task" % parent)
        except OSError:
            continue
        for tid in tids:
            text = read_text("/proc/%d/task/%s/children" % (parent, tid)) or ""
            for child in text.split():
                if child.isdigit() and int(child) not in out:
                    out.append(int(child))
                    todo.append(int(child))
    return out


_CLD_SIGNALED = (2, 3)  # CLD_KILLED, CLD_DUMPED (os.CLD_* only from Python 3.9)


def signaled_children(exclude: Any = ()) -> list[tuple[int, int]]:
    """[(pid, signal)] of this process's unreaped children (orphans a subreaper inherited included) that
    died of a signal.  Peeked with WNOWAIT: they stay for the reaper.  [] where /proc or waitid is missing."""
    me = os.getpid()
    out: list[tuple[int, int]] = []
    try:
        tids = os.listdir("/proc/%d/task" % me)
    except OSError:
        return out
    for tid in tids:
        for child in (read_text("/proc/%d/task/%s/children" % (me, tid)) or "").split():
            pid = int(child) if child.isdigit() else 0
            st = proc_stat(pid) if pid and pid not in exclude else None
            if not st or st[0] != "Z":
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (OSError, AttributeError):
                continue
            if info is not None and info.si_code in _CLD_SIGNALED:
                out.append((pid, info.si_status))
    return sorted(set(out))


def dead_rank_line(pid: int, sig: int) -> str:
    """The wrapper's log line for a process of the trainer that died of a signal before it, in torchrun's
    words ("Signal 9 (SIGKILL) received by PID 7"), so the log scan's rank signatures see it."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = "SIG%d" % sig
    return "gpuq: process %d of the trainer died before it: Signal %d (%s) received by PID %d" % (pid, sig, name, pid)


def group_alive(rec: Any) -> bool:
    """A recorded group {"pgid","start_ticks","boot_id"} is alive: same boot, and either its leader
    is the recorded process, or the leader is gone but members remain (a pgid cannot be reused
    while its group has members)."""
    if not isinstance(rec, dict) or rec.get("boot_id") != boot_id():
        return False
    pgid = rec.get("pgid")
    if not isinstance(pgid, int) or pgid <= 1:
        return False
    st = proc_stat(pgid)
    if st is not None and st[0] not in ("Z", "X"):
        return st[2] == rec.get("start_ticks")
    if st is not None and st[2] != rec.get("start_ticks"):
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return bool(group_members(pgid))


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


UNRECORDED_GRACE_S = 60.0  # launch.json written, pgid not yet: the agent is between the two writes


def live_attempt(root: str, job_id: str, other_than: int = 0) -> int | None:
    """The number of an attempt of ``job_id`` (not ``other_than``) still alive on this host: launched
    (launch.json), no exit.json, and its recorded group alive (or launched moments ago and its group
    not recorded yet).  A second attempt of a job must never start while one lives (one job, one run)."""
    base = os.path.join(root, P.JOBS_DIR, job_id, P.ATTEMPTS_DIR)
    try:
        names = os.listdir(base)
    except OSError:
        return None
    for name in sorted(names):
        if not name.isdigit() or int(name) == other_than:
            continue
        adir = os.path.join(base, name)
        launched = mtime(os.path.join(adir, P.LAUNCH_FILE))
        if launched is None or os.path.exists(os.path.join(adir, P.EXIT_FILE)):
            continue
        rec = read_json(os.path.join(adir, P.PGID_FILE))
        if rec is None:
            if time.time() - launched < UNRECORDED_GRACE_S:
                return int(name)
            continue
        if group_alive(rec):
            return int(name)
    return None
