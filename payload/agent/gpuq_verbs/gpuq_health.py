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
stderr, one line each.  Read-only.  This module runs the verb; what nvidia-smi and torch say is read by
gpuq_health_gpus.py, each check's rule is gpuq_health_checks.py's.  stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import sys
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, list_specs, read_json, utc
from gpuq_verbs.gpuq_health_checks import (
    NO_GPUS,
    check_busy,
    check_disk,
    check_ecc,
    check_heat,
    check_identity,
    check_kernel,
    check_shm,
    check_throttle,
    check_torch,
    worst,
)
from gpuq_verbs.gpuq_health_gpus import (
    compute_apps,
    dmon_samples,
    driver_cuda_version,
    gpu_record,
    num,
    query_gpu_rows,
    torch_probe,
)
from gpuq_base.gpuq_hostfacts import disk_info
from gpuq_watch.gpuq_kernel import kernel_section
from gpuq_verbs.gpuq_status import job_entry  # the status probe's notion of a live attempt, reused as is

CHECKS = ("tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy",
          "disk", "inodes", "shm")
GPU_CHECKS = ("tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy")


# --- the host (I/O) ------------------------------------------------------------------------------


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
    kernel = kernel_section(kernel_since)
    gpus, skip = sample_gpus(v, lay, ids, samples)
    if gpus is None:
        add_skipped(v, skip, python, ids, kernel)
    else:
        add_gpu_checks(v, lay, gpus, ids, python, kernel, model, min_mem_mib)
    for name, st, detail in check_disk(disk_info(existing_dir(lay.root)), min_free_gb):
        v.add(name, st, detail)
    v.add("shm", *check_shm(shm_size()))
    order = {c: i for i, c in enumerate(CHECKS)}
    v.checks.sort(key=lambda c: order.get(c["check"], len(order)))
    return {"schema": P.HEALTH_SCHEMA, "verdict": v.verdict, "host": socket.gethostname(), "time": utc(),
            "root": lay.root, "checks": v.checks, "gpus": gpus or [], "kernel": kernel}


def sample_gpus(v: Verdict, lay: Layout, ids: list[int], samples: int) -> tuple[list[dict[str, Any]] | None, str]:
    """The "tooling" check and the GPUs' records: (records, "") on a GPU host (None when it is not one,
    with what the GPU checks say instead)."""
    expected, why = gpus_expected(lay, ids)
    if shutil.which("nvidia-smi") is None:
        if expected:
            v.add("tooling", "fail", "nvidia-smi is not installed but GPUs are expected (%s)" % why)
            return None, "not checked: nvidia-smi unavailable"
        return None, NO_GPUS
    rows, err, dropped = query_gpu_rows()
    listed = None if rows is None else sorted(int(num(r.get("index")) or 0) for r in rows)
    if rows and ids:
        rows = [r for r in rows if int(num(r.get("index")) or 0) in ids]
    if rows is None:
        v.add("tooling", "fail", err)
        return None, "not checked: nvidia-smi failed"
    if not rows and not expected:
        return None, NO_GPUS
    if not listed:
        v.add("tooling", "fail", "nvidia-smi lists no GPUs but GPUs are expected (%s): %s" % (why, err))
        return None, "not checked: no GPUs visible"
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
    return gpus, ""


def add_skipped(v: Verdict, skip: str, python: str, ids: list[int], kernel: dict[str, Any]) -> None:
    """The GPU checks of a host that is no GPU host: passed on a CPU host (``skip`` is NO_GPUS), else
    warned with ``skip``; the kernel log still speaks where nvidia-smi cannot."""
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


def add_gpu_checks(v: Verdict, lay: Layout, gpus: list[dict[str, Any]], ids: list[int], python: str,
                   kernel: dict[str, Any], model: Any, min_mem_mib: float | None) -> None:
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
