#!/usr/bin/env python3
"""gpuq host agent: one per root, stdlib only, Python >= 3.8.

Commands (``python gpuq_agent.py --root ROOT <command>``):

  serve [--detach] [--idle-exit-s S] [--cpu-slots N] [--poll-s S]
                          the long-lived agent: claims inbox specs, packs them onto slots, runs one
                          wrapper per attempt, adopts live groups after a restart, exits when idle
  wrap JOB_ID ATTEMPT     internal: the per-attempt wrapper (DOMAIN.md 4.2)
  status --json           read-only probe, one "gpuq.status/1" document on stdout
  cancel JOB_ID...        withdraw queued jobs, then kill running ones (identity-checked)
  enqueue [--serve ...]   write job specs (JSON list on stdin) into the inbox, idempotently;
                          with --serve, then make sure a detached agent runs (gpuq_inbox.py)
  collect JOB_ID...       summaries and sha256-hashed result files of finished jobs
  version                 print the protocol version

The contract (layout, documents, exit codes, environment) lives in gpuq_protocol.py, a copy of
orchestrator/protocol.py.  Killing is always by recorded process group after identity proof.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # bundles are read-only; `status` must never write

import argparse  # noqa: E402
import contextlib  # noqa: E402
import errno  # noqa: E402
import fcntl  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpuq_protocol as P  # noqa: E402

AGENT_FILE = os.path.abspath(__file__)
NVSMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu",
    "--format=csv,noheader,nounits",
]
INODE_LIMIT_PCT = 95.0
MEM_SAMPLE_S = 5.0
LAUNCH_PGID_GRACE_S = 10.0  # launched, pgid not yet written: still "claimed" (launching) this long


# --- small helpers ------------------------------------------------------------------------------


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


def leader_alive(pid: int, ticks: Any, boot: Any) -> bool:
    """The recorded process (pid + start_ticks + boot_id) still runs and is not a zombie."""
    if not isinstance(pid, int) or pid <= 1 or boot != boot_id():
        return False
    st = proc_stat(pid)
    return bool(st) and st[0] not in ("Z", "X") and st[2] == ticks


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, by one scan of /proc."""
    out = []
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
        return libc.prctl(36, 1, 0, 0, 0) == 0  # 36 = PR_SET_CHILD_SUBREAPER
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


def spec_major(schema: Any) -> int | None:
    if not isinstance(schema, str) or "/" not in schema:
        return None
    try:
        return int(schema.rsplit("/", 1)[1].split(".")[0])
    except ValueError:
        return None


def sha256_file(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


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


def list_specs(dirpath: str) -> list[str]:
    try:
        names = os.listdir(dirpath)
    except OSError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))


def spec_attempt(spec: Any) -> int:
    try:
        return max(1, int(spec.get("attempt", 1)))
    except (AttributeError, TypeError, ValueError):
        return 1


# --- host facts: GPUs, cgroup, disk -------------------------------------------------------------


def query_gpus() -> list[dict[str, Any]]:
    try:
        out = subprocess.run(NVSMI_QUERY, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=15, text=True)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7 or not f[0].isdigit():
            continue

        def num(s: str) -> float | None:
            try:
                return float(s)
            except ValueError:
                return None

        gpus.append({"index": int(f[0]), "name": f[1], "uuid": f[2], "util_pct": num(f[3]),
                     "mem_used_mib": num(f[4]), "mem_total_mib": num(f[5]), "temp_c": num(f[6])})
    return gpus


