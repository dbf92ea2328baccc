"""``health``: the GPU preflight (docs/health.md), one "gpuq.health/1" verdict on stdout.

Usage: ``gpuq_agent.py --root R health [--gpus 0,1] [--samples N] [--python PY] [--min-free-gb X]
[--kernel-since CURSOR] [--gpu-model NAME ...] [--min-gpu-mem-mib MIB]``.

Checks, each "pass" | "warn" | "fail" with a human detail; the verdict is the worst of them (status
only escalates pass -> warn -> fail):

  tooling     nvidia-smi missing or failing while GPUs are expected, a requested index absent: FAIL;
              no ``nvidia-smi dmon`` samples: WARN
  identity    memory.total below --min-gpu-mem-mib: FAIL; a name no --gpu-model names: WARN (--gpu-model
              may be given several times: alternatives; a model names a card when its letters and
              digits spell one or more consecutive words of the card's name, case ignored:
              A100 names "NVIDIA A100-SXM4-80GB", A10 does not; the controller's gpumatch.py rule)
  visibility  (--python) torch not importable, a CPU-only torch build on a GPU host,
              torch.cuda.is_available() False, or the wrong device count: FAIL
  driver      (--python) torch.version.cuda newer than the driver's CUDA: FAIL for a newer major
              (or any newer version when CUDA is unusable), WARN for a newer minor that still works
  kernel      Xid 48/79: FAIL (host unhealthy); any other Xid: WARN; log unreadable: WARN
              ("non-authoritative")
  throttle    HW slowdown, HW thermal, HW power brake or SW thermal slowdown Active: FAIL
  heat        >= 83 C with SM clock < 70 % of clocks.max.sm: FAIL; >= 83 C, normal clock: WARN
  ecc         volatile uncorrected > 0, retired_pages.pending, remapped_rows.failure: FAIL;
              corrected count rising between samples, ECC off on a data-centre card: WARN
  busy        > 1 GiB used on a (requested) GPU no live gpuq attempt of this root runs on: FAIL
  disk        free bytes under the root below --min-free-gb: FAIL; >= 90 % used: WARN
  inodes      >= 95 % used: FAIL; >= 90 %: WARN
  shm         /dev/shm smaller than 1 GiB (or missing): WARN

A host without nvidia-smi where no GPUs are expected (no --gpus, no GPU slots in agent.pid, no
/dev/nvidiaN node) is a CPU host: the GPU checks pass with "no GPUs (cpu slots)".

Exit 0 for PASS or WARN (launch allowed), 2 for FAIL, 64 for a usage error.  Findings also go to
stderr, one line each.  Read-only.  stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import gpuq_protocol as P
from gpuq_files import Layout, list_specs, read_json, utc
from gpuq_hostfacts import disk_info
from gpuq_kernel import kernel_section
from gpuq_status import job_entry  # the status probe's notion of a live attempt, reused as is

TEMP_LIMIT_C = 83.0
CLOCK_MIN_FRACTION = 0.70  # of the MAXIMUM SM clock (clocks.max.sm), never the current application clock
BUSY_MIB = 1024.0
DISK_WARN_PCT = 90.0
INODE_FAIL_PCT = 95.0
INODE_WARN_PCT = 90.0
SHM_MIN_BYTES = 1 << 30
NVSMI_TIMEOUT_S = 20.0
TORCH_TIMEOUT_S = 120.0
GIB = float(1 << 30)

RANK = {"pass": 0, "warn": 1, "fail": 2}
CHECKS = ("tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy",
          "disk", "inodes", "shm")
GPU_CHECKS = ("tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy")
NO_GPUS = "no GPUs (cpu slots)"
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used", "temperature.gpu",
    "clocks.current.sm", "clocks.max.sm",
) + tuple("clocks_throttle_reasons." + r for r in THROTTLE_REASONS) + (
    "ecc.mode.current", "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "remapped_rows.failure",
)
REQUIRED_FIELDS = ("index",)
DATA_CENTRE_RE = re.compile(r"\b(A100|A800|H100|H800|H200|GH200|B100|B200|GB200|A30|V100|P100)\b")
INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field')
DRIVER_CUDA_RE = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
TORCH_PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
except Exception as e:
    out["error"] = "import torch failed: %s: %s" % (type(e).__name__, e)
else:
    out["torch"] = str(torch.__version__)
    out["cuda"] = torch.version.cuda
    try:
        out["available"] = bool(torch.cuda.is_available())
        out["count"] = int(torch.cuda.device_count()) if out["available"] else 0
    except Exception as e:
        out["available"], out["count"] = False, 0
        out["cuda_error"] = "%s: %s" % (type(e).__name__, e)
print("GPUQ_TORCH " + json.dumps(out))
"""


