"""The health preflight's rules (docs/health.md; the table in gpuq_health.py): one check's status,
"pass" | "warn" | "fail", and its human detail, from the GPUs' records, the kernel log's Xids, the
torch probe, the disk and /dev/shm.  Pure; unit-tested.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import re
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_verbs.gpuq_health_gpus import cuda_tuple, flag

TEMP_LIMIT_C = 83.0
CLOCK_MIN_FRACTION = 0.70  # of the MAXIMUM SM clock (clocks.max.sm), never the current application clock
BUSY_MIB = 1024.0
DISK_WARN_PCT = 90.0
INODE_FAIL_PCT = 95.0
INODE_WARN_PCT = 90.0
SHM_MIN_BYTES = 1 << 30
GIB = float(1 << 30)

RANK = {"pass": 0, "warn": 1, "fail": 2}
NO_GPUS = "no GPUs (cpu slots)"
DATA_CENTRE_RE = re.compile(r"\b(A100|A800|H100|H800|H200|GH200|B100|B200|GB200|A30|V100|P100)\b")


def worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: RANK[s]) if statuses else "pass"


def _fmt(v: Any) -> str:
    return "?" if v is None else "%g" % v


def check_throttle(gpus: list[dict[str, Any]]) -> tuple[str, str]:
    bad = ["GPU %d: %s Active" % (g["index"], ", ".join(g["throttle"])) for g in gpus if g["throttle"]]
    if bad:
        return "fail", "; ".join(bad) + " (throttling silently costs a large share of throughput)"
    return "pass", "no HW slowdown / HW thermal / HW power brake / SW thermal throttling on %d GPUs" % len(gpus)


def check_heat(gpus: list[dict[str, Any]]) -> tuple[str, str]:
    fails, warns = [], []
    for g in gpus:
        temp, clk, mx = g["temp_c"], g["sm_clock_mhz"], g["sm_clock_max_mhz"]
        peak = g.get("temp_max_c")
        if temp is None:
            temp = peak
        if temp is not None and temp >= TEMP_LIMIT_C:
            if clk is not None and mx and clk < CLOCK_MIN_FRACTION * mx:
                fails.append("GPU %d: %s C with SM clock %s of max %s MHz (%.0f%% < %.0f%%)" % (
                    g["index"], _fmt(temp), _fmt(clk), _fmt(mx), 100.0 * clk / mx, 100 * CLOCK_MIN_FRACTION))
            else:
                warns.append("GPU %d: %s C (SM clock %s of max %s MHz, not yet throttled)" % (
                    g["index"], _fmt(temp), _fmt(clk), _fmt(mx)))
        elif peak is not None and peak >= TEMP_LIMIT_C:
            warns.append("GPU %d: reached %s C while sampled (now %s C)" % (g["index"], _fmt(peak), _fmt(temp)))
    if fails:
        return "fail", "; ".join(fails + warns)
    if warns:
        return "warn", "; ".join(warns)
    temps = [g["temp_c"] for g in gpus if g["temp_c"] is not None]
    return "pass", "below %g C on %d GPUs%s" % (TEMP_LIMIT_C, len(gpus),
                                                  " (max %s C)" % _fmt(max(temps)) if temps else "")


def check_ecc(gpus: list[dict[str, Any]]) -> tuple[str, str]:
    fails, warns = [], []
    for g in gpus:
        i = g["index"]
        if g["ecc_uncorrected"]:
            fails.append("GPU %d: %s volatile uncorrectable ECC errors" % (i, _fmt(g["ecc_uncorrected"])))
        if g["retired_pages_pending"]:
            fails.append("GPU %d: page retirement pending (reset the GPU)" % i)
        if g["remapped_rows_failure"]:
            fails.append("GPU %d: row-remap failure" % i)
        if g["ecc_corrected_rising"]:
            warns.append("GPU %d: correctable ECC count rising between samples" % i)
        if flag(g.get("ecc_mode")) is False and DATA_CENTRE_RE.search(str(g.get("name") or "")):
            warns.append("GPU %d: ECC is off on a data-centre card (%s)" % (i, g.get("name")))
    if fails:
        return "fail", "; ".join(fails + warns)
    if warns:
        return "warn", "; ".join(warns)
    return "pass", "no uncorrectable ECC errors, no pending retirement or row-remap failure on %d GPUs" % len(gpus)


def check_busy(gpus: list[dict[str, Any]], apps: dict[str, list[int]]) -> tuple[str, str]:
    bad = []
    for g in gpus:
        used = g["memory_used_mib"]
        if used is not None and used > BUSY_MIB and not g.get("gpuq_job"):
            pids = apps.get(str(g.get("uuid")), [])
            bad.append("GPU %d: %s MiB used and no gpuq attempt runs on it%s" % (
                g["index"], _fmt(used), " (nvidia-smi lists pid %s)" % ", ".join(str(p) for p in pids)
                if pids else " (no process listed: run `reap` to look for zombies)"))
    if bad:
        return "fail", "; ".join(bad)
    ours = ["GPU %d: %s" % (g["index"], g["gpuq_job"]) for g in gpus if g.get("gpuq_job")]
    return "pass", "no foreign GPU memory over %g MiB%s" % (BUSY_MIB, " (ours: %s)" % ", ".join(ours) if ours else "")


def _words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)]


def model_matches(wanted: str, name: str) -> bool:
    """Whether the model ``wanted`` names the card ``name`` (orchestrator/scheduling/gpumatch.py's rule, copied: the
    agent runs on the standard library alone; tests/unit/test_gpumatch.py checks the two agree)."""
    target = "".join(_words(wanted))
    if not target:
        return False
    words = _words(name)
    for start in range(len(words)):
        spelled = ""
        for word in words[start:]:
            spelled += word
            if spelled == target:
                return True
            if not target.startswith(spelled):
                break
    return False


def check_identity(gpus: list[dict[str, Any]], model: Any, min_mem_mib: float | None) -> tuple[str, str]:
    """``model``: one model name, or a list of alternatives ("" / []: any)."""
    models = [m for m in ([model] if isinstance(model, str) else list(model or [])) if m]
    fails, warns = [], []
    for g in gpus:
        mem = g["memory_total_mib"]
        if min_mem_mib is not None and mem is not None and mem < min_mem_mib:
            fails.append("GPU %d: %s has %s MiB, below the %s MiB requested" % (
                g["index"], g["name"], _fmt(mem), _fmt(min_mem_mib)))
        if models and not any(model_matches(m, str(g.get("name") or "")) for m in models):
            warns.append("GPU %d is %r, not the requested %s" % (
                g["index"], g["name"], " or ".join(repr(m) for m in models)))
    names: dict[str, int] = {}
    for g in gpus:
        key = "%s (%s MiB)" % (g["name"], _fmt(g["memory_total_mib"]))
        names[key] = names.get(key, 0) + 1
    summary = ", ".join("%d x %s" % (n, k) for k, n in sorted(names.items()))
    if fails:
        return "fail", "; ".join(fails + warns)
    if warns:
        return "warn", "; ".join(warns)
    return "pass", summary or "no GPUs"


def check_kernel(kernel: dict[str, Any]) -> tuple[str, str]:
    if not kernel.get("readable"):
        return "warn", ("non-authoritative: kernel log unreadable; a human must confirm no Xid (%s)"
                        % (kernel.get("error") or "unknown error"))
    xids = kernel.get("xids") or []
    fatal = [x for x in xids if x.get("code") in P.FATAL_XIDS]
    other = [x for x in xids if x.get("code") not in P.FATAL_XIDS]

    def say(xs: list[dict[str, Any]]) -> str:
        seen: list[str] = []
        for x in xs:
            s = "Xid %s on %s" % (x.get("code"), x.get("pci"))
            if s not in seen:
                seen.append(s)
        return ", ".join(seen[:8]) + (" (+%d more)" % (len(seen) - 8) if len(seen) > 8 else "")

    if fatal:
        return "fail", "host unhealthy: %s (48: double-bit ECC, 79: fell off the bus)%s" % (
            say(fatal), "; also " + say(other) if other else "")
    if other:
        return "warn", "%s (13, 31, 43, 45 are usually application faults)" % say(other)
    return "pass", "no new Xid in the kernel log (cursor %s)" % (kernel.get("cursor") or "-")


def check_torch(probe: dict[str, Any] | None, gpu_host: bool, want_count: int,
                driver_cuda: tuple[int, int] | None, python: str) -> list[tuple[str, str, str]]:
    """(check, status, detail) for "visibility" and "driver" from the torch probe's answer."""
    if probe is None:
        return [("visibility", "pass", "skipped: no --python interpreter given"),
                ("driver", "pass", "skipped: no --python interpreter given")]
    err = probe.get("error")
    if not gpu_host:
        if err:
            return [("visibility", "warn", "%s; %s" % (NO_GPUS, err)), ("driver", "pass", NO_GPUS)]
        return [("visibility", "pass", "%s; torch %s importable from %s" % (NO_GPUS, probe.get("torch"), python)),
                ("driver", "pass", NO_GPUS)]
    if err:
        return [("visibility", "fail", "%s (%s)" % (err, python)), ("driver", "warn", "not checked: " + err)]
    ver, cuda = probe.get("torch"), probe.get("cuda")
    out: list[tuple[str, str, str]] = []
    if not cuda:
        out.append(("visibility", "fail", "torch %s from %s is a CPU-only build (torch.version.cuda is None) "
                                          "on a GPU host: install a CUDA build of torch" % (ver, python)))
    elif not probe.get("available"):
        hint = probe.get("cuda_error") or probe.get("stderr") or ""
        out.append(("visibility", "fail", "torch.cuda.is_available() is False (torch %s, CUDA %s)%s" % (
            ver, cuda, ": " + hint if hint else "")))
    elif probe.get("count") != want_count:
        out.append(("visibility", "fail", "torch sees %s GPUs, expected %d" % (probe.get("count"), want_count)))
    else:
        out.append(("visibility", "pass", "torch %s sees %d GPUs (CUDA %s)" % (ver, want_count, cuda)))
    built = cuda_tuple(cuda)
    if built is None or driver_cuda is None:
        out.append(("driver", "pass", "not compared (torch CUDA %s, driver CUDA %s)" % (
            cuda, "%d.%d" % driver_cuda if driver_cuda else "unknown")))
    elif built > driver_cuda:
        usable = bool(probe.get("available")) and probe.get("count") == want_count
        status = "fail" if built[0] > driver_cuda[0] or not usable else "warn"
        out.append(("driver", status, "torch is built for CUDA %d.%d, the driver supports up to %d.%d%s" % (
            built + driver_cuda + (" (minor-version compatibility: works, but 'no kernel image' errors may follow)"
                                   if status == "warn" else ": upgrade the driver or install a matching torch",))))
    else:
        out.append(("driver", "pass", "torch CUDA %d.%d <= driver CUDA %d.%d" % (built + driver_cuda)))
    return out


