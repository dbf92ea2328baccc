"""What nvidia-smi and torch say of a host's GPUs, for the health preflight (gpuq_health.py): the queries
(``--query-gpu`` rows, ``dmon`` samples, compute apps, the driver's CUDA, a torch probe in the job's
interpreter) and their pure parsers (unit-tested), down to one GPU's record of the verdict document.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

NVSMI_TIMEOUT_S = 20.0
TORCH_TIMEOUT_S = 120.0
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used", "temperature.gpu",
    "clocks.current.sm", "clocks.max.sm",
) + tuple("clocks_throttle_reasons." + r for r in THROTTLE_REASONS) + (
    "ecc.mode.current", "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "remapped_rows.failure",
)
REQUIRED_FIELDS = ("index",)
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


# --- parsers (pure; unit-tested) -----------------------------------------------------------------


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


# --- queries (I/O) --------------------------------------------------------------------------------


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
