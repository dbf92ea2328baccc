"""``reap``: find (and only with ``--force`` kill) VRAM zombies (docs/health.md), one "gpuq.reap/1" document.

Usage: ``gpuq_agent.py --root R reap [--force] [--min-age-s 120] [--resample-s 60]
[--include-other-users]``.

1. Enumerate the real ``/dev/nvidia*`` character-device nodes (none: exit 1) and their holders via
   ``fuser`` (mode letters stripped) or ``lsof -t`` (neither tool: exit 1).
2. Drop the pids ``nvidia-smi --query-compute-apps=pid`` lists.
3. Drop every pid in the tree of a live gpuq agent or attempt group of this root (recorded groups,
   identity-checked, plus /proc/<pid>/task/*/children): in containers nvidia-smi often reports
   host-namespace pids, so a healthy trainer looks invisible; this keeps it alive.
4. Drop system daemons (nvidia-persistenced, nv-hostengine, Xorg, display managers), processes
   younger than --min-age-s, vanished pids and, unless --include-other-users, other users' processes.
5. Sample again --resample-s later; a candidate must be in both samples with the same start time.
6. Dry run by default: list them, exit 0.  With --force: SIGTERM, wait 10 s, SIGKILL survivors,
   report each outcome; exit 1 when a kill failed.  Never a kill by pattern: by pid, after
   re-checking that pid's start time.

Document: {"schema": "gpuq.reap/1", "clean", "dry_run", "host", "time", "devices", "tool",
"candidates": [{"pid", "user", "comm", "age_s", "devices", "cmdline"}], "killed": [{"pid",
"outcome"}], "excluded": {reason: count}, "notes": [...], "error" (only when it could not look)}.
Command lines are redacted (values of key/token/secret/password-like arguments).

stdlib only, Python >= 3.8, Linux.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, read_json, read_text, utc
from gpuq_base.gpuq_procs import descendants, group_alive, group_members, leader_alive, proc_cmdline, proc_stat

TERM_WAIT_S = 10.0
KILL_WAIT_S = 5.0
TOOL_TIMEOUT_S = 20.0
BUSY_MIB = 1024.0
MAX_CMDLINE = 1000
# comm (15 chars at most) or argv[0] basename of processes that legitimately hold GPU devices
DAEMONS = ("nvidia-persistenced", "nv-hostengine", "nv-fabricmanager", "nvidia-fabricmanager", "dcgm",
           "nvidia-smi", "Xorg", "X", "Xwayland", "gdm", "gdm3", "gdm-x-session", "gdm-wayland-session",
           "sddm", "sddm-greeter", "lightdm", "gnome-shell", "kwin_x11", "kwin_wayland")
SECRET_NAME_RE = re.compile(r"key|token|secret|passw(?:or)?d|pass(?:phrase)?$|pwd|credential|auth|cookie",
                            re.IGNORECASE)
SECRET_VALUE_RE = re.compile(r"^(?:sk-|hf_|ghp_|gho_|github_pat_|xox[abpr]-|AKIA|glpat-)[A-Za-z0-9_\-]{8,}")
URL_CRED_RE = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
ASSIGN_RE = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$")
HEADER_WORD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):$")  # "Authorization:" as a word of its own
AUTH_SCHEMES = ("bearer", "basic", "token", "digest", "negotiate", "apikey")
# inside one argument (a `sh -c` string, a curl header): NAME=value (quoted or not), a secret-named
# header's value, an auth scheme's credentials, and -pPASSWORD (mysql, sshpass)
INLINE_ASSIGN_RE = re.compile(r"(?<![A-Za-z0-9_.\-])(-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)="
                              r"(\"(?:[^\"\\]|\\.)*\"?|'[^']*'?|[^\s;&|]+)")
INLINE_HEADER_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*([^\r\n\"']+)")
INLINE_SCHEME_RE = re.compile(r"\b(%s)[ \t]+[^\s\"']+" % "|".join(AUTH_SCHEMES), re.IGNORECASE)
INLINE_SHORT_P_RE = re.compile(r"(^|[\s\"'])-p([^\s\"';&|]+)")
REDACTED = "<redacted>"


# --- pure helpers (unit-tested) -------------------------------------------------------------------


def _redact_inline(text: str) -> str:
    """Secrets inside one argument: ``KEY="..."``, ``--api-key=x``, ``Authorization: Bearer x``,
    ``X-Api-Key: x``, ``Bearer x``, ``-pPASSWORD``, ``https://user:pass@host``."""
    def assign(m: re.Match[str]) -> str:
        return m.group(1) + "=" + REDACTED if SECRET_NAME_RE.search(m.group(1)) else m.group(0)

    def header(m: re.Match[str]) -> str:
        return m.group(1) + ": " + REDACTED if SECRET_NAME_RE.search(m.group(1)) else m.group(0)

    text = INLINE_ASSIGN_RE.sub(assign, text)
    text = INLINE_HEADER_RE.sub(header, text)
    text = INLINE_SCHEME_RE.sub(lambda m: m.group(1) + " " + REDACTED, text)
    text = INLINE_SHORT_P_RE.sub(lambda m: m.group(1) + "-p" + REDACTED, text)
    return URL_CRED_RE.sub("://" + REDACTED + "@", text)


