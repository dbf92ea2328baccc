"""Host facts: GPUs (nvidia-smi), the container's memory and CPU quota (cgroup v1/v2), disk, slots.

stdlib only, Python >= 3.8.  Every probe degrades to "unknown" (None, [] or the machine's own
numbers) instead of raising: the status probe and the disk gate must answer on any host.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Callable

from gpuq_base.gpuq_files import atomic_write_json, read_json, read_text
from gpuq_base.gpuq_procs import helper_env

NVSMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu",
    "--format=csv,noheader,nounits",
]


def query_gpus() -> list[dict[str, Any]]:
    try:
        out = subprocess.run(NVSMI_QUERY, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=15, text=True, env=helper_env())
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
    """(is_v2, controller -> directory) for this process, per docs/health.md (memory)."""
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


CPU_SLOTS_FILE = "cpu_slots.json"  # {"slots": N}: the CPU slots the controller last asked for (--cpu-slots)


def write_cpu_slots(root: str, n: int | None) -> None:
    """What ``serve``/``enqueue --serve --cpu-slots N`` asks for, kept where a running agent reads it
    (``GPUQ_LOCAL_CPU_SLOTS`` changed while an agent serves); unchanged or not given: no write."""
    path = os.path.join(root, CPU_SLOTS_FILE)
    if n and n > 0 and read_json(path) != {"slots": n} and os.path.isdir(root):
        atomic_write_json(path, {"slots": n})


def reslot(root: str, slots: dict[str, Any], log: Callable[[str], None],
           record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The CPU slots to serve now: those cpu_slots.json asks for when its count differs from ``slots``
    (then logged and ``record``-ed in agent.pid), else ``slots`` (GPU slots follow the GPUs, never the
    file).  Slot ids are 0..N-1: a job on a slot a smaller count drops keeps it until it ends, and no
    job starts there again."""
    if slots.get("kind") != "cpu":
        return slots
    doc = read_json(os.path.join(root, CPU_SLOTS_FILE))
    n = doc.get("slots") if isinstance(doc, dict) else None
    had = len(slots.get("ids") or [])
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= 4096 or n == had:
        return slots
    log(f"cpu slots {had} -> {n} (asked for by the controller)")
    asked = {"kind": "cpu", "ids": list(range(n))}
    record(asked)
    return asked