def check_disk(disk: dict[str, Any], min_free_gb: float) -> list[tuple[str, str, str]]:
    free, pct, ipct = disk.get("free_bytes"), disk.get("used_pct"), disk.get("inodes_used_pct")
    out: list[tuple[str, str, str]] = []
    if free is None:
        out.append(("disk", "warn", "cannot statvfs %s" % disk.get("path")))
    elif free / 1e9 < min_free_gb:
        out.append(("disk", "fail", "%.1f GB free under %s, below the %g GB gate" % (
            free / 1e9, disk.get("path"), min_free_gb)))
    elif pct is not None and pct >= DISK_WARN_PCT:
        out.append(("disk", "warn", "%s is %.1f%% full (%.1f GB free)" % (disk.get("path"), pct, free / 1e9)))
    else:
        out.append(("disk", "pass", "%.1f GB free under %s (%s%% used)" % (free / 1e9, disk.get("path"), _fmt(pct))))
    if ipct is None:
        out.append(("inodes", "pass", "inode use unknown"))
    elif ipct >= INODE_FAIL_PCT:
        out.append(("inodes", "fail", "inode use %.1f%% >= %g%% under %s" % (ipct, INODE_FAIL_PCT, disk.get("path"))))
    elif ipct >= INODE_WARN_PCT:
        out.append(("inodes", "warn", "inode use %.1f%% under %s" % (ipct, disk.get("path"))))
    else:
        out.append(("inodes", "pass", "inode use %.1f%%" % ipct))
    return out


def check_shm(size_bytes: int | None) -> tuple[str, str]:
    if size_bytes is None:
        return "warn", "no /dev/shm: DataLoader workers and NCCL need shared memory"
    if size_bytes < SHM_MIN_BYTES:
        return "warn", ("/dev/shm is %.0f MiB (< 1 GiB): DataLoader workers die with 'bus error'; "
                        "start the container with --shm-size or --ipc=host" % (size_bytes / 1048576.0))
    return "pass", "/dev/shm %.1f GiB" % (size_bytes / GIB)
