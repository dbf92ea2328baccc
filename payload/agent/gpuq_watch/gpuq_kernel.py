"""The kernel log, for GPU Xids (docs/health.md): read it, find ``NVRM: Xid`` lines, keep a cursor.

Read with ``dmesg`` (5 s timeout); only when ``dmesg`` is not installed, with ``journalctl -k -o
short-monotonic --no-pager``.  A log that cannot be read (``dmesg: read kernel buffer failed:
Operation not permitted`` under kernel.dmesg_restrict, a timeout) is reported as unreadable, never as
clean: "no Xid" is then unknown.

Lines look like ``[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has
fallen off the bus.`` (journalctl adds ``host kernel:`` after the timestamp; old drivers omit
``PCI:``).  Each Xid becomes {"ts": 1234.56789, "code": 79, "pci": "0000:3b:00", "line": ...}.

The cursor is the monotonic timestamp (as printed, a string) of the last kernel line seen; the next
read reports only lines after it.  ``since`` may also be ``BOOT_ID:TS`` (as the controller stores
it): a cursor from another boot, or one beyond this boot's uptime (the kernel clock restarts at a
reboot), is ignored and every line counts as new.

Read-only and bounded: this runs inside the one-round-trip status probe.  stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import shutil
import subprocess
from typing import Any

from gpuq_base.gpuq_lazyre import lazy
from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import read_text
from gpuq_base.gpuq_procs import boot_id

DMESG_TIMEOUT_S = 5.0
MAX_LINE_CHARS = 400  # one Xid line carried in a document; the rest is cut
TS_RE = lazy(r"^\s*\[\s*(\d+(?:\.\d+)?)\]")
XID_RE = lazy(r"NVRM: Xid \((?:PCI:)?([^)\s]+)\):\s*(\d+)")
# the OOM killer's report: "Out of memory: Killed process 1234 (python)", "Memory cgroup out of memory:
# Killed process 1234 (python)", or the one-line summary "oom-kill:...,task=python,pid=1234,uid=0"
OOM_RE = lazy(r"(?:[Oo]ut of memory: Killed process (\d+)|oom-kill:.*\bpid=(\d+))")
UPTIME_SLACK_S = 5.0


def line_ts(line: str) -> tuple[str, float] | None:
    """("1234.567890", 1234.56789) for a line starting with a ``[ seconds]`` timestamp, else None."""
    m = TS_RE.match(line)
    if not m:
        return None
    return m.group(1), float(m.group(1))


def parse_xid(line: str) -> dict[str, Any] | None:
    """The Xid record of one kernel line, or None when the line is not an NVRM Xid report."""
    m = XID_RE.search(line)
    if not m:
        return None
    ts = line_ts(line)
    return {"ts": ts[1] if ts else None, "code": int(m.group(2)), "pci": m.group(1),
            "line": line.strip()[:MAX_LINE_CHARS]}


def _uptime() -> float | None:
    parts = (read_text("/proc/uptime") or "").split()
    try:
        return float(parts[0]) if parts else None
    except ValueError:
        return None


def parse_cursor(since: str | None, boot: str | None = None, uptime: float | None = None) -> float | None:
    """The timestamp after which lines are new, or None (every line is new).

    Accepts "TS" or "BOOT_ID:TS".  A cursor of another boot, one past this boot's uptime (the
    kernel clock restarted), or a malformed one counts as no cursor."""
    text = (since or "").strip()
    if not text:
        return None
    if ":" in text:
        cboot, _, text = text.rpartition(":")
        if boot is not None and cboot and cboot != boot:
            return None
    try:
        ts = float(text)
    except ValueError:
        return None
    if ts != ts or ts < 0:  # NaN
        return None
    if uptime is not None and ts > uptime + UPTIME_SLACK_S:
        return None
    return ts


def read_kernel_log(timeout: float = DMESG_TIMEOUT_S) -> tuple[list[str] | None, str]:
    """(lines, "") or (None, why it could not be read)."""
    if shutil.which("dmesg") is not None:
        argv = ["dmesg"]
    elif shutil.which("journalctl") is not None:
        argv = ["journalctl", "-k", "-o", "short-monotonic", "--no-pager", "-q"]
    else:
        return None, "neither dmesg nor journalctl is installed"
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                             check=False)
    except subprocess.TimeoutExpired:
        return None, "%s timed out after %gs" % (argv[0], timeout)
    except OSError as e:
        return None, "%s: %s" % (argv[0], e)
    text = out.stdout.decode("utf-8", "replace")
    if out.returncode != 0:
        err = out.stderr.decode("utf-8", "replace").strip() or text.strip()
        return None, (err.splitlines()[-1] if err else "%s exited %d" % (argv[0], out.returncode))[:300]
    return text.splitlines(), ""


def select_xids(xids: list[dict[str, Any]], limit: int = P.KERNEL_MAX_XIDS) -> list[dict[str, Any]]:
    """At most ``limit`` records, in log order: every fatal one (48/79) first, then the newest others."""
    if len(xids) <= limit:
        return xids
    idx = list(range(len(xids)))
    fatal = [i for i in idx if xids[i]["code"] in P.FATAL_XIDS][-limit:]
    rest = [i for i in idx if xids[i]["code"] not in P.FATAL_XIDS]
    room = limit - len(fatal)
    keep = sorted(fatal + (rest[-room:] if room > 0 else []))
    return [xids[i] for i in keep]


def scan_lines(lines: list[str], since: float | None) -> tuple[str, list[dict[str, Any]]]:
    """(cursor of the last timestamped line or "", the Xids after ``since``, all of them)."""
    cursor = ""
    for line in reversed(lines):  # only the last timestamp matters: no regex over a whole big log
        ts = line_ts(line)
        if ts is not None:
            cursor = ts[0]
            break
    xids: list[dict[str, Any]] = []
    for line in lines:
        if "Xid" not in line:
            continue
        rec = parse_xid(line)
        if rec is None:
            continue
        if since is not None and (rec["ts"] is None or rec["ts"] <= since):
            continue  # seen before (a line without a timestamp cannot be placed: not new)
        xids.append(rec)
    return cursor, xids


def scan_oom_kills(lines: list[str], since: float | None) -> list[dict[str, Any]]:
    """The OOM killer's kills after ``since``: [{"ts", "pid", "line"}], the newest KERNEL_MAX_OOM_KILLS."""
    kills: list[dict[str, Any]] = []
    for line in lines:
        if "Killed process" not in line and "oom-kill:" not in line:
            continue
        m = OOM_RE.search(line)
        if not m:
            continue
        ts = line_ts(line)
        if since is not None and (ts is None or ts[1] <= since):
            continue
        kills.append({"ts": ts[1] if ts else None, "pid": int(m.group(1) or m.group(2)),
                      "line": line.strip()[:MAX_LINE_CHARS]})
    return kills[-P.KERNEL_MAX_OOM_KILLS:]


def kernel_section(since: str | None = None, lines: list[str] | None = None,
                   error: str = "") -> dict[str, Any]:
    """The "kernel" part of the status and health documents:
    {"readable", "error", "cursor", "xids": [new Xid records, at most KERNEL_MAX_XIDS]}.

    ``cursor`` is the timestamp of the last line seen; unreadable or empty logs give back the
    cursor they were asked with (minus a boot prefix), so storing it never loses a position."""
    if lines is None and not error:
        lines, error = read_kernel_log()
    cur = parse_cursor(since, boot_id() or None, _uptime())
    given = (since or "").strip().rpartition(":")[2] if cur is not None else ""
    if lines is None:
        return {"readable": False, "error": error or "kernel log unreadable", "cursor": given, "xids": []}
    cursor, xids = scan_lines(lines, cur)
    out: dict[str, Any] = {"readable": True, "error": "", "cursor": cursor or given, "xids": select_xids(xids)}
    kills = scan_oom_kills(lines, cur)
    if kills:  # present only when the OOM killer struck since the cursor
        out["oom_kills"] = kills
    return out
