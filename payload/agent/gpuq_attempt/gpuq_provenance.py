"""What one attempt ran with: its GPUs' model and count, the driver, and the CUDA, torch and NCCL
versions and Python of the job's own interpreter (docs/results.md, "Provenance").

Written once per attempt by the wrapper's helpers thread (gpuq_helpers.py), once the trainer is up, to
``attempts/<n>/provenance.json``; ``status`` carries it in the job's entry.  Nothing here imports
torch: the job's interpreter reads ``torch/version.py`` as text and the NCCL wheel's metadata
(``importlib.metadata``), so the probe costs one short ``python -I`` and one ``nvidia-smi``.  What
cannot be known is null, never guessed.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import atomic_write_json
from gpuq_base.gpuq_procs import helper_env

PROBE_TIMEOUT_S = 10
FIELD_CHARS = 120  # each string field; the controller bounds them again
MAX_GPUS = 1024

# Run by the job's interpreter: reads versions without importing torch (find_spec of a top-level
# package imports nothing).  Prints one JSON object.
VERSIONS = r"""
import json, os, re, sys
out = {"python": sys.version.split()[0], "torch": None, "cuda": None, "nccl": None}
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
except Exception:
    spec = None
if spec is not None and spec.origin:
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as fh:
            text = fh.read()
    except OSError:
        text = ""
    m = re.search(r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    out["torch"] = m.group(1) if m else None
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*(None|['\"]([^'\"]+)['\"])", text, re.M)
    if m:
        out["cuda"] = m.group(2) if m.group(2) else "none"
try:
    from importlib import metadata
except ImportError:
    metadata = None
if metadata is not None:
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            out["nccl"] = metadata.version(name)
            break
        except Exception:
            pass
print(json.dumps(out))
"""


def _clean(value: Any) -> str | None:
    if value is None:
        return None
    text = "".join(c for c in str(value) if c.isprintable()).strip()
    return text[:FIELD_CHARS] or None


def gpu_facts(kind: str, slots: list[int]) -> dict[str, Any]:
    """{"gpu_model", "gpu_count", "driver"} of the attempt's GPU slots (nvidia-smi), CPU slots: no GPU."""
    if kind != "gpu":
        return {"slot_kind": "cpu", "gpu_model": None, "gpu_count": 0, "driver": None}
    argv = ["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader,nounits"]
    if slots:
        argv[1:1] = ["-i", ",".join(str(s) for s in slots)]
    names: list[str] = []
    drivers: list[str] = []
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S, text=True, env=helper_env())
        lines = out.stdout.splitlines() if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        lines = []
    for line in lines[:MAX_GPUS]:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 3 and fields[0].isdigit():
            names.append(fields[1])
            drivers.append(fields[2])
    models = sorted(set(n for n in names if n))
    return {"slot_kind": "gpu", "gpu_model": _clean(" + ".join(models)) if models else None,
            "gpu_count": len(names) if names else len(slots),
            "driver": _clean(", ".join(sorted(set(d for d in drivers if d)))) if drivers else None}



def versions(python: str, env: dict[str, str]) -> dict[str, Any]:
    """{"python", "torch", "cuda", "nccl"} as the job's interpreter sees them (nulls when it cannot say)."""
    found: dict[str, Any] = {"python": None, "torch": None, "cuda": None, "nccl": None}
    try:
        out = subprocess.run([python, "-c", VERSIONS], stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=PROBE_TIMEOUT_S, env=helper_env(env), text=True)
        doc = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else {}
        why = "" if doc else "exit {}: {}".format(out.returncode, (out.stderr or "").strip()[-300:])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        doc, why = {}, repr(e)[:300]
    if why:
        found["versions_error"] = _clean(why)
    if isinstance(doc, dict):
        for key in ("python", "torch", "cuda", "nccl"):
            found[key] = _clean(doc.get(key))
    return found


def collect(python: str, env: dict[str, str], launch: dict[str, Any]) -> dict[str, Any]:
    slots = [s for s in (launch.get("slots") or []) if isinstance(s, int)]
    doc: dict[str, Any] = {"schema": "gpuq.provenance/1"}
    doc.update(gpu_facts(str(launch.get("kind") or ""), slots))
    doc.update(versions(python, env))
    return doc


def write(adir: str, python: str, env: dict[str, str], launch: dict[str, Any]) -> None:
    """Write ``attempts/<n>/provenance.json`` (gpuq_helpers.py calls it once the trainer is up); never raises."""
    try:
        atomic_write_json(os.path.join(adir, P.PROVENANCE_FILE), collect(python, env, launch))
    except Exception:  # provenance is evidence, never a reason for an attempt to fail
        pass
