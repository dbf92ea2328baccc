"""What the wrapper checks around the trainer (docs/host-protocol.md): before it, that torch sees the
assigned GPUs and that the disk has room (the disk gate); after it, that the artifacts the spec's
``verify`` names are there and sound (a best checkpoint is read without loading it or importing
torch: gpuq_ckptcheck, the controller's check too).  Each check returns "" (or True) when it passes,
else the one line the exit record carries.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import json
import os
import subprocess

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_ckptcheck import checkpoint_problem
from gpuq_base.gpuq_files import read_json
from gpuq_base.gpuq_hostfacts import disk_info
from gpuq_base.gpuq_jobspec import JobSpec

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


def disk_gate(root: str, ckpt: str, spec: JobSpec) -> str:
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
    need = max(spec.min_free_gb, ckpt_bytes * 2 / gb + spec.scratch_gb)
    disk = disk_info(root)
    have = (disk["free_bytes"] or 0) / gb
    ipct = disk["inodes_used_pct"] or 0.0
    if have < need or ipct >= INODE_LIMIT_PCT:
        return f"DISK_GATE_ABORT need={need:.2f} have={have:.2f} inodes={ipct:.1f}"
    return ""


def verify_artifacts(jdir: str, spec: JobSpec) -> str:
    """"" when the artifacts the spec's ``verify`` names are sound, else why not ("finalize: ...")."""
    checks = spec.verify
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
        why = checkpoint_problem(path)
        if why is not None:
            return "finalize: %s: %s" % (path, why)
    return ""