def _cgroup_paths() -> tuple[bool, dict[str, str]]:
    """(is_v2, controller -> directory) for this process, per DOMAIN.md 10."""
    base = "/sys/fs/cgroup"
    v2 = os.path.exists(os.path.join(base, "cgroup.controllers"))
    own: dict[str, str] = {}
    for line in (read_text("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in (parts[1].split(",") if parts[1] else [""]):
                own[c] = parts[2]
    dirs: dict[str, str] = {}
    if v2:
        rel = own.get("", "/").lstrip("/")
        cand = os.path.join(base, rel) if rel else base
        d = cand if rel and os.path.exists(os.path.join(cand, "memory.current")) else base
        dirs["memory"] = dirs["cpu"] = d
    else:
        for ctl, sub in (("memory", "memory"), ("cpu", "cpu")):
            root = os.path.join(base, sub)
            if not os.path.isdir(root):
                root = os.path.join(base, "cpu,cpuacct") if ctl == "cpu" else root
            rel = own.get(ctl, own.get("cpu,cpuacct", "/") if ctl == "cpu" else "/").lstrip("/")
            cand = os.path.join(root, rel) if rel else root
            dirs[ctl] = cand if rel and os.path.isdir(cand) else root
    return v2, dirs


def _read_int(path: str) -> int | None:
    text = read_text(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _kv_value(path: str, key: str) -> int | None:
    for line in (read_text(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


def memory_info() -> dict[str, Any]:
    """{"source","used_bytes","limit_bytes","used_pct","oom_kill"}: the container, not the machine."""
    v2, dirs = _cgroup_paths()
    d = dirs.get("memory", "")
    used = limit = oom = None
    source = ""
    if v2:
        used = _read_int(os.path.join(d, "memory.current"))
        lim = (read_text(os.path.join(d, "memory.max")) or "").strip()
        limit = int(lim) if lim.isdigit() else None
        oom = _kv_value(os.path.join(d, "memory.events"), "oom_kill")
        source = "cgroup2"
    else:
        used = _read_int(os.path.join(d, "memory.usage_in_bytes"))
        lim_v1 = _read_int(os.path.join(d, "memory.limit_in_bytes"))
        limit = lim_v1 if lim_v1 is not None and lim_v1 < (1 << 62) else None
        oom = _kv_value(os.path.join(d, "memory.oom_control"), "oom_kill")
        source = "cgroup1"
    if used is None:
        source = "meminfo"
    if limit is None:
        mi: dict[str, int] = {}
        for line in (read_text("/proc/meminfo") or "").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                mi[parts[0].rstrip(":")] = int(parts[1]) * 1024
        limit = mi.get("MemTotal")
        if used is None and limit is not None:
            used = limit - mi.get("MemAvailable", mi.get("MemFree", 0))
        source += " (no cgroup limit)" if source != "meminfo" else ""
    pct = round(100.0 * used / limit, 1) if used is not None and limit else None
    return {"source": source, "used_bytes": used, "limit_bytes": limit, "used_pct": pct, "oom_kill": oom}


def cpu_quota_cores() -> float | None:
    v2, dirs = _cgroup_paths()
    d = dirs.get("cpu", "")
    if v2:
        parts = (read_text(os.path.join(d, "cpu.max")) or "").split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
            return int(parts[0]) / float(parts[1])
        return None
    quota = _read_int(os.path.join(d, "cpu.cfs_quota_us"))
    period = _read_int(os.path.join(d, "cpu.cfs_period_us"))
    if quota is not None and quota > 0 and period:
        return quota / float(period)
    return None


def thread_cap(total_slots: int) -> int:
    quota = cpu_quota_cores()
    cores = int(quota) if quota is not None else (os.cpu_count() or 1)
    return max(1, cores // max(1, total_slots))


def disk_info(path: str) -> dict[str, Any]:
    try:
        st = os.statvfs(path)
    except OSError:
        return {"path": path, "total_bytes": None, "free_bytes": None, "used_pct": None,
                "inodes_total": None, "inodes_free": None, "inodes_used_pct": None}
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used_pct = round(100.0 * (total - st.f_bfree * st.f_frsize) / total, 1) if total else None
    ipct = round(100.0 * (st.f_files - st.f_ffree) / st.f_files, 1) if st.f_files else 0.0
    return {"path": path, "total_bytes": total, "free_bytes": free, "used_pct": used_pct,
            "inodes_total": st.f_files, "inodes_free": st.f_ffree, "inodes_used_pct": ipct}


def detect_slots(cpu_slots: int | None) -> dict[str, Any]:
    gpus = query_gpus()
    if gpus:
        return {"kind": "gpu", "ids": [g["index"] for g in gpus]}
    n = cpu_slots if cpu_slots and cpu_slots > 0 else (os.cpu_count() or 1)
    return {"kind": "cpu", "ids": list(range(n))}


# --- exit records ---------------------------------------------------------------------------------


def exit_record(job_id: str, attempt: int, wrapper_code: int, phase: str, message: str,
                started_at: float | None = None, trainer_code: int | None = None,
                sig: int | None = None, heartbeat: Any = None,
                best_sha256: str | None = None) -> dict[str, Any]:
    hb = heartbeat if isinstance(heartbeat, dict) else {}
    now = time.time()
    return {"job_id": job_id, "attempt": attempt, "wrapper_code": wrapper_code,
            "trainer_code": trainer_code, "signal": sig, "phase": phase,
            "started_at": utc(started_at if started_at is not None else now), "ended_at": utc(now),
            "last_step": hb.get("step"), "last_epoch": hb.get("epoch"), "best_sha256": best_sha256,
            "durable": "disabled", "message": message}


# --- serve ----------------------------------------------------------------------------------------


class Running:
    def __init__(self, job_id: str, attempt: int, slots: list[int], spec: dict[str, Any],
                 pid: int | None, rec: dict[str, Any] | None) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.slots = slots
        self.spec = spec
        self.pid = pid  # our child (waitpid) or None when adopted (liveness polling)
        self.rec = rec  # {"pgid","start_ticks","boot_id"}
        self.kill_at: float | None = None  # SIGKILL deadline once a cancel was acted on
        self.killed = False


class Agent:
    def __init__(self, lay: Layout, args: argparse.Namespace, notify_fd: int | None = None) -> None:
        self.lay = lay
        self.idle_exit_s = float(args.idle_exit_s)
        self.poll_s = float(args.poll_s)
        self.cpu_slots = args.cpu_slots
        self.notify_fd = notify_fd
        self.lock_fd: int | None = None
        self.slots: dict[str, Any] = {}
        self.busy: dict[int, str] = {}  # slot id -> job id
        self.running: dict[str, Running] = {}
        self.by_pid: dict[int, str] = {}
        self.pending: list[str] = []  # claimed, never launched (found at start-up)
        self.stop = False
        self.host = socket.gethostname()
        self.queue_of: dict[str, str] = {}
        self.queues_open: dict[str, bool] = {}
        self.wake_r, self.wake_w = os.pipe()

    # lock and pid file
    def try_lock(self) -> bool:
        fd = os.open(self.lay.p(P.AGENT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.lock_fd = fd
        return True

    def release_lock(self) -> None:
        if self.lock_fd is not None:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self.lock_fd)
                self.lock_fd = None

    def write_pid(self) -> None:
        pid = os.getpid()
        atomic_write_json(self.lay.p(P.AGENT_PID), {
            "pid": pid, "pgid": os.getpgrp(), "start_ticks": start_ticks(pid), "boot_id": boot_id(),
            "started_at": utc(), "protocol": P.PROTOCOL_VERSION,
            "slots": {"kind": self.slots["kind"], "ids": self.slots["ids"]}})

    def remove_pid(self) -> None:
        rec = read_json(self.lay.p(P.AGENT_PID))
        if isinstance(rec, dict) and rec.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(self.lay.p(P.AGENT_PID))

    def notify(self, msg: str) -> None:
        if self.notify_fd is not None:
            try:
                os.write(self.notify_fd, (msg + "\n").encode())
                os.close(self.notify_fd)
            except OSError:
                pass
            self.notify_fd = None

    def log(self, msg: str) -> None:
        self.lay.log(f"[{utc()}] {msg}")

    # main
    def serve(self) -> int:
        lay = self.lay
        mkdirs(lay.root, lay.p(P.INBOX_DIR), lay.p(P.CLAIMED_DIR), lay.p(P.WITHDRAWN_DIR),
               lay.p(P.JOBS_DIR), lay.p(P.CACHE_DIR))
        if not self.try_lock():
            rec = read_json(lay.p(P.AGENT_PID))
            pid = rec.get("pid") if isinstance(rec, dict) else "?"
            msg = f"agent already running (pid {pid})"
            print(msg, flush=True)
            self.notify(f"held {pid}")
            return 0
        self.slots = detect_slots(self.cpu_slots)
        self.write_pid()
        for fd in (self.wake_r, self.wake_w):
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.log("agent %d started on %s: %d %s slots %s, protocol %s" % (
            os.getpid(), self.host, len(self.slots["ids"]), self.slots["kind"], self.slots["ids"],
            P.PROTOCOL_VERSION))
        self.notify("ok %d" % os.getpid())
        self.recover()
        try:
            return self.loop()
        finally:
            self.remove_pid()
            self.release_lock()

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop = True

    def recover(self) -> None:
        """Restart safety: adopt live groups, leave dead attempts dead, launch claimed-unlaunched."""
        lay = self.lay
        for job_id in list_specs(lay.p(P.CLAIMED_DIR)):
            spec = read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))
            if not isinstance(spec, dict):
                continue
            n = spec_attempt(spec)
            if os.path.exists(lay.attempt(job_id, n, P.EXIT_FILE)):
                continue
            launch = read_json(lay.attempt(job_id, n, P.LAUNCH_FILE))
            rec = read_json(lay.attempt(job_id, n, P.PGID_FILE))
            if launch is None and not os.path.exists(lay.attempt(job_id, n, P.LAUNCH_FILE)):
                self.pending.append(job_id)
                continue
            if rec is None:
                rec = self._find_wrapper(job_id, n)
            if rec is not None and group_alive(rec):
                slots = [s for s in (launch or {}).get("slots", []) if s in self.slots["ids"]]
                r = Running(job_id, n, slots, spec, None, rec)
                self.running[job_id] = r
                for s in slots:
                    self.busy[s] = job_id
                self.log("ADOPTED %s a%d pgid %s slots %s" % (job_id, n, rec.get("pgid"), slots))
            else:
                self.log("DEAD %s a%d: launched, group gone, no exit.json (not re-run)" % (job_id, n))

    def _find_wrapper(self, job_id: str, n: int) -> dict[str, Any] | None:
        """The agent died between spawning a wrapper and its pgid record: find it by exact argv."""
        want = ["--root", self.lay.root, "wrap", job_id, str(n)]
        for name in os.listdir("/proc"):
            if name.isdigit():
                argv = proc_cmdline(int(name))
                if argv[-5:] == want and any(a.endswith("gpuq_agent.py") for a in argv):
                    pid = int(name)
                    return {"pgid": pid, "start_ticks": start_ticks(pid), "boot_id": boot_id()}
        return None

    def free_slots(self) -> list[int]:
        return [s for s in self.slots["ids"] if s not in self.busy]

    def loop(self) -> int:
        idle_since: float | None = None
        while not self.stop:
            try:
                self.reap()
                self.watch_adopted()
                self.handle_cancels()
                inbox = self.claim_and_launch()
            except Exception:  # one bad round (disk full, odd file) must not end the agent
                import traceback
                self.log("agent round failed:\n" + traceback.format_exc())
                time.sleep(1.0)
                continue
            if inbox or self.pending or self.running:
                idle_since = None
            else:
                now = time.time()
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.idle_exit_s:
                    if self.idle_exit():
                        return 0
                    idle_since = None
            try:
                select.select([self.wake_r], [], [], self.poll_s)
                while True:
                    os.read(self.wake_r, 4096)
            except (OSError, ValueError):
                pass
        self.log("agent %d stopping on signal; %d groups keep running" % (os.getpid(), len(self.running)))
        return 0

    def idle_exit(self) -> bool:
        """Race-free against a controller adding a job: drop pid + lock, then look again."""
        self.remove_pid()
        self.release_lock()
        if not list_specs(self.lay.p(P.INBOX_DIR)):
            self.log("agent %d idle for %gs: exiting" % (os.getpid(), self.idle_exit_s))
            return True
        if not self.try_lock():
            self.log("agent %d: job arrived during idle exit, another agent took over" % os.getpid())
            return True
        self.write_pid()
        return False

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job_id = self.by_pid.pop(pid, None)
            if job_id is None or job_id not in self.running:
                continue
            r = self.running[job_id]
            path = self.lay.attempt(job_id, r.attempt, P.EXIT_FILE)
            if not os.path.exists(path):
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    code, msg = 128 + sig, "wrapper killed by signal %d before writing exit.json" % sig
                else:
                    code = os.WEXITSTATUS(status) or P.EXIT_SETUP
                    sig = None
                    msg = "wrapper exited %d without writing exit.json" % os.WEXITSTATUS(status)
                hb = read_json(self.lay.attempt(job_id, r.attempt, P.HEARTBEAT_FILE))
                started = _mtime(self.lay.attempt(job_id, r.attempt, P.LAUNCH_FILE))
                atomic_write_json(path, exit_record(job_id, r.attempt, code, "train", msg,
                                                    started_at=started, sig=sig, heartbeat=hb))
                self.log("FINISHED %s a%d (exit=%d) %s" % (job_id, r.attempt, code, msg))
            # anything the wrapper left in its group goes with it
            if r.rec and r.rec.get("pgid") == pid and group_alive(r.rec):
                signal_group(pid, signal.SIGKILL)
            self.finish(job_id)

    def finish(self, job_id: str) -> None:
        r = self.running.pop(job_id, None)
        if r is None:
            return
        for s in r.slots:
            if self.busy.get(s) == job_id:
                del self.busy[s]
        self.queue_done_check(str(r.spec.get("queue_id", "")))

    def watch_adopted(self) -> None:
        for job_id, r in list(self.running.items()):
            if r.pid is not None:
                continue
            if group_alive(r.rec):
                continue
            if os.path.exists(self.lay.attempt(job_id, r.attempt, P.EXIT_FILE)):
                self.log("adopted %s a%d exited" % (job_id, r.attempt))
            else:
                self.log("DEAD %s a%d: adopted group gone, no exit.json (not re-run)" % (job_id, r.attempt))
            self.finish(job_id)

    def handle_cancels(self) -> None:
        now = time.time()
        for job_id, r in list(self.running.items()):
            if r.kill_at is None:
                if not os.path.exists(self.lay.job(job_id, P.CANCEL_FILE)):
                    continue
                if not r.rec or not group_alive(r.rec):
                    continue
                grace = float(r.spec.get("kill_grace_s", P.DEFAULT_KILL_GRACE_S) or 0)
                self.log("CANCEL %s a%d: TERM to group %d, KILL in %.0fs" % (
                    job_id, r.attempt, r.rec["pgid"], grace))
                signal_group(r.rec["pgid"], signal.SIGTERM)
                r.kill_at = now + grace
            elif not r.killed and now >= r.kill_at:
                if group_alive(r.rec):
                    signal_group(r.rec["pgid"], signal.SIGKILL)
                r.killed = True

    # claiming
    def _fail(self, job_id: str, spec: Any, code: int, msg: str) -> None:
        n = spec_attempt(spec)
        adir = self.lay.attempt(job_id, n)
        mkdirs(adir)
        if isinstance(spec, dict):
            atomic_write_json(self.lay.job(job_id, P.SPEC_FILE), spec)
        atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(job_id, n, code, "setup", msg))
        self.log("FAILED %s a%d (exit=%d): %s" % (job_id, n, code, msg))

    def _claim(self, job_id: str) -> bool:
        try:
            os.rename(self.lay.p(P.INBOX_DIR, job_id + ".json"), self.lay.p(P.CLAIMED_DIR, job_id + ".json"))
            return True
        except FileNotFoundError:
            return False  # withdrawn by the controller, or taken by someone else

    def claim_and_launch(self) -> int:
        lay = self.lay
        total = len(self.slots["ids"])
        # claimed but never launched (found at start-up) go first
        for job_id in list(self.pending):
            spec = read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))
            if not isinstance(spec, dict):
                self.pending.remove(job_id)
                continue
            need = self._need(spec)
            if need > total:
                self.pending.remove(job_id)
                self._fail(job_id, spec, P.EXIT_SETUP, self._too_big(need, total))
            elif need <= len(self.free_slots()):
                self.pending.remove(job_id)
                self.launch(job_id, spec, need)
        names = list_specs(lay.p(P.INBOX_DIR))
        if not names:
            return 0
        entries = []
        for job_id in names:
            spec = read_json(lay.p(P.INBOX_DIR, job_id + ".json"))
            created = spec.get("created_at", 0) if isinstance(spec, dict) else 0
            try:
                created = float(created)
            except (TypeError, ValueError):
                created = 0.0
            entries.append((created, job_id, spec))
        entries.sort(key=lambda e: (e[0], e[1]))
        left = 0
        for _created, job_id, spec in entries:
            if not isinstance(spec, dict):
                if self._claim(job_id):
                    self._fail(job_id, None, P.EXIT_SETUP, "job spec is not a JSON object")
                continue
            major = spec_major(spec.get("schema"))
            if major is None:
                if self._claim(job_id):
                    self._fail(job_id, spec, P.EXIT_SETUP,
                               "job spec has no valid schema (%r); this agent reads %s"
                               % (spec.get("schema"), P.SPEC_SCHEMA))
                continue
            if major > (spec_major(P.SPEC_SCHEMA) or 1):
                if self._claim(job_id):
                    self._fail(job_id, spec, P.EXIT_SETUP,
                               "job spec schema %s is newer than this agent (%s); upgrade the bundle"
                               % (spec.get("schema"), P.SPEC_SCHEMA))
                continue
            need = self._need(spec)
            if need > total:
                if self._claim(job_id):
                    self._fail(job_id, spec, P.EXIT_SETUP, self._too_big(need, total))
                continue
            if need > len(self.free_slots()):
                left += 1
                continue  # waits; a smaller job behind it may backfill
            if self._claim(job_id):
                self.queue_of[job_id] = str(spec.get("queue_id", ""))
                self.launch(job_id, spec, need)
        return left

    @staticmethod
    def _need(spec: dict[str, Any]) -> int:
        try:
            return max(1, int(spec.get("gpus", 1) or 1))
        except (TypeError, ValueError):
            return 1

    def _too_big(self, need: int, total: int) -> str:
        return "job needs %d slots and the host has %d (%s)" % (need, total, self.slots["kind"])

    def _queue_pos(self, job_id: str, qid: str) -> tuple[int, int]:
        claimed = list_specs(self.lay.p(P.CLAIMED_DIR))
        mine = 0
        for j in claimed:
            if j not in self.queue_of:
                s = read_json(self.lay.p(P.CLAIMED_DIR, j + ".json"))
                self.queue_of[j] = str(s.get("queue_id", "")) if isinstance(s, dict) else ""
            if self.queue_of[j] == qid:
                mine += 1
        waiting = 0
        for j in list_specs(self.lay.p(P.INBOX_DIR)):
            s = read_json(self.lay.p(P.INBOX_DIR, j + ".json"))
            if isinstance(s, dict) and str(s.get("queue_id", "")) == qid:
                waiting += 1
        return mine, mine + waiting

    def queue_done_check(self, qid: str) -> None:
        if not qid or not self.queues_open.get(qid):
            return
        if any(str(r.spec.get("queue_id", "")) == qid for r in self.running.values()):
            return
        for j in list_specs(self.lay.p(P.INBOX_DIR)):
            s = read_json(self.lay.p(P.INBOX_DIR, j + ".json"))
            if isinstance(s, dict) and str(s.get("queue_id", "")) == qid:
                return
        failed, n = [], 0
        for j in list_specs(self.lay.p(P.CLAIMED_DIR)):
            if self.queue_of.get(j) != qid:
                continue
            s = read_json(self.lay.p(P.CLAIMED_DIR, j + ".json")) or {}
            n += 1
            ex = read_json(self.lay.attempt(j, spec_attempt(s), P.EXIT_FILE))
            if not isinstance(ex, dict) or ex.get("wrapper_code") != 0:
                failed.append(str(s.get("name", j)))
        self.queues_open[qid] = False
        if failed:
            self.lay.log("=== gpuq queue %s done on %s: %d jobs FAILED: %s ===" % (
                qid, self.host, len(failed), " ".join(failed)))
        else:
            self.lay.log("=== gpuq queue %s done on %s: all %d jobs exited 0 ===" % (qid, self.host, n))

    def launch(self, job_id: str, spec: dict[str, Any], need: int) -> None:
        lay = self.lay
        n = spec_attempt(spec)
        adir = lay.attempt(job_id, n)
        if os.path.exists(os.path.join(adir, P.LAUNCH_FILE)):
            self.log("REFUSED %s a%d: attempt already launched once; never run twice" % (job_id, n))
            return
        mkdirs(adir, lay.job(job_id, P.CKPT_DIR), lay.job(job_id, P.RESULT_DIR))
        atomic_write_json(lay.job(job_id, P.SPEC_FILE), spec)
        qid = str(spec.get("queue_id", ""))
        self.queue_of[job_id] = qid
        if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
            atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(
                job_id, n, P.EXIT_SIGNAL_BASE + signal.SIGTERM, "setup", "cancelled before launch",
                sig=int(signal.SIGTERM)))
            self.log("CANCELLED %s a%d before launch" % (job_id, n))
            return
        slots = self.free_slots()[:need]
        idx, count = self._queue_pos(job_id, qid)
        if qid and not self.queues_open.get(qid):
            self.queues_open[qid] = True
            lay.log("=== gpuq queue %s on %s: %d jobs ===" % (qid, self.host, count))
        now = time.time()
        atomic_write_json(os.path.join(adir, P.LAUNCH_FILE), {
            "time": utc(now), "slots": slots, "kind": self.slots["kind"],
            "total_slots": len(self.slots["ids"]), "agent_pid": os.getpid(), "index": idx,
            "count": count})
        python = spec.get("python") or sys.executable
        argv = [python, AGENT_FILE, "--root", lay.root, "wrap", job_id, str(n)]
        try:
            logf = open(os.path.join(adir, P.JOB_LOG), "ab")  # noqa: SIM115 (handed to the child)
        except OSError as e:
            self._fail(job_id, spec, P.EXIT_SETUP, f"cannot open job.log: {e}")
            return
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    cwd=lay.root, start_new_session=True, close_fds=True)
        except OSError as e:
            logf.close()
            self._fail(job_id, spec, P.EXIT_SETUP, f"cannot start wrapper with {python}: {e}")
            return
        logf.close()
        proc.returncode = 0  # we reap with os.waitpid; keep Popen.__del__ from touching it
        rec = {"pgid": proc.pid, "start_ticks": start_ticks(proc.pid), "boot_id": boot_id()}
        if rec["start_ticks"] is not None and not os.path.exists(os.path.join(adir, P.PGID_FILE)):
            with contextlib.suppress(OSError):
                atomic_write_json(os.path.join(adir, P.PGID_FILE), rec)
        r = Running(job_id, n, slots, spec, proc.pid, rec)
        self.running[job_id] = r
        self.by_pid[proc.pid] = job_id
        for s in slots:
            self.busy[s] = job_id


