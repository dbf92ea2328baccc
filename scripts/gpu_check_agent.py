"""The host agent's side of scripts/gpu_check.py: ``status``, ``health`` and ``reap`` on the real
nvidia-smi, each on a fresh agent root (docs/health.md).  The CUDA side is gpu_check_cuda.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

AGENT = Path(__file__).resolve().parents[1] / "payload" / "agent" / "gpuq_agent.py"
CUDA_SIDE = Path(__file__).resolve().parent / "gpu_check_cuda.py"
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
DOC_BEGIN = "-----BEGIN GPUQ DOCUMENT-----"
DOC_END = "-----END GPUQ DOCUMENT-----"
HEALTH_CHECKS = ("tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy",
                 "disk", "inodes", "shm")


def tail(text: str, n: int = 300) -> str:
    return " ".join(text.split())[-n:]


class AgentChecks:
    """The rows "agent status", "agent health", "reap find" and "reap kill"."""

    work: Path
    n: int

    def __init__(self) -> None:
        self.leaked: dict[str, Any] | None = None
        self.leak_listed = False

    def agent(self, root: Path, *args: str, timeout: float = 300) -> tuple[int, dict[str, Any] | None, str]:
        proc = subprocess.run([sys.executable, str(AGENT), "--root", str(root), *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        doc = None
        out = proc.stdout
        if DOC_BEGIN in out and DOC_END in out:
            doc = json.loads(out.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0])
        return proc.returncode, doc, proc.stderr

    def check_status(self) -> tuple[str, str]:
        rc, doc, err = self.agent(self.work / "root-status", "status", "--json")
        if rc != 0 or doc is None:
            return FAIL, f"status exited {rc} without a document: {err.strip()[-300:]}"
        gpus = doc.get("gpus") or []
        problems = []
        if doc.get("schema") != "gpuq.status/1":
            problems.append(f"schema {doc.get('schema')!r}")
        want = self.n if not os.environ.get("CUDA_VISIBLE_DEVICES") else None  # nvidia-smi ignores the mask
        if (want is not None and len(gpus) != want) or len(gpus) < self.n:
            problems.append(f"nvidia-smi gave {len(gpus)} GPUs, torch sees {self.n}")
        for g in gpus:
            bad = [k for k in ("mem_used_mib", "mem_total_mib", "temp_c") if g.get(k) is None]
            if bad or not str(g.get("uuid", "")).startswith("GPU-") or not g.get("name") or not g["mem_total_mib"]:
                problems.append(f"GPU {g.get('index')} parsed as {g}")
        no_util = [str(g.get("index")) for g in gpus if g.get("util_pct") is None]  # [N/A] under MIG
        slots = doc.get("slots") or {}
        if slots.get("kind") != "gpu" or slots.get("total") != len(gpus):
            problems.append(f"slots {slots}")
        if problems:
            return FAIL, "; ".join(problems)
        return PASS, "; ".join(f"{g['index']}: {g['name']} {g['mem_total_mib']:.0f} MiB {g['temp_c']:.0f} C"
                               for g in gpus) + (f"; no utilization reported for GPU {','.join(no_util)}"
                                                 if no_util else "")

    def check_health(self) -> tuple[str, str]:
        rc, doc, err = self.agent(self.work / "root-health", "health", "--samples", "3", "--python", sys.executable)
        if doc is None:
            return FAIL, f"health exited {rc} without a document: {err.strip()[-300:]}"
        checks = {c["check"]: c for c in doc.get("checks", [])}
        problems = [f"check {c} missing" for c in HEALTH_CHECKS if c not in checks]
        gpus = doc.get("gpus") or []
        if len(gpus) < self.n:
            problems.append(f"{len(gpus)} GPUs in the verdict, torch sees {self.n}")
        for g in gpus:
            bad = [k for k in ("memory_total_mib", "memory_used_mib", "temp_c", "sm_clock_max_mhz")
                   if g.get(k) is None]
            if bad or g.get("samples", 0) < 1:
                problems.append(f"GPU {g.get('index')}: {', '.join(bad) or 'no dmon samples'} not read")
        vis = checks.get("visibility", {})
        if vis.get("status") != "pass":
            problems.append(f"visibility {vis.get('status')}: {vis.get('detail')}")
        failing = [f"{c['check']}: {c['detail']}" for c in checks.values() if c["status"] == "fail"]
        warned = [f"{c['check']} warn: {c['detail']}" for c in checks.values() if c["status"] == "warn"]
        if failing:
            problems.append("verdict FAIL: " + "; ".join(failing))
        if problems:
            return FAIL, "; ".join(problems)
        return PASS, f"verdict {doc.get('verdict', '?').upper()}" + ("; " + "; ".join(warned) if warned else "")

    def check_reap_find(self) -> tuple[str, str]:
        if not (shutil.which("fuser") or shutil.which("lsof")):
            return SKIP, "neither fuser nor lsof is installed (install psmisc or lsof): the reaper cannot look"
        ready = self.work / "leak.json"
        log = self.work / "leak.log"
        with log.open("ab") as fh:  # a file, not a pipe: the orphan keeps its output open
            helper = subprocess.run([sys.executable, str(CUDA_SIDE), "leak", str(ready)], stdin=subprocess.DEVNULL,
                                    stdout=fh, stderr=subprocess.STDOUT, timeout=60, check=False)
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            return FAIL, (f"the leaking child never allocated (helper exit {helper.returncode}): "
                          f"{tail(log.read_text(errors='replace'))}")
        self.leaked = json.loads(ready.read_text())
        pid = self.leaked["pid"]
        ppid = proc_ppid(pid)
        if ppid == os.getpid():
            return FAIL, f"pid {pid} is still this check's child, not an orphan"
        self.leak_listed = pid in smi_compute_pids()
        rc, doc, err = self.agent(self.work / "root-reap", "reap", "--min-age-s", "0", "--resample-s", "1")
        if doc is None:
            return FAIL, f"reap exited {rc} without a document: {err.strip()[-300:]}"
        found = [c for c in doc.get("candidates", []) if c.get("pid") == pid]
        where = f"orphan pid {pid} (parent {ppid}) holds {self.leaked['bytes'] >> 20} MiB"
        if self.leak_listed:
            listed = doc.get("excluded", {}).get("listed by nvidia-smi", 0)
            if found or not listed:
                return FAIL, f"{where}; nvidia-smi lists it, yet reap {'named it' if found else 'did not say so'}"
            return PASS, f"{where}; nvidia-smi lists it, so reap leaves it alone (excluded: listed by nvidia-smi)"
        if not found:
            return FAIL, f"{where}; nvidia-smi does not list it, yet reap did not find it: {doc.get('excluded')}"
        return PASS, f"{where}; reap lists it: {found[0]['comm']} on {','.join(found[0]['devices'])}"

    def check_reap_kill(self) -> tuple[str, str]:
        if self.leaked is None:
            return SKIP, "no leaked context (see reap find)"
        if self.leak_listed:
            return SKIP, ("nvidia-smi lists the leaked pid on this machine, so the reaper never kills it; the kill "
                          "path needs a host whose nvidia-smi cannot see the pid (a container)")
        pid = self.leaked["pid"]
        before = smi_memory_used()
        rc, doc, err = self.agent(self.work / "root-reap", "reap", "--force", "--min-age-s", "0",
                                  "--resample-s", "1")
        if doc is None:
            return FAIL, f"reap --force exited {rc} without a document: {err.strip()[-300:]}"
        outcome = {k["pid"]: k["outcome"] for k in doc.get("killed", [])}.get(pid)
        if outcome not in ("terminated", "killed") or same_process(pid, self.leaked["start_ticks"]):
            return FAIL, f"pid {pid}: outcome {outcome!r}, exit {rc}"
        freed = 0.0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            freed = sum(before.values()) - sum(smi_memory_used().values())
            if freed >= 0.9 * (self.leaked["bytes"] >> 20):
                break
            time.sleep(0.5)
        status = PASS if freed >= 0.9 * (self.leaked["bytes"] >> 20) else FAIL
        return status, f"pid {pid} {outcome}; GPU memory used fell by {freed:.0f} MiB"

    def cleanup(self) -> None:
        if self.leaked and same_process(self.leaked["pid"], self.leaked["start_ticks"]):
            os.kill(self.leaked["pid"], signal.SIGKILL)


def proc_ppid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[1])


def same_process(pid: int, start_ticks: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text[text.rindex(")") + 2:].split()
    return fields[0] not in ("Z", "X") and int(fields[19]) == start_ticks


def smi_compute_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60, check=False).stdout
    return {int(s) for s in out.split() if s.isdigit()}


def smi_memory_used() -> dict[int, float]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=False).stdout
    used = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            used[int(parts[0])] = float(parts[1])
    return used