def redact(argv: list[str]) -> str:
    """The command line with secret-looking values replaced: ``--api-key=x``, ``WANDB_API_KEY=x``,
    ``--token x`` (the value after a secret-named flag), ``https://user:pass@host``, ``hf_...``,
    ``-H "Authorization: Bearer x"`` (also split into words), ``-pPASSWORD``, and the same inside one
    argument such as a ``sh -c`` string (``API_KEY="x" python train.py``)."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            hide_next = False
            if not a.startswith("-"):
                out.append(REDACTED)
                hide_next = a.lower() in AUTH_SCHEMES  # "Authorization:" "Bearer" "x": the credentials too
                continue
        m = ASSIGN_RE.match(a)
        if m and SECRET_NAME_RE.search(m.group(1)) and not m.group(2).startswith(("'", '"')):
            out.append(m.group(1) + "=" + REDACTED)  # the whole rest: `env KEY="a b"` passes KEY=a b
            continue
        if a.startswith("-") and "=" not in a and SECRET_NAME_RE.search(a):
            out.append(a)
            hide_next = True
            continue
        word = HEADER_WORD_RE.match(a)
        if (word and SECRET_NAME_RE.search(word.group(1))) or a.lower() in AUTH_SCHEMES:
            out.append(a)
            hide_next = True
            continue
        if SECRET_VALUE_RE.match(a):
            out.append(REDACTED)
            continue
        out.append(_redact_inline(a))
    text = " ".join(out).replace("\n", "\\n").replace("\t", "\\t")
    text = re.sub(r"[\x00-\x1f\x7f]", "?", text)  # one printable line
    return text if len(text) <= MAX_CMDLINE else text[:MAX_CMDLINE] + "..."


def parse_fuser(text: str) -> list[int]:
    """Pids from ``fuser`` stdout (" 1234 5678m 910e"): mode letters stripped."""
    pids = []
    for tok in text.split():
        m = re.match(r"^(\d+)[A-Za-z]*$", tok)
        if m and int(m.group(1)) not in pids:
            pids.append(int(m.group(1)))
    return pids


def parse_pids(text: str) -> list[int]:
    """Pids, one per line (``lsof -t``, ``--query-compute-apps=pid --format=csv,noheader``)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.isdigit() and int(s) not in out:
            out.append(int(s))
    return out


def is_daemon(comm: str, argv: list[str]) -> bool:
    exe = os.path.basename(argv[0]) if argv else ""
    return any(comm == d[:15] or exe == d for d in DAEMONS)