def cmd_serve(lay: Layout, args: argparse.Namespace) -> int:
    if not args.detach:
        return Agent(lay, args).serve()
    os.makedirs(lay.root, exist_ok=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # first child: new session, fork again, leave
        try:
            os.close(r)
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            os.setpgid(0, 0)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            os.chdir(lay.root)
            dn = os.open(os.devnull, os.O_RDONLY)
            out = os.open(lay.p(P.AGENT_OUT), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(dn, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(dn)
            os.close(out)
            sys.stdin = open(os.devnull)  # noqa: SIM115
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            code = Agent(lay, args, notify_fd=w).serve()
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    buf = b""
    deadline = time.time() + 60
    while time.time() < deadline:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.time()))
        if not ready:
            break
        chunk = os.read(r, 256)
        if not chunk:
            break
        buf += chunk
    os.close(r)
    words = buf.decode(errors="replace").split()
    if len(words) >= 2 and words[0] == "ok":
        print(f"agent started (pid {words[1]})")
        return 0
    if len(words) >= 2 and words[0] == "held":
        print(f"agent already running (pid {words[1]})")
        return 0
    print(f"agent failed to start; see {lay.p(P.AGENT_OUT)}", file=sys.stderr)
    return 1


# --- wrap -----------------------------------------------------------------------------------------


class Wrapper:
    def __init__(self, lay: Layout, job_id: str, attempt: int) -> None:
        self.lay = lay
        self.job_id = job_id
        self.attempt = attempt
        self.jdir = lay.job(job_id)
        self.adir = lay.attempt(job_id, attempt)
        self.started = time.time()
        self.phase = "setup"
        self.spec: dict[str, Any] = {}
        self.trainer: subprocess.Popen | None = None
        self.got_signal: int | None = None
        self.sig_at: float | None = None
        self.done = threading.Event()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.got_signal is None:
            self.got_signal = signum
            self.sig_at = time.time()
            if self.trainer is not None and self.trainer.poll() is None:
                with contextlib.suppress(OSError):
                    self.trainer.send_signal(signum)

    def marker(self, word: str, extra: str) -> None:
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        s = self.spec
        self.lay.log("[%s] [%s/%s] %s %s %s a%d %s" % (
            utc(), launch.get("index", "?"), launch.get("count", "?"), word, s.get("name", "?"),
            self.job_id, self.attempt, extra))

    def finish(self, code: int, message: str, trainer_code: int | None = None,
               sig: int | None = None) -> int:
        hb = read_json(os.path.join(self.adir, P.HEARTBEAT_FILE))
        best = sha256_file(os.path.join(self.jdir, P.CKPT_DIR, P.BEST_CKPT))
        rec = exit_record(self.job_id, self.attempt, code, self.phase, message, started_at=self.started,
                          trainer_code=trainer_code, sig=sig, heartbeat=hb, best_sha256=best)
        atomic_write_json(os.path.join(self.adir, P.EXIT_FILE), rec)
        self.done.set()
        self.marker("FINISHED", "(exit=%d)" % code)
        return code

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if not os.path.isdir(self.adir):
            print(f"gpuq wrap: no attempt directory {self.adir}", file=sys.stderr)
            return P.EXIT_SETUP
        me = os.getpid()
        become_subreaper()
        atomic_write_json(os.path.join(self.adir, P.PGID_FILE),
                          {"pgid": os.getpgrp(), "start_ticks": start_ticks(me), "boot_id": boot_id()})
        spec = read_json(os.path.join(self.jdir, P.SPEC_FILE))
        if not isinstance(spec, dict):
            return self.finish(P.EXIT_SETUP, "spec.json missing or unreadable")
        self.spec = spec
        self.marker("STARTING", "({}, {}ep)".format(spec.get("task"), spec.get("epochs")))
        try:
            return self._run(spec)
        except Exception as e:  # a wrapper bug must still leave an exit record
            import traceback
            traceback.print_exc()
            if self.trainer is not None and self.trainer.poll() is None:
                self.trainer.kill()
            return self.finish(P.EXIT_SETUP if self.phase in ("setup", "gate") else 1,
                               f"wrapper error in phase {self.phase}: {e!r}")

    def build_env(self, spec: dict[str, Any], launch: dict[str, Any]) -> dict[str, str]:
        lay, sha = self.lay, str(spec.get("bundle_sha", ""))
        workdir = lay.p(P.BUNDLES_DIR, sha, P.BUNDLE_WORKDIR)
        kind = launch.get("kind", "cpu")
        slots = launch.get("slots") or []
        resume = spec.get("resume_from")
        if resume is None:
            resume = ""
        elif not isinstance(resume, str):
            resume = json.dumps(resume, sort_keys=True)
        env: dict[str, str] = {}
        for k, v in (spec.get("env") or {}).items():
            env[str(k)] = str(v)
        threads = str(thread_cap(int(launch.get("total_slots") or len(slots) or 1)))
        env.update({
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", threads),
            "MKL_NUM_THREADS": env.get("MKL_NUM_THREADS", threads),
            "HF_HOME": lay.p(P.CACHE_DIR, "huggingface"),
            "PIP_CACHE_DIR": lay.p(P.CACHE_DIR, "pip"),
            P.ENV_JOB_ID: self.job_id,
            P.ENV_JOB_NAME: str(spec.get("name", "")),
            P.ENV_QUEUE_ID: str(spec.get("queue_id", "")),
            P.ENV_ATTEMPT: str(self.attempt),
            P.ENV_CONFIG: os.path.join(workdir, str(spec.get("config", ""))),
            P.ENV_TASK: str(spec.get("task", "")),
            P.ENV_EPOCHS: str(spec.get("epochs", "")),
            P.ENV_CKPT_DIR: os.path.join(self.jdir, P.CKPT_DIR),
            P.ENV_RESULT_DIR: os.path.join(self.jdir, P.RESULT_DIR),
            P.ENV_LOG: os.path.join(self.adir, P.JOB_LOG),
            P.ENV_HEARTBEAT: os.path.join(self.adir, P.HEARTBEAT_FILE),
            P.ENV_HEARTBEAT_S: str(spec.get("heartbeat_s") or P.DEFAULT_HEARTBEAT_S),
            P.ENV_RESUME_FROM: resume,
            P.ENV_CKPT_INTERVAL_S: str(spec.get("ckpt_interval_s") or P.DEFAULT_CKPT_INTERVAL_S),
            P.ENV_DURABLE_DIR: str(spec.get("durable_dir") or ""),
            P.ENV_SPEC_HASH: str(spec.get("spec_hash", "")),
            P.ENV_BUNDLE_SHA: sha,
            P.ENV_DEVICE: "cuda" if kind == "gpu" else "cpu",
            P.ENV_EXIT_FILE: os.path.join(self.adir, P.TRAINER_EXIT_FILE),
        })
        env.pop(P.ENV_SEED, None)
        if spec.get("seed") is not None:
            env[P.ENV_SEED] = str(spec["seed"])
        if kind == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.pop("CUDA_DEVICE_ORDER", None)
        return env

    def _run(self, spec: dict[str, Any]) -> int:
        lay = self.lay
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        sha = str(spec.get("bundle_sha", ""))
        bundle = lay.p(P.BUNDLES_DIR, sha)
        workdir = os.path.join(bundle, P.BUNDLE_WORKDIR)
        entry = os.path.join(bundle, str(spec.get("entry") or P.TRAIN_ENTRY))
        run_env = self.build_env(spec, launch)
        atomic_write(os.path.join(self.adir, P.RUN_ENV_FILE),
                     "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(run_env.items())))
        env: dict[str, str] = {}
        for k in ("PATH", "HOME", "LANG", "USER", "TMPDIR"):
            if os.environ.get(k) is not None:
                env[k] = os.environ[k]
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(run_env)
        for d in (run_env["HF_HOME"], run_env["PIP_CACHE_DIR"], run_env[P.ENV_CKPT_DIR],
                  run_env[P.ENV_RESULT_DIR]):
            mkdirs(d)
        # setup checks
        if not sha or not os.path.isdir(bundle):
            return self.finish(P.EXIT_SETUP, f"bundle {sha} is not on this host")
        if not os.path.isfile(entry):
            return self.finish(P.EXIT_SETUP, "trainer entry %s not found in bundle %s"
                               % (spec.get("entry"), sha))
        python = sys.executable
        gpus = len(launch.get("slots") or []) or Agent._need(spec)
        if launch.get("kind") == "gpu":
            probe = ("import sys, torch; ok = torch.cuda.is_available() and "
                     "torch.cuda.device_count() == %d; sys.exit(0 if ok else 1)" % gpus)
            try:
                rc = subprocess.run([python, "-c", probe], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=300).returncode
            except (OSError, subprocess.SubprocessError):
                rc = 1
            if rc != 0:
                return self.finish(P.EXIT_SETUP, "torch.cuda does not see the %d assigned GPUs %s" % (
                    gpus, run_env.get("CUDA_VISIBLE_DEVICES")))
        # disk gate
        self.phase = "gate"
        ckpt = run_env[P.ENV_CKPT_DIR]
        for name in os.listdir(ckpt):
            if name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(ckpt, name))
        try:
            ckpt_bytes = os.path.getsize(os.path.join(ckpt, P.LATEST_CKPT))
        except OSError:
            ckpt_bytes = 0
        gb = 1e9
        need = max(float(spec.get("min_free_gb") or 0),
                   ckpt_bytes * 2 / gb + float(spec.get("scratch_gb") or 0))
        disk = disk_info(lay.root)
        have = (disk["free_bytes"] or 0) / gb
        ipct = disk["inodes_used_pct"] or 0.0
        if have < need or ipct >= INODE_LIMIT_PCT:
            line = f"DISK_GATE_ABORT need={need:.2f} have={have:.2f} inodes={ipct:.1f}"
            append_line(os.path.join(self.adir, P.JOB_LOG), line)
            self.lay.log("[%s] %s %s a%d" % (utc(), line, self.job_id, self.attempt))
            return self.finish(P.EXIT_DISK_GATE, line)
        # train
        self.phase = "train"
        args = ["--config", run_env[P.ENV_CONFIG], "--task", run_env[P.ENV_TASK],
                "--epochs", run_env[P.ENV_EPOCHS]]
        if spec.get("launcher", "torchrun") == "python":
            argv = [python, entry, *args]
        else:
            argv = [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                    "--nproc-per-node=%d" % gpus, entry, *args]
        log_path = os.path.join(self.adir, P.JOB_LOG)
        with open(log_path, "ab") as logf:
            logf.write(("=== gpuq %s a%d %s start %s cwd %s argv: %s ===\n" % (
                self.job_id, self.attempt, spec.get("name", ""), utc(), workdir,
                " ".join(shlex.quote(a) for a in argv))).encode())
            logf.flush()
            if self.got_signal is not None:
                return self.finish(P.EXIT_SIGNAL_BASE + self.got_signal, "signal %d before training started"
                                   % self.got_signal, sig=self.got_signal)
            self.trainer = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                            stderr=subprocess.STDOUT, env=env, close_fds=True,
                                            cwd=workdir if os.path.isdir(workdir) else bundle)
        sampler = threading.Thread(target=self.sample_memory, args=(self.trainer.pid,), name="gpuq-mem")
        sampler.daemon = True
        sampler.start()
        hb_s = float(spec.get("heartbeat_s") or P.DEFAULT_HEARTBEAT_S)
        grace = float(spec.get("kill_grace_s", P.DEFAULT_KILL_GRACE_S) or 0)
        alive_path = os.path.join(self.adir, P.WRAPPER_ALIVE)
        next_touch = 0.0
        killed_rest = False
        while True:
            now = time.time()
            if now >= next_touch:
                with contextlib.suppress(OSError):
                    touch(alive_path)
                next_touch = now + hb_s
            if self.sig_at is not None and not killed_rest and now - self.sig_at >= grace:
                self.kill_rest()
                killed_rest = True
            try:
                rc = self.trainer.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
        self.kill_rest()  # leftovers (workers, loaders) must not outlive the attempt
        self.done.set()
        if rc < 0:
            sig = -rc
            return self.finish(P.EXIT_SIGNAL_BASE + sig, "trainer killed by signal %d%s" % (
                sig, self._why()), trainer_code=rc, sig=sig)
        if rc != 0:
            told = read_json(os.path.join(self.adir, P.TRAINER_EXIT_FILE))
            if isinstance(told, dict) and isinstance(told.get("code"), int) and 0 < told["code"] < 256:
                # torchrun turns every worker failure into 1; the payload said what it meant
                code = told["code"]
                return self.finish(code, "trainer exited %d (rank %s exited %d)%s" % (
                    rc, told.get("rank"), code, self._why()), trainer_code=code)
            return self.finish(rc, "trainer exited %d%s" % (rc, self._why()), trainer_code=rc)
        self.phase = "finalize"
        problem = self.verify(spec, env)
        if problem:
            return self.finish(P.EXIT_FINALIZE, problem, trainer_code=0)
        return self.finish(P.EXIT_OK, "trained, artifacts verified", trainer_code=0)

    def _why(self) -> str:
        if os.path.exists(os.path.join(self.jdir, P.CANCEL_FILE)):
            return " (cancel requested)"
        if self.got_signal is not None:
            return " (wrapper got signal %d)" % self.got_signal
        return ""

    def kill_rest(self) -> None:
        """SIGKILL our group and every descendant (workers in other sessions included), then reap."""
        me = os.getpid()
        for pid in set(group_members(os.getpgrp())) | set(descendants(me)):
            if pid != me:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 2.0
        while time.time() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.02)

    def verify(self, spec: dict[str, Any], env: dict[str, str]) -> str:
        checks = spec.get("verify") or []
        if "metrics" in checks:
            path = os.path.join(self.jdir, P.RESULT_DIR, P.METRICS_FILE)
            try:
                with open(path, encoding="utf-8") as f:
                    lines = [ln for ln in f.read().splitlines() if ln.strip()]
            except OSError:
                return f"finalize: {path} missing"
            if not lines:
                return f"finalize: {path} is empty"
            for i, ln in enumerate(lines):
                try:
                    json.loads(ln)
                except ValueError:
                    return "finalize: %s line %d is not JSON" % (path, i + 1)
        if "best_ckpt" in checks:
            path = os.path.join(self.jdir, P.CKPT_DIR, P.BEST_CKPT)
            if not os.path.isfile(path):
                return f"finalize: {path} missing"
            code = ("import sys, torch\n"
                    "obj = torch.load(sys.argv[1], map_location='cpu', weights_only=True)\n"
                    "sys.exit(0 if isinstance(obj, dict) else 3)\n")
            try:
                rc = subprocess.run([sys.executable, "-c", code, path], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=900).returncode
            except (OSError, subprocess.SubprocessError) as e:
                return f"finalize: cannot check {path}: {e}"
            if rc != 0:
                return "finalize: %s does not load with weights_only=True as a dict (rc=%d)" % (path, rc)
        return ""

    def sample_memory(self, trainer_pid: int) -> None:
        path = os.path.join(self.adir, P.MEM_FILE)
        gpu = (read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}).get("kind") == "gpu"
        try:
            if not os.path.exists(path):
                append_line(path, "\t".join([
                    "time", "cg_used_bytes", "cg_limit_bytes", "cg_used_pct", "oom_kill", "cpu_pct",
                    "trainer_rss_bytes", "trainer_threads", "trainer_fds", "group_procs", "group_rss_bytes",
                    "gpus"]))
        except OSError:
            return
        last_cpu: tuple[float, float] | None = None
        page = os.sysconf("SC_PAGE_SIZE")
        tick = os.sysconf("SC_CLK_TCK")
        while not self.done.is_set():
            try:
                m = memory_info()
                members = group_members(os.getpgrp())
                rss_total, cpu_ticks = 0, 0.0
                for pid in members:
                    statm = (read_text("/proc/%d/statm" % pid) or "0 0").split()
                    rss_total += int(statm[1]) * page if len(statm) > 1 else 0
                    text = read_text("/proc/%d/stat" % pid) or ""
                    rest = text[text.rfind(")") + 2:].split()
                    if len(rest) > 12:
                        cpu_ticks += int(rest[11]) + int(rest[12])
                now = time.time()
                cpu_pct = ""
                if last_cpu is not None and now > last_cpu[0]:
                    dt = now - last_cpu[0]
                    cpu_pct = "%.1f" % max(0.0, 100.0 * (cpu_ticks - last_cpu[1]) / tick / dt)
                last_cpu = (now, cpu_ticks)
                tstat = read_text("/proc/%d/status" % trainer_pid) or ""
                t_rss = t_thr = ""
                for line in tstat.splitlines():
                    if line.startswith("VmRSS:"):
                        t_rss = str(int(line.split()[1]) * 1024)
                    elif line.startswith("Threads:"):
                        t_thr = line.split()[1]
                try:
                    t_fds = str(len(os.listdir("/proc/%d/fd" % trainer_pid)))
                except OSError:
                    t_fds = ""
                gpus = ""
                if gpu:
                    gpus = ";".join("{}:{}%:{}MiB".format(g["index"], g["util_pct"], g["mem_used_mib"])
                                    for g in query_gpus())
                fields = [utc(now), m["used_bytes"], m["limit_bytes"], m["used_pct"], m["oom_kill"], cpu_pct,
                          t_rss, t_thr, t_fds, len(members), rss_total, gpus]
                append_line(path, "\t".join("" if f is None else str(f) for f in fields))
            except Exception:  # the sampler must never take the attempt down
                pass
            self.done.wait(MEM_SAMPLE_S)


