"""Which holder of a GPU device is a VRAM zombie, for ``reap`` (gpuq_reap.py): one sample of the
holders, less those nvidia-smi lists, every pid in the tree of this root's live gpuq agent and attempt
groups (in containers nvidia-smi often reports host-namespace pids, so a healthy trainer looks
invisible), system daemons, processes younger than the minimum age, vanished pids and, unless asked,
other users' processes; each exclusion counted by its reason.

stdlib only, Python >= 3.8, Linux.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import glob
import os
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, read_json, read_text
from gpuq_base.gpuq_procs import descendants, group_alive, group_members, leader_alive, proc_cmdline, proc_stat
from gpuq_verbs.gpuq_reap_find import holders, smi_pids
from gpuq_verbs.gpuq_reap_redact import redact

# comm (15 chars at most) or argv[0] basename of processes that legitimately hold GPU devices
DAEMONS = ("nvidia-persistenced", "nv-hostengine", "nv-fabricmanager", "nvidia-fabricmanager", "dcgm",
           "nvidia-smi", "Xorg", "X", "Xwayland", "gdm", "gdm3", "gdm-x-session", "gdm-wayland-session",
           "sddm", "sddm-greeter", "lightdm", "gnome-shell", "kwin_x11", "kwin_wayland")


def is_daemon(comm: str, argv: list[str]) -> bool:
    exe = os.path.basename(argv[0]) if argv else ""
    return any(comm == d[:15] or exe == d for d in DAEMONS)


def our_pids(lay: Layout) -> set[int]:
    """Every pid in the tree of this root's live agent and attempt groups (identity-checked)."""
    roots: set[int] = set()
    rec = read_json(lay.p(P.AGENT_PID))
    if isinstance(rec, dict) and isinstance(rec.get("pid"), int) and \
            leader_alive(rec["pid"], rec.get("start_ticks"), rec.get("boot_id")):
        roots.add(rec["pid"])
        pgid = rec.get("pgid")
        if isinstance(pgid, int) and pgid > 1:
            roots.update(group_members(pgid))
    for path in glob.glob(lay.p(P.JOBS_DIR, "*", P.ATTEMPTS_DIR, "*", P.PGID_FILE)):
        g = read_json(path)
        if isinstance(g, dict) and group_alive(g):
            roots.update(group_members(int(g["pgid"])))
    out = set(roots)
    for pid in roots:
        out.update(descendants(pid))
    return out


def uptime_s() -> float:
    parts = (read_text("/proc/uptime") or "0").split()
    try:
        return float(parts[0])
    except (IndexError, ValueError):
        return 0.0


def proc_uid(pid: int) -> int | None:
    for line in (read_text("/proc/%d/status" % pid) or "").splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


def user_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


class Sample:
    def __init__(self) -> None:
        self.cands: dict[int, dict[str, Any]] = {}
        self.ticks: dict[int, int] = {}
        self.excluded: dict[str, int] = {}
        self.notes: list[str] = []
        self.held: set[str] = set()

    def skip(self, why: str) -> None:
        self.excluded[why] = self.excluded.get(why, 0) + 1


def take_sample(lay: Layout, nodes: list[str], tool: str, min_age_s: float, other_users: bool) -> Sample:
    s = Sample()
    held = holders(nodes, tool)
    for devs in held.values():
        s.held.update(devs)
    listed, note = smi_pids()
    if note:
        s.notes.append(note)
    ours = our_pids(lay)
    me, uid = os.getpid(), os.getuid()
    hz = float(os.sysconf("SC_CLK_TCK"))
    up = uptime_s()
    for pid, devs in sorted(held.items()):
        st = proc_stat(pid)
        if pid == me or st is None or st[0] in ("Z", "X"):
            s.skip("vanished")
            continue
        if pid in listed:
            s.skip("listed by nvidia-smi")
            continue
        if pid in ours:
            s.skip("gpuq job tree")
            continue
        argv = proc_cmdline(pid)
        comm = (read_text("/proc/%d/comm" % pid) or "").strip()
        if is_daemon(comm, argv):
            s.skip("system daemon")
            continue
        age = max(0.0, up - st[2] / hz)
        if age < min_age_s:
            s.skip("younger than %gs" % min_age_s)
            continue
        owner = proc_uid(pid)
        if owner != uid and not other_users:
            s.skip("other user")
            continue
        s.ticks[pid] = st[2]
        s.cands[pid] = {"pid": pid, "user": user_name(owner), "comm": comm, "age_s": round(age, 1),
                        "devices": devs, "cmdline": redact(argv)}
    return s