# --- probes ---------------------------------------------------------------------------------------


def _run(argv: list[str], timeout: float = TOOL_TIMEOUT_S) -> tuple[int | None, str, str]:
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, "", "%s timed out after %gs" % (argv[0], timeout)
    except OSError as e:
        return None, "", "%s: %s" % (argv[0], e)
    return out.returncode, out.stdout.decode("utf-8", "replace"), out.stderr.decode("utf-8", "replace")


def device_nodes() -> list[str]:
    """The real /dev/nvidia* character devices (nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/*)."""
    out = []
    for path in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/nvidia-caps/*")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(path)
    return out


def holder_tool() -> str:
    if shutil.which("fuser"):
        return "fuser"
    if shutil.which("lsof"):
        return "lsof"
    return ""


def holders(nodes: list[str], tool: str) -> dict[int, list[str]]:
    """pid -> the device nodes it holds (open or mapped)."""
    found: dict[int, list[str]] = {}
    for node in nodes:
        if tool == "fuser":
            _rc, out, _err = _run(["fuser", node])  # pids on stdout, names and noise on stderr
            pids = parse_fuser(out)
        else:
            _rc, out, _err = _run(["lsof", "-t", node])
            pids = parse_pids(out)
        for pid in pids:
            found.setdefault(pid, []).append(node)
    return found


def smi_pids() -> tuple[set[int], str]:
    """Pids nvidia-smi lists as compute apps, and a note when it could not say."""
    if shutil.which("nvidia-smi") is None:
        return set(), "nvidia-smi not installed: its compute apps could not be excluded"
    rc, out, err = _run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    if rc != 0:
        return set(), "nvidia-smi --query-compute-apps failed (%s): its compute apps could not be excluded" % (
            (err or out).strip().splitlines()[-1][:200] if (err or out).strip() else "exit %s" % rc)
    return set(parse_pids(out)), ""


def gpu_memory() -> dict[int, float]:
    """GPU index -> memory.used MiB ({} when nvidia-smi cannot say)."""
    rc, out, _err = _run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"])
    mem: dict[int, float] = {}
    if rc != 0:
        return mem
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            with contextlib.suppress(ValueError):
                mem[int(parts[0])] = float(parts[1])
    return mem


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


def same_process(pid: int, ticks: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and st[2] == ticks


def kill_all(ticks: dict[int, int]) -> list[dict[str, Any]]:
    """SIGTERM each (after re-checking its start time), wait, SIGKILL survivors; one outcome each."""
    outcome: dict[int, str] = {}
    for pid, t in sorted(ticks.items()):
        if not same_process(pid, t):
            outcome[pid] = "gone"
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            outcome[pid] = "gone"
        except PermissionError:
            outcome[pid] = "failed: permission denied"
    deadline = time.time() + TERM_WAIT_S
    pending = [p for p in ticks if p not in outcome]
    while pending and time.time() < deadline:
        time.sleep(0.1)
        pending = [p for p in pending if same_process(p, ticks[p])]
    for pid in ticks:
        if pid not in outcome and pid not in pending:
            outcome[pid] = "terminated"
    for pid in pending:
        if not same_process(pid, ticks[pid]):
            outcome[pid] = "terminated"
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            outcome[pid] = "terminated"
        except PermissionError:
            outcome[pid] = "failed: permission denied"
    deadline = time.time() + KILL_WAIT_S
    left = [p for p in pending if p not in outcome]
    while left and time.time() < deadline:
        time.sleep(0.05)
        left = [p for p in left if same_process(p, ticks[p])]
    for pid in pending:
        if pid not in outcome:
            outcome[pid] = "failed: still alive after SIGKILL" if pid in left else "killed"
    return [{"pid": pid, "outcome": outcome[pid]} for pid in sorted(outcome)]


def run_reap(lay: Layout, force: bool, min_age_s: float, resample_s: float, other_users: bool,
             sleep: Any = time.sleep) -> tuple[int, dict[str, Any]]:
    doc: dict[str, Any] = {"schema": P.REAP_SCHEMA, "clean": False, "dry_run": not force,
                           "host": socket.gethostname(), "time": utc(), "devices": [], "tool": "",
                           "candidates": [], "killed": [], "excluded": {}, "notes": []}
    nodes = device_nodes()
    doc["devices"] = nodes
    if not nodes:
        doc["error"] = "no /dev/nvidia* device nodes: not a GPU host, or this container was given no GPUs"
        return P.AGENT_EXIT_REAP_FAILED, doc
    tool = holder_tool()
    doc["tool"] = tool
    if not tool:
        doc["error"] = "neither fuser nor lsof is installed: cannot find device holders (install psmisc or lsof)"
        return P.AGENT_EXIT_REAP_FAILED, doc
    first = take_sample(lay, nodes, tool, min_age_s, other_users)
    final = first
    if first.cands:
        sleep(max(0.0, resample_s))
        second = take_sample(lay, nodes, tool, min_age_s, other_users)
        for pid in list(second.cands):
            if first.ticks.get(pid) != second.ticks[pid]:
                del second.cands[pid]
                del second.ticks[pid]
                second.skip("not in both samples")
        final = second
    doc["excluded"] = final.excluded
    doc["notes"] = final.notes
    doc["candidates"] = [final.cands[p] for p in sorted(final.cands)]
    doc["clean"] = not final.cands
    mem = gpu_memory()
    for idx, used in sorted(mem.items()):
        node = "/dev/nvidia%d" % idx
        if used > BUSY_MIB and node in nodes and node not in final.held:
            doc["notes"].append("GPU %d: %g MiB used but no process here holds %s: the holder may live in "
                                "another container, which only restarting that container frees" % (idx, used, node))
    if not force or not final.cands:
        return 0, doc
    doc["memory_used_mib"] = {"before": {str(k): v for k, v in sorted(mem.items())}}
    doc["killed"] = kill_all(final.ticks)
    doc["memory_used_mib"]["after"] = {str(k): v for k, v in sorted(gpu_memory().items())}
    failed = any(k["outcome"].startswith("failed") for k in doc["killed"])
    return (P.AGENT_EXIT_REAP_FAILED if failed else 0), doc


def cmd_reap(lay: Layout, args: argparse.Namespace) -> int:
    if args.min_age_s < 0 or args.resample_s < 0:
        print("gpuq reap: --min-age-s and --resample-s must be >= 0", file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    code, doc = run_reap(lay, bool(args.force), float(args.min_age_s), float(args.resample_s),
                         bool(args.include_other_users))
    if doc.get("error"):
        print("gpuq reap: %s" % doc["error"], file=sys.stderr)
    elif doc["clean"]:
        print("gpuq reap: clean (no zombie holds a GPU device)", file=sys.stderr)
    for c in doc["candidates"]:
        print("gpuq reap: zombie pid %d user %s comm %s age %.0fs devices %s: %s" % (
            c["pid"], c["user"], c["comm"], c["age_s"], ",".join(c["devices"]), c["cmdline"]), file=sys.stderr)
    for k in doc["killed"]:
        print("gpuq reap: pid %d %s" % (k["pid"], k["outcome"]), file=sys.stderr)
    for n in doc["notes"]:
        print("gpuq reap: note: %s" % n, file=sys.stderr)
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return code


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--force", action="store_true", help="kill the candidates (SIGTERM, 10 s, SIGKILL)")
    ap.add_argument("--min-age-s", type=float, default=float(P.REAP_MIN_AGE_S),
                    help="ignore holders younger than this (context start-up)")
    ap.add_argument("--resample-s", type=float, default=float(P.REAP_RESAMPLE_S),
                    help="seconds between the two samples")
    ap.add_argument("--include-other-users", action="store_true", help="also list other users' processes")