def cmd_wrap(lay: Layout, job_id: str, attempt: str) -> int:
    if not job_id or "/" in job_id or not attempt.isdigit():
        print(f"gpuq wrap: bad arguments {job_id!r} {attempt!r}", file=sys.stderr)
        return P.EXIT_SETUP
    return Wrapper(lay, job_id, int(attempt)).run()


# --- status ---------------------------------------------------------------------------------------


def agent_state(lay: Layout) -> tuple[dict[str, Any], Any]:
    rec = read_json(lay.p(P.AGENT_PID))
    if not isinstance(rec, dict):
        return {"alive": False, "pid": None}, None
    alive = leader_alive(rec.get("pid"), rec.get("start_ticks"), rec.get("boot_id"))
    return {"alive": alive, "pid": rec.get("pid")}, rec


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def job_entry(lay: Layout, job_id: str, where: str, now: float) -> dict[str, Any]:
    spec = read_json(lay.p(where, job_id + ".json"))
    spec = spec if isinstance(spec, dict) else {}
    n = spec_attempt(spec)
    e: dict[str, Any] = {"job_id": job_id, "name": spec.get("name"), "queue_id": spec.get("queue_id"),
                         "attempt": n, "state": None, "slots": None, "pgid": None, "group_alive": None,
                         "launched_at": None, "exit": None, "heartbeat": None, "heartbeat_age_s": None,
                         "log_bytes": None, "log_mtime": None, "ckpt": None,
                         "cancel_requested": os.path.exists(lay.job(job_id, P.CANCEL_FILE))}
    if where == P.INBOX_DIR:
        e["state"] = "queued"
        return e
    if where == P.WITHDRAWN_DIR:
        e["state"] = "withdrawn"
        return e
    adir = lay.attempt(job_id, n)
    launch = read_json(os.path.join(adir, P.LAUNCH_FILE))
    rec = read_json(os.path.join(adir, P.PGID_FILE))
    ex = read_json(os.path.join(adir, P.EXIT_FILE))
    hb = read_json(os.path.join(adir, P.HEARTBEAT_FILE))
    hb_m = _mtime(os.path.join(adir, P.HEARTBEAT_FILE))
    log_p = os.path.join(adir, P.JOB_LOG)
    try:
        st = os.stat(log_p)
        e["log_bytes"], e["log_mtime"] = st.st_size, st.st_mtime
    except OSError:
        pass
    ck = read_json(lay.job(job_id, P.CKPT_DIR, P.LATEST_POINTER))
    if isinstance(ck, dict):
        ck = dict(ck)
        ck["mtime"] = _mtime(lay.job(job_id, P.CKPT_DIR, P.LATEST_POINTER))
    e["ckpt"] = ck
    e["heartbeat"] = hb if isinstance(hb, dict) else None
    e["heartbeat_age_s"] = round(now - hb_m, 1) if hb_m is not None else None
    e["exit"] = ex if isinstance(ex, dict) else None
    if isinstance(launch, dict):
        e["slots"] = launch.get("slots")
        e["launched_at"] = launch.get("time")
    if isinstance(rec, dict):
        e["pgid"] = rec.get("pgid")
        e["group_alive"] = group_alive(rec)
    if e["exit"] is not None:
        e["state"] = "exited"
    elif launch is None and not os.path.exists(os.path.join(adir, P.LAUNCH_FILE)):
        e["state"] = "claimed"
    elif e["group_alive"]:
        e["state"] = "running"
    elif rec is None and now - (_mtime(os.path.join(adir, P.LAUNCH_FILE)) or 0) < LAUNCH_PGID_GRACE_S:
        e["state"] = "claimed"  # launching: the wrapper has not recorded its group yet
    else:
        e["state"] = "dead"
    return e


