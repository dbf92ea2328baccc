"""``stacks JOB_ID ATTEMPT``: where each process of a running attempt waits, saved to the attempt's
``stacks.txt`` before gpuq kills it as stalled (docs/health.md, "Where a stalled job hung").

The processes: the attempt's recorded group, identity-checked as a kill is (gpuq_cancel.py), and every
descendant of its leader (DataLoader workers, ranks in sessions of their own); the leader, gpuq's own
wrapper, is left out, and so are the processes it runs for itself beside the trainer (nvidia-smi for its
memory samples, the provenance probe: ``gpuq_procs.is_helper``).  For each, oldest first:

- its state (``/proc/PID/status``), wait channel (``/proc/PID/wchan``) and command line;
- with ``py-spy`` on PATH (or beside the agent's interpreter): ``py-spy dump --pid PID``, the Python
  frames of every thread (no ``--native``, no locals), at most PER_PROCESS_S seconds each;
- without py-spy, or where it fails for that process: the kernel stack (``/proc/PID/stack``, readable
  by root only) and each thread's wait channel.

Bounded: MAX_PROCESSES processes, TOTAL_S seconds in all (later processes get /proc's part only),
MAX_SECTION_BYTES per process.  The forwarded secret values are redacted as in all host text
(gpuq_secrets.py).  The file is written atomically; the verb prints one line saying what it saved.  The
agent's own stall kill saves them the same way (gpuq_stall.py); once it has, the verb keeps them ("not
saved again").

stdlib only, Python >= 3.8, Linux.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base import gpuq_secrets
from gpuq_slurmmode import gpuq_slurm
from gpuq_verbs.gpuq_cancel import recorded_group
from gpuq_base.gpuq_files import Layout, atomic_write, read_text, utc
from gpuq_base.gpuq_procs import descendants, group_members, is_helper, proc_cmdline

PER_PROCESS_S = 10.0
TOTAL_S = 45.0
MAX_PROCESSES = 32
MAX_THREADS = 16  # thread wait channels listed per process without py-spy
MAX_SECTION_BYTES = 32 * 1024
MAX_LINE_CHARS = 400


def py_spy() -> str | None:
    """py-spy on PATH, else beside the interpreter running the agent (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None


def _proc(pid: int, name: str) -> str:
    text = read_text("/proc/%d/%s" % (pid, name))
    return "" if text is None else text


def _state(pid: int) -> str:
    for line in _proc(pid, "status").splitlines():
        if line.startswith("State:"):
            return line.split(":", 1)[1].strip()
    return "?"


def _kernel_stack(pid: int) -> list[str]:
    try:
        with open("/proc/%d/stack" % pid, encoding="utf-8", errors="replace") as f:
            lines = f.read(MAX_SECTION_BYTES).splitlines()
    except OSError as e:
        return ["  kernel stack: unreadable (%s)" % (e.strerror or e)]
    return ["  kernel stack:"] + ["    " + line.strip() for line in lines if line.strip()]


def _threads(pid: int) -> list[str]:
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % pid) if t.isdigit())
    except OSError:
        return []
    out = ["  threads: %d" % len(tids)]
    for tid in tids[:MAX_THREADS]:
        wchan = (read_text("/proc/%d/task/%d/wchan" % (pid, tid)) or "").strip() or "-"
        comm = (read_text("/proc/%d/task/%d/comm" % (pid, tid)) or "").strip()
        out.append("    %d %s wchan=%s" % (tid, comm, wchan))
    if len(tids) > MAX_THREADS:
        out.append("    ... %d more" % (len(tids) - MAX_THREADS))
    return out


def _py_spy(exe: str, pid: int, timeout: float) -> tuple[list[str], str]:
    """(py-spy's dump of the process, "") or ([], why it gave none)."""
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], "py-spy dump did not finish within %.0f s" % timeout
    except OSError as e:
        return [], "py-spy could not run: %s" % (e.strerror or e)
    text = out.stdout.decode("utf-8", "replace")
    if out.returncode != 0 or not text.strip():
        why = (out.stderr.decode("utf-8", "replace").strip().splitlines() or ["exit %d" % out.returncode])[-1]
        return [], "py-spy dump failed: %s" % why[:MAX_LINE_CHARS]
    return ["  py-spy dump:"] + [("    " + line).rstrip() for line in text.splitlines()], ""


