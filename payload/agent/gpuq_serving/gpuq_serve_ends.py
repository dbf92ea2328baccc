"""The end of an attempt the serving agent (gpuq_serve.py) saw: the exit record of a wrapper that died
without writing one, and the processes an ended attempt left behind, killed (end_leftovers).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import os
import signal
from typing import Any, Callable

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write_json, exit_record, mtime, read_json
from gpuq_base.gpuq_procs import boot_id, group_alive, group_members, proc_stat, signal_group


def write_vanished(lay: Layout, job_id: str, n: int, status: int) -> tuple[int, str] | None:
    """The wrapper of attempt ``n`` was reaped with wait ``status``: when it wrote no exit.json, write
    one saying so (``vanished``: the whole attempt died, not a verdict) and return (code, message)."""
    path = lay.attempt(job_id, n, P.EXIT_FILE)
    if os.path.exists(path):
        return None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if sig is not None:
        code, msg = 128 + sig, "wrapper killed by signal %d before writing exit.json" % sig
    else:
        code = os.WEXITSTATUS(status) or P.EXIT_SETUP
        msg = "wrapper exited %d without writing exit.json" % os.WEXITSTATUS(status)
    hb = read_json(lay.attempt(job_id, n, P.HEARTBEAT_FILE))
    started = mtime(lay.attempt(job_id, n, P.LAUNCH_FILE))
    rec = exit_record(job_id, n, code, "train", msg, started_at=started, sig=sig, heartbeat=hb)
    rec["vanished"] = True  # the whole attempt died (kill -9, OOM of the group): not a verdict
    atomic_write_json(path, rec)
    return code, msg


def end_leftovers(lay: Layout, job_id: str, n: int, rec: dict[str, Any] | None,
                  log: Callable[[str], None]) -> int:
    """SIGKILL what an ended attempt left behind: the rest of its process group (a trainer's
    child holding GPU memory must not outlive the job) and any process whose environment carries
    this attempt's own GPUQ_LOG path (escapees in other sessions, orphaned when the wrapper, their
    subreaper, died first).  Identity: same boot as the recorded group ``rec``; a pgid cannot be reused
    while members remain; an escapee must carry this root's attempt path and have started after
    the wrapper.  Returns how many processes were signalled."""
    rec = rec or {}
    if rec.get("boot_id") != boot_id():
        return 0  # pids of another boot mean nothing: kill nothing
    pgid = rec.get("pgid")
    victims: set[int] = set()
    if isinstance(pgid, int) and pgid > 1 and group_alive(rec):
        victims.update(group_members(pgid))
        signal_group(pgid, signal.SIGKILL)
    for pid in attempt_processes(lay.attempt(job_id, n, P.JOB_LOG), rec.get("start_ticks")):
        if pid not in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            victims.add(pid)
    if victims:
        log("LEFTOVERS %s a%d: killed %d processes the attempt left behind: %s" % (
            job_id, n, len(victims), " ".join(str(p) for p in sorted(victims))))
    return len(victims)


def attempt_processes(log_path: str, min_ticks: Any) -> list[int]:
    """Live processes whose environment has ``GPUQ_LOG=<log_path>`` (the attempt's own job.log, an
    absolute path under this root, set by the wrapper for the trainer and inherited by everything
    it starts) and that started no earlier than ``min_ticks`` (the wrapper's start)."""
    needle = ("%s=%s" % (P.ENV_LOG, log_path)).encode()
    me = os.getpid()
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue  # gone, or another user's: not ours to judge
        if needle not in env.split(b"\0"):
            continue
        st = proc_stat(int(name))
        if st is None or st[0] in ("Z", "X"):
            continue
        if isinstance(min_ticks, int) and st[2] < min_ticks:
            continue
        out.append(int(name))
    return out