def cmd_status(lay: Layout, args: argparse.Namespace) -> int:
    now = time.time()
    agent, rec = agent_state(lay)
    gpus = query_gpus()
    if isinstance(rec, dict) and isinstance(rec.get("slots"), dict):
        kind = rec["slots"].get("kind", "cpu")
        total = len(rec["slots"].get("ids") or [])
    elif gpus:
        kind, total = "gpu", len(gpus)
    else:
        kind, total = "cpu", os.cpu_count() or 1
    seen: dict[str, str] = {}
    for where in (P.WITHDRAWN_DIR, P.INBOX_DIR, P.CLAIMED_DIR):  # later wins: claimed > inbox > withdrawn
        for job_id in list_specs(lay.p(where)):
            seen[job_id] = where
    jobs = [job_entry(lay, j, w, now) for j, w in sorted(seen.items())]
    used = sum(len(j["slots"] or []) for j in jobs if j["state"] == "running")
    uptime = None
    up = (read_text("/proc/uptime") or "").split()
    if up:
        with contextlib.suppress(ValueError):
            uptime = float(up[0])
    try:
        bundles = sorted(n for n in os.listdir(lay.p(P.BUNDLES_DIR)) if not n.startswith("."))
    except OSError:
        bundles = []
    doc = {"schema": P.STATUS_SCHEMA, "protocol": P.PROTOCOL_VERSION, "hostname": socket.gethostname(),
           "root": lay.root, "time": utc(now), "boot_id": boot_id(), "uptime_s": uptime, "agent": agent,
           "slots": {"kind": kind, "total": total, "free": max(0, total - used)},
           "gpus": gpus, "disk": disk_info(lay.root), "memory": memory_info(), "bundles": bundles,
           "jobs": jobs}
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return 0