def _section(pid: int, exe: str | None, budget: float) -> list[str]:
    cmd = " ".join(proc_cmdline(pid)) or (_proc(pid, "comm").strip() or "?")
    wchan = _proc(pid, "wchan").strip() or "-"
    lines = ["process %d: state %s, wchan %s" % (pid, _state(pid), wchan), "  cmdline: %s" % cmd[:MAX_LINE_CHARS]]
    dumped: list[str] = []
    why = ""
    if exe is not None and budget > 0:
        dumped, why = _py_spy(exe, pid, min(PER_PROCESS_S, budget))
    elif exe is not None:
        why = "py-spy skipped: the %.0f s for all processes are spent" % TOTAL_S
    if why:
        lines.append("  " + why)
    lines += dumped or (_kernel_stack(pid) + _threads(pid))
    text, size = [], 0
    for line in lines:
        line = line[:MAX_LINE_CHARS]
        size += len(line) + 1
        if size > MAX_SECTION_BYTES:
            text.append("  ... (cut at %d bytes)" % MAX_SECTION_BYTES)
            break
        text.append(line)
    return text


def attempt_processes(rec: dict[str, Any]) -> list[int]:
    """The live processes of a recorded group and its leader's descendants, the leader left out, and so are
    the processes the wrapper runs for itself beside the trainer (nvidia-smi for its memory samples, the
    provenance probe: ``gpuq_procs.is_helper``)."""
    pgid = rec["pgid"]
    pids = set(group_members(pgid)) | set(descendants(pgid))
    pids.discard(pgid)
    pids.discard(os.getpid())
    return sorted(p for p in pids if not is_helper(p))


def save_stacks(lay: Layout, job_id: str, attempt: int, rec: dict[str, Any]) -> tuple[str, str]:
    """Write the attempt's stacks.txt for the recorded group ``rec``; (its path, a one-line summary)."""
    exe = py_spy()
    pids = attempt_processes(rec)
    started = time.monotonic()
    how = "py-spy dump (%s)" % exe if exe else "/proc (no py-spy on PATH or beside the agent's python)"
    out = ["# gpuq: where each process of %s attempt %d waited, %s, by %s" % (job_id, attempt, utc(), how),
           "# group %d (gpuq's wrapper, left out) and its descendants: %d process(es)" % (rec["pgid"], len(pids))]
    for pid in pids[:MAX_PROCESSES]:
        out.append("")
        out += _section(pid, exe, TOTAL_S - (time.monotonic() - started))
    if len(pids) > MAX_PROCESSES:
        out += ["", "... %d more process(es) not shown" % (len(pids) - MAX_PROCESSES)]
    text = gpuq_secrets.redact("\n".join(out) + "\n", gpuq_secrets.held_values(lay))
    path = lay.attempt(job_id, attempt, P.STACKS_FILE)
    atomic_write(path, text)
    summary = "saved %s/%d/%s: %d process(es), by %s" % (P.ATTEMPTS_DIR, attempt, P.STACKS_FILE, len(pids),
                                                          "py-spy" if exe else "/proc")
    return path, summary


def cmd_stacks(lay: Layout, job_id: str, attempt: int) -> int:
    from gpuq_base.gpuq_jobspec import JOB_ID_RE  # the rule every spec's job id passed
    if not JOB_ID_RE.match(job_id):
        print("gpuq stacks: bad job id %r" % job_id, file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    if gpuq_slurm.config(lay) is not None:
        print("not saved: the attempt runs on a Slurm compute node, not on this login node")
        return 1
    from gpuq_watch import gpuq_retry
    got = gpuq_retry.decided(lay, job_id, attempt)
    if got is not None and got.get("by") == gpuq_retry.BY_HOST and got.get("class") in ("stalled", "deadlock_at_start"):
        print("not saved again: this host's agent ended attempt %d as %s itself and saved its stacks (%s)" % (
            attempt, got.get("class"), got.get("stacks") or "being saved"))
        return 0  # gpuq's kill that follows says whose the attempt is
    _spec, rec, why = recorded_group(lay, job_id, attempt)
    if why:
        print("not saved: " + why.replace("nothing killed", "nothing saved"))
        return 1
    try:
        _path, summary = save_stacks(lay, job_id, attempt, rec)
    except OSError as e:
        print("not saved: %s" % (e.strerror or e))
        return 1
    print(summary)
    return 0