# --- small parsers (pure; unit-tested) ------------------------------------------------------------


def num(text: Any) -> float | None:
    """A number from an nvidia-smi cell ("81559", "81559 MiB", "[N/A]", "[Not Supported]")."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    s = str(text or "").strip()
    if not s or s.startswith("["):
        return None
    try:
        return float(s.split()[0])
    except ValueError:
        return None


def flag(text: Any) -> bool | None:
    """True/False from "Active"/"Not Active", "Yes"/"No", "Enabled"/"Disabled", counts; None unknown."""
    s = str(text if text is not None else "").strip().lower()
    if s in ("active", "yes", "enabled", "true"):
        return True
    if s in ("not active", "no", "disabled", "false"):
        return False
    n = num(s)
    return None if n is None else n > 0


def parse_gpu_ids(text: str | None) -> list[int]:
    """"0,1" -> [0, 1]; "" -> []; raises ValueError on anything else."""
    out: list[int] = []
    for tok in (text or "").split(","):
        tok = tok.strip()
        if not tok:
            continue
        if not tok.isdigit():
            raise ValueError("--gpus wants GPU indexes like 0,1, got %r" % text)
        if int(tok) not in out:
            out.append(int(tok))
    return out


def parse_csv(text: str, fields: list[str]) -> list[dict[str, str]]:
    """Rows of ``--format=csv,noheader,nounits`` output, keyed by the queried field names."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < len(fields):
            continue
        if len(cells) > len(fields):  # a name with commas: glue the surplus back into "name"
            extra = len(cells) - len(fields)
            if "name" in fields:
                i = fields.index("name")
                cells[i:i + extra + 1] = [",".join(cells[i:i + extra + 1])]
            else:
                cells = cells[:len(fields)]
        rows.append(dict(zip(fields, cells)))
    return rows


def parse_dmon(text: str) -> dict[int, list[dict[str, float | None]]]:
    """``nvidia-smi dmon`` output -> {gpu index: [sample {column: value}]} (``-`` reads None)."""
    cols: list[str] = []
    out: dict[int, list[dict[str, float | None]]] = {}
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            names = s.lstrip("#").split()
            if names and names[0].lower() in ("gpu", "idx") and not cols:
                cols = [n.lower() for n in names]
            continue
        if not cols:
            continue
        parts = s.split()
        if len(parts) != len(cols) or not parts[cols.index(cols[0])].isdigit():
            continue
        rec: dict[str, float | None] = {}
        for name, val in zip(cols[1:], parts[1:]):
            rec[name] = num(val)
        out.setdefault(int(parts[0]), []).append(rec)
    return out


def cuda_tuple(text: Any) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def gpu_record(row: dict[str, str], dmon: list[dict[str, float | None]]) -> dict[str, Any]:
    """One GPU of the verdict document, from a --query-gpu row and its dmon samples."""
    temps = [t for t in (s.get("gtemp") for s in dmon) if t is not None]
    sbecc = [e for e in (s.get("sbecc") for s in dmon) if e is not None]
    throttle = [r for r in THROTTLE_REASONS if flag(row.get("clocks_throttle_reasons." + r))]
    return {
        "index": int(num(row.get("index")) or 0), "name": row.get("name"), "uuid": row.get("uuid"),
        "pci_bus_id": row.get("pci.bus_id"), "memory_total_mib": num(row.get("memory.total")),
        "memory_used_mib": num(row.get("memory.used")), "temp_c": num(row.get("temperature.gpu")),
        "temp_max_c": max(temps) if temps else None,
        "sm_clock_mhz": num(row.get("clocks.current.sm")), "sm_clock_max_mhz": num(row.get("clocks.max.sm")),
        "throttle": throttle, "ecc_mode": row.get("ecc.mode.current"),
        "ecc_corrected": num(row.get("ecc.errors.corrected.volatile.total")),
        "ecc_uncorrected": num(row.get("ecc.errors.uncorrected.volatile.total")),
        "ecc_corrected_rising": bool(len(sbecc) >= 2 and sbecc[-1] > sbecc[0]),
        "retired_pages_pending": flag(row.get("retired_pages.pending")),
        "remapped_rows_failure": flag(row.get("remapped_rows.failure")),
        "samples": len(dmon), "gpuq_job": None,
    }