# --- cancel ---------------------------------------------------------------------------------------


def _withdraw(lay: Layout, job_id: str) -> bool:
    inbox = lay.p(P.INBOX_DIR, job_id + ".json")
    if not os.path.exists(inbox):
        return False
    mkdirs(lay.p(P.WITHDRAWN_DIR))
    try:
        os.rename(inbox, lay.p(P.WITHDRAWN_DIR, job_id + ".json"))
        return True
    except FileNotFoundError:
        return False  # the agent claimed it a moment ago: cancel it where it is now


def _kill_claimed(lay: Layout, job_id: str) -> str:
    spec = read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    spec = spec if isinstance(spec, dict) else {}
    n = spec_attempt(spec)
    rec = read_json(lay.attempt(job_id, n, P.PGID_FILE))
    if not isinstance(rec, dict) or not group_alive(rec):
        return "not running"
    pgid = rec["pgid"]
    leader = proc_stat(pgid)
    if leader is not None and leader[0] not in ("Z", "X") and (
            leader[2] != rec.get("start_ticks") or job_id not in " ".join(proc_cmdline(pgid))):
        return "not running (recorded group %d failed the identity check; nothing killed)" % pgid
    grace = float(spec.get("kill_grace_s", P.DEFAULT_KILL_GRACE_S) or 0)
    signal_group(pgid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and group_alive(rec):
        time.sleep(0.1)
    if group_alive(rec):
        signal_group(pgid, signal.SIGKILL)
    return "killed"


def cmd_cancel(lay: Layout, job_ids: list[str]) -> int:
    """Three phases, so cancelling many jobs never lets a freed slot start one of them:
    withdraw every job still in the inbox; mark every claimed one; only then kill."""
    for job_id in job_ids:
        if not job_id or "/" in job_id or job_id.startswith("."):
            print(f"gpuq cancel: bad job id {job_id!r}", file=sys.stderr)
            return 1
    verdicts: dict[str, str] = {}
    for job_id in job_ids:
        if _withdraw(lay, job_id):
            verdicts[job_id] = "withdrawn"
    unknown = []
    for job_id in job_ids:
        if job_id in verdicts:
            continue
        if not os.path.exists(lay.p(P.CLAIMED_DIR, job_id + ".json")):
            unknown.append(job_id)
            continue
        mkdirs(lay.job(job_id))
        touch(lay.job(job_id, P.CANCEL_FILE))
    for job_id in job_ids:
        if job_id not in verdicts and job_id not in unknown:
            verdicts[job_id] = _kill_claimed(lay, job_id)
    for job_id in unknown:
        print(f"gpuq cancel: unknown job {job_id} (not in inbox/ or claimed/ under {lay.root})",
              file=sys.stderr)
    for job_id in job_ids:
        if job_id in verdicts:
            print(verdicts[job_id] if len(job_ids) == 1 else "%s %s" % (job_id, verdicts[job_id]))
    return 1 if unknown else 0


# --- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuq_agent.py", description="gpuq host agent")
    ap.add_argument("--root", required=True, help="GPUQ_ROOT: the host's data dir")
    sub = ap.add_subparsers(dest="cmd")
    sp = sub.add_parser("serve", help="run the host agent (one per root)")
    sp.add_argument("--idle-exit-s", type=float, default=600.0)
    sp.add_argument("--cpu-slots", type=int, default=None)
    sp.add_argument("--poll-s", type=float, default=0.1)
    sp.add_argument("--detach", action="store_true", help="double-fork, setsid, log to agent.out")
    wp = sub.add_parser("wrap", help="internal: run one attempt")
    wp.add_argument("job_id")
    wp.add_argument("attempt")
    st = sub.add_parser("status", help="read-only probe")
    st.add_argument("--json", action="store_true")
    cp = sub.add_parser("cancel", help="withdraw or kill a job")
    cp.add_argument("job_ids", nargs="+")
    sub.add_parser("version", help="print the protocol version")
    ep = sub.add_parser("enqueue", help="write job specs (JSON list on stdin) into the inbox, idempotently")
    ep.add_argument("--serve", action="store_true", help="then make sure a detached agent runs")
    ep.add_argument("--idle-exit-s", type=float, default=600.0)
    ep.add_argument("--cpu-slots", type=int, default=None)
    ep.add_argument("--poll-s", type=float, default=0.1)
    co = sub.add_parser("collect", help="summaries and hashed result files of finished jobs")
    co.add_argument("job_ids", nargs="+")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return P.AGENT_EXIT_USAGE if e.code else 0
    lay = Layout(args.root)
    if args.cmd == "serve":
        return cmd_serve(lay, args)
    if args.cmd == "wrap":
        return cmd_wrap(lay, args.job_id, args.attempt)
    if args.cmd == "status":
        return cmd_status(lay, args)
    if args.cmd == "cancel":
        return cmd_cancel(lay, args.job_ids)
    if args.cmd == "version":
        print(P.PROTOCOL_VERSION)
        return 0
    if args.cmd == "enqueue":
        import gpuq_inbox

        code = gpuq_inbox.cmd_enqueue(lay.root, sys.stdin)
        if code != 0 or not args.serve:
            return code
        args.detach = True
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the verdict JSON
            return cmd_serve(lay, args)
    if args.cmd == "collect":
        import gpuq_inbox

        return gpuq_inbox.cmd_collect(lay.root, args.job_ids)
    ap.print_usage(sys.stderr)
    return P.AGENT_EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
