"""What the wrapper checks around the trainer (docs/host-protocol.md): before it, that torch sees the
assigned GPUs and that the disk has room (the disk gate); after it, that the artifacts the spec's
``verify`` names are there and load.  Each check returns "" (or True) when it passes, else the one
line the exit record carries.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import gpuq_protocol as P
from gpuq_files import read_json
from gpuq_hostfacts import disk_info

INODE_LIMIT_PCT = 95.0


def cuda_sees(python: str, env: dict[str, str], gpus: int) -> bool:
    """True when the job's interpreter's torch sees exactly ``gpus`` CUDA devices."""
    probe = ("import sys, torch; ok = torch.cuda.is_available() and "
             "torch.cuda.device_count() == %d; sys.exit(0 if ok else 1)" % gpus)
    try:
        rc = subprocess.run([python, "-c", probe], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300).returncode
    except (OSError, subprocess.SubprocessError):
        rc = 1
    return rc == 0


def disk_gate(root: str, ckpt: str, spec: dict[str, Any]) -> str:
    """"" when the root's disk has room for the attempt, else the DISK_GATE_ABORT line.  Leftover
    ``*.tmp`` files of a torn save in ``ckpt`` go first; the need is twice the newest checkpoint plus
    the spec's scratch_gb, at least its min_free_gb."""
    for name in os.listdir(ckpt):
        if name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(ckpt, name))
    pointer = read_json(os.path.join(ckpt, P.LATEST_POINTER))  # names the rolling latest-<step>.pt
    ckpt_bytes = int(pointer.get("bytes") or 0) if isinstance(pointer, dict) else 0
    gb = 1e9
    need = max(float(spec.get("min_free_gb") or 0), ckpt_bytes * 2 / gb + float(spec.get("scratch_gb") or 0))
    disk = disk_info(root)
    have = (disk["free_bytes"] or 0) / gb
    ipct = disk["inodes_used_pct"] or 0.0
    if have < need or ipct >= INODE_LIMIT_PCT:
        return f"DISK_GATE_ABORT need={need:.2f} have={have:.2f} inodes={ipct:.1f}"
    return ""


def verify_artifacts(jdir: str, spec: dict[str, Any], env: dict[str, str]) -> str:
    """"" when the artifacts the spec's ``verify`` names are sound, else why not ("finalize: ...")."""
    checks = spec.get("verify") or []
    if "metrics" in checks:
        path = os.path.join(jdir, P.RESULT_DIR, P.METRICS_FILE)
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
        path = os.path.join(jdir, P.CKPT_DIR, P.BEST_CKPT)
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