# --- per-check verdicts (pure; unit-tested) -------------------------------------------------------


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


# --- probes (I/O) ---------------------------------------------------------------------------------


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr); exit None when it could not run or timed out (stderr says why)."""
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                             env=env, check=False)
    except subprocess.TimeoutExpired:
        return None, "", "%s timed out after %gs" % (argv[0], timeout)
    except OSError as e:
        return None, "", "%s: %s" % (argv[0], e)
    return out.returncode, out.stdout.decode("utf-8", "replace"), out.stderr.decode("utf-8", "replace")


def _first_line(*texts: str) -> str:
    for t in texts:
        for line in t.splitlines():
            if line.strip():
                return line.strip()[:300]
    return ""


def query_gpu_rows() -> tuple[list[dict[str, str]] | None, str, list[str]]:
    """(rows of every GPU, error, fields this driver does not know).  An unknown field is retried
    once under its newer name (clocks_event_reasons.*), else dropped and reported as unknown.
    (All GPUs, never ``-i``: one absent index would fail the whole query.)"""
    fields = list(QUERY_FIELDS)
    dropped: list[str] = []
    for _ in range(len(QUERY_FIELDS) + 1):
        rc, out, err = _run(["nvidia-smi", "--query-gpu=" + ",".join(fields),
                             "--format=csv,noheader,nounits"], NVSMI_TIMEOUT_S)
        if rc == 0:
            rows = parse_csv(out, fields)
            for r in rows:  # report under the canonical names whatever the driver called them
                for f in list(r):
                    if f.startswith("clocks_event_reasons."):
                        r["clocks_throttle_reasons." + f.split(".", 1)[1]] = r.pop(f)
            return rows, "", dropped
        m = INVALID_FIELD_RE.search(out + err)
        if rc is None or m is None or m.group(1) not in fields or m.group(1) in REQUIRED_FIELDS:
            if rc == 6 or "No devices were found" in out + err:
                return [], "no devices were found", dropped
            return None, "nvidia-smi %s: %s" % ("failed" if rc is None else "exited %d" % rc,
                                                _first_line(out, err) or "no output"), dropped
        bad = m.group(1)
        i = fields.index(bad)
        if bad.startswith("clocks_throttle_reasons."):
            fields[i] = "clocks_event_reasons." + bad.split(".", 1)[1]
        else:
            del fields[i]
            dropped.append(bad)
    return None, "nvidia-smi rejects the query", dropped


def compute_apps() -> dict[str, list[int]]:
    """GPU uuid -> pids nvidia-smi lists as compute apps ({} when it cannot say)."""
    rc, out, _err = _run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader,nounits"],
                         NVSMI_TIMEOUT_S)
    apps: dict[str, list[int]] = {}
    if rc != 0:
        return apps
    for row in parse_csv(out, ["pid", "gpu_uuid"]):
        if row["pid"].isdigit():
            apps.setdefault(row["gpu_uuid"], []).append(int(row["pid"]))
    return apps


def dmon_samples(samples: int) -> tuple[dict[int, list[dict[str, float | None]]], str]:
    rc, out, err = _run(["nvidia-smi", "dmon", "-s", "pucvmet", "-c", str(samples)], NVSMI_TIMEOUT_S + samples * 2.0)
    data = parse_dmon(out)
    if not data:
        return {}, "no dmon output (%s)" % (_first_line(out, err) or ("exit %s" % rc))
    return data, ""


def driver_cuda_version() -> tuple[int, int] | None:
    rc, out, _err = _run(["nvidia-smi"], NVSMI_TIMEOUT_S)
    m = DRIVER_CUDA_RE.search(out) if rc == 0 else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_probe(python: str, ids: list[int]) -> dict[str, Any]:
    exe = python if os.sep in python else (shutil.which(python) or "")
    if not exe or not os.access(exe, os.X_OK):
        return {"error": "interpreter %s not found" % python}
    env = dict(os.environ)
    if ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    rc, out, err = _run([exe, "-c", TORCH_PROBE], TORCH_TIMEOUT_S, env=env)
    for line in out.splitlines():
        if line.startswith("GPUQ_TORCH "):
            try:
                doc = json.loads(line[len("GPUQ_TORCH "):])
            except ValueError:
                break
            if isinstance(doc, dict):
                warn = [ln.strip() for ln in err.splitlines() if ln.strip() and "Warning" in ln]
                if warn:
                    doc["stderr"] = warn[-1][:300]
                return doc
    return {"error": "torch probe with %s failed (%s): %s" % (
        python, "exit %s" % rc if rc is not None else "did not run", _first_line(err[-2000:], out) or "no output")}


def owned_gpus(lay: Layout) -> dict[int, str]:
    """GPU index -> job id of every live (running or launching) gpuq attempt of this root."""
    owned: dict[int, str] = {}
    now = time.time()
    for job_id in list_specs(lay.p(P.CLAIMED_DIR)):
        e = job_entry(lay, job_id, P.CLAIMED_DIR, now)
        if e["state"] == "running" or (e["state"] == "claimed" and e["slots"] is not None):
            for s in e["slots"] or []:
                if isinstance(s, int):
                    owned[s] = job_id
    return owned


def gpus_expected(lay: Layout, ids: list[int]) -> tuple[bool, str]:
    if ids:
        return True, "--gpus %s" % ",".join(str(i) for i in ids)
    rec = read_json(lay.p(P.AGENT_PID))
    if isinstance(rec, dict) and isinstance(rec.get("slots"), dict) and rec["slots"].get("kind") == "gpu":
        return True, "the agent runs GPU slots"
    nodes = [n for n in glob.glob("/dev/nvidia[0-9]*") if n[len("/dev/nvidia"):].isdigit()]
    if nodes:
        return True, "%s exists" % sorted(nodes)[0]
    return False, ""


def shm_size() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def existing_dir(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.isdir(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


# --- the verb -------------------------------------------------------------------------------------


class Verdict:
    def __init__(self) -> None:
        self.checks: list[dict[str, str]] = []

    def add(self, check: str, status: str, detail: str) -> None:
        self.checks.append({"check": check, "status": status, "detail": detail})

    @property
    def verdict(self) -> str:
        return worst([c["status"] for c in self.checks])


def run_health(lay: Layout, ids: list[int], samples: int, python: str, min_free_gb: float,
               kernel_since: str | None, model: Any = "", min_mem_mib: float | None = None) -> dict[str, Any]:
    v = Verdict()
    gpus: list[dict[str, Any]] = []
    kernel = kernel_section(kernel_since)
    expected, why = gpus_expected(lay, ids)
    have_smi = shutil.which("nvidia-smi") is not None
    gpu_host = False
    skip = ""
    if not have_smi:
        if expected:
            v.add("tooling", "fail", "nvidia-smi is not installed but GPUs are expected (%s)" % why)
            skip = "not checked: nvidia-smi unavailable"
        else:
            skip = NO_GPUS
    else:
        rows, err, dropped = query_gpu_rows()
        listed = None if rows is None else sorted(int(num(r.get("index")) or 0) for r in rows)
        if rows and ids:
            rows = [r for r in rows if int(num(r.get("index")) or 0) in ids]
        if rows is None:
            v.add("tooling", "fail", err)
            skip = "not checked: nvidia-smi failed"
        elif not rows and not expected:
            skip = NO_GPUS
        elif not listed:
            v.add("tooling", "fail", "nvidia-smi lists no GPUs but GPUs are expected (%s): %s" % (why, err))
            skip = "not checked: no GPUs visible"
        else:
            gpu_host = True
            missing = [i for i in ids if i not in (listed or [])]
            data, dmon_err = dmon_samples(samples) if samples > 0 else ({}, "")
            gpus = [gpu_record(r, data.get(int(num(r.get("index")) or 0), [])) for r in rows]
            if missing:
                v.add("tooling", "fail", "requested GPU %s absent (nvidia-smi lists %s)" % (
                    ",".join(str(i) for i in missing), ",".join(str(i) for i in listed or [])))
            elif dmon_err:
                v.add("tooling", "warn", dmon_err)
            else:
                v.add("tooling", "pass", "nvidia-smi lists GPUs %s; %s" % (
                    ",".join(str(i) for i in listed or []),
                    "%d dmon samples" % samples if samples > 0 else "dmon skipped (--samples 0)")
                      + ("; this driver does not report %s" % ", ".join(dropped) if dropped else ""))
    if not gpu_host:
        cpu = skip == NO_GPUS
        torch_checks: dict[str, tuple[str, str]] = {}
        if python and cpu:
            for name, st, detail in check_torch(torch_probe(python, ids), False, 0, None, python):
                torch_checks[name] = (st, detail)
        for c in GPU_CHECKS:
            if c == "tooling" and any(x["check"] == "tooling" for x in v.checks):
                continue
            if c in torch_checks:
                v.add(c, *torch_checks[c])
            elif c == "kernel" and not cpu:  # the kernel log speaks even when nvidia-smi cannot
                v.add(c, *check_kernel(kernel))
            else:
                v.add(c, "pass" if cpu else "warn", skip)
    else:
        owned = owned_gpus(lay)
        for g in gpus:
            g["gpuq_job"] = owned.get(g["index"])
        v.add("identity", *check_identity(gpus, model, min_mem_mib))
        probe = torch_probe(python, ids) if python else None
        for name, st, detail in check_torch(probe, True, len(ids) or len(gpus),
                                            driver_cuda_version() if probe else None, python):
            v.add(name, st, detail)
        v.add("kernel", *check_kernel(kernel))
        v.add("throttle", *check_throttle(gpus))
        v.add("heat", *check_heat(gpus))
        v.add("ecc", *check_ecc(gpus))
        v.add("busy", *check_busy(gpus, compute_apps()))
    for name, st, detail in check_disk(disk_info(existing_dir(lay.root)), min_free_gb):
        v.add(name, st, detail)
    v.add("shm", *check_shm(shm_size()))
    order = {c: i for i, c in enumerate(CHECKS)}
    v.checks.sort(key=lambda c: order.get(c["check"], len(order)))
    return {"schema": P.HEALTH_SCHEMA, "verdict": v.verdict, "host": socket.gethostname(), "time": utc(),
            "root": lay.root, "checks": v.checks, "gpus": gpus, "kernel": kernel}


def cmd_health(lay: Layout, args: argparse.Namespace) -> int:
    try:
        ids = parse_gpu_ids(args.gpus)
        if args.samples < 0:
            raise ValueError("--samples must be >= 0")
        if args.min_free_gb < 0:
            raise ValueError("--min-free-gb must be >= 0")
    except ValueError as e:
        print("gpuq health: %s" % e, file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    doc = run_health(lay, ids, int(args.samples), (args.python or "").strip(), float(args.min_free_gb),
                     args.kernel_since, model=[m.strip() for m in args.gpu_model or [] if m.strip()],
                     min_mem_mib=args.min_gpu_mem_mib)
    for c in doc["checks"]:
        print("gpuq health: %s %s: %s" % (c["status"].upper(), c["check"], c["detail"]), file=sys.stderr)
    print("gpuq health: verdict %s" % doc["verdict"].upper(), file=sys.stderr)
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return P.AGENT_EXIT_HEALTH_FAIL if doc["verdict"] == "fail" else 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--gpus", default="", help="GPU indexes the next job gets (e.g. 0,1); default: all")
    ap.add_argument("--samples", type=int, default=5, help="nvidia-smi dmon one-second samples (0: none)")
    ap.add_argument("--python", default="", help="interpreter whose torch to check (empty: skip)")
    ap.add_argument("--min-free-gb", type=float, default=0.0, help="FAIL below this many GB free under the root")
    ap.add_argument("--kernel-since", default=None, metavar="CURSOR",
                    help="only Xids after this kernel-log cursor (TS or BOOT_ID:TS) count")
    ap.add_argument("--gpu-model", action="append", default=[],
                    help="WARN when a card is not this model (several: any of them)")
    ap.add_argument("--min-gpu-mem-mib", type=float, default=None, help="FAIL when memory.total is below this")
