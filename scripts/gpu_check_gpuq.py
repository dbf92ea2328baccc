"""The controller's side of scripts/gpu_check.py: the row "gpuq local", a sweep submitted with the real
``gpuq`` to this machine's local host and run on its GPUs (docs/health.md).

Two one-GPU jobs of the example trainer go through ``gpuq submit --host local --wait``: the agent finds
the GPUs with the real nvidia-smi, the wrapper's preflight asks the job's torch whether it sees its GPU,
torchrun trains on it, finalize loads ``best.pt``, and ``gpuq results --json`` and ``gpuq pull`` report
them.  The row passes when every job SUCCEEDED on a GPU slot, its log says it trained on ``cuda:0``, the
pull verified it, and what ``results`` says each attempt ran with is what this machine has: the GPU
model, driver, CUDA, torch and NCCL versions as torch and nvidia-smi give them here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_check_agent import FAIL, PASS, tail

REPO = Path(__file__).resolve().parents[1]
JOBS = (("baseline", 2), ("wide", 2))


class GpuqChecks:
    """The row "gpuq local"."""

    work: Path
    n: int
    probe: dict[str, Any]

    def gpuq(self, home: Path, cwd: Path, *args: str, timeout: float = 900,
             extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        env["GPUQ_HOME"] = str(home)
        env.update(extra or {})
        return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd, stdin=subprocess.DEVNULL, check=False)

    def check_gpuq_local(self) -> tuple[str, str]:
        project = self.work / "gpuq-project"
        home = self.work / "gpuq-home"
        (project / "configs").mkdir(parents=True, exist_ok=True)
        for name, _ in JOBS:
            shutil.copy(REPO / "payload" / "configs" / f"{name}.yaml", project / "configs" / f"{name}.yaml")
        (project / "queue.txt").write_text("".join(f"configs/{name}.yaml classify {epochs} gpus=1\n"
                                                   for name, epochs in JOBS))
        try:
            return self._sweep(project, home)
        finally:
            self.gpuq(home, project, "hosts", "stop-agent", "local", timeout=120)

    def _sweep(self, project: Path, home: Path) -> tuple[str, str]:
        done = self.gpuq(home, project, "submit", "queue.txt", "--host", "local", "--wait")
        if done.returncode != 0:
            return FAIL, f"gpuq submit --wait exited {done.returncode}: {tail(done.stdout + done.stderr)}"
        shown = self.gpuq(home, project, "results", "--json", timeout=120)
        if shown.returncode != 0:
            return FAIL, f"gpuq results --json exited {shown.returncode}: {tail(shown.stderr)}"
        jobs = json.loads(shown.stdout)["jobs"]
        want = self.machine()
        problems = [] if len(jobs) == len(JOBS) else [f"{len(jobs)} jobs in results, want {len(JOBS)}"]
        for job in jobs:
            problems += [f"{job['name']}: {p}" for p in self.job_problems(home, project, job, want)]
        pulled = self.gpuq(home, project, "pull", "--json", timeout=300)
        if pulled.returncode != 0:
            problems.append(f"gpuq pull exited {pulled.returncode}: {tail(pulled.stdout + pulled.stderr)}")
        if problems:
            return FAIL, "; ".join(problems)[:600]
        ran = jobs[0]["ran_with"]
        return PASS, (f"{len(jobs)} jobs SUCCEEDED on {ran['gpu_count']} x {ran['gpu_model']}, trained on "
                      f"cuda:0, pulled and verified; ran with driver {ran['driver']}, CUDA {ran['cuda']}, "
                      f"torch {ran['torch']}, NCCL {ran['nccl']}")

    def machine(self) -> dict[str, Any]:
        """What each attempt must say it ran with, from torch (the CUDA side's probe) and nvidia-smi."""
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=False).stdout
        p = self.probe
        return {"slot_kind": "gpu", "gpu_count": 1, "gpu_model": p["names"][0],
                "driver": out.split()[0] if out.split() else None, "cuda": p["cuda"],
                "torch": p["torch"], "nccl": p["nccl_version"]}

    def job_problems(self, home: Path, project: Path, job: dict[str, Any], want: dict[str, Any]) -> list[str]:
        problems = []
        if job["state"] != "SUCCEEDED":
            problems.append(f"state {job['state']} ({job.get('error')})")
        ran = job.get("ran_with") or {}
        for key, value in want.items():
            if value is not None and ran.get(key) != value:
                problems.append(f"ran_with.{key} is {ran.get(key)!r}, this machine has {value!r}")
        log = self.gpuq(home, project, "logs", job["id"], timeout=120)
        if "device=cuda:0" not in log.stdout:
            problems.append(f"its log does not say device=cuda:0: {tail(log.stdout + log.stderr, 200)}")
        return problems

    def check_host_retry(self) -> tuple[str, str]:
        """A one-GPU job whose CUDA rank is SIGKILLed after its first checkpoint, with no gpuq command
        running: the host's agent starts attempt 2 with resume by itself (docs/checkpoints.md, "Who
        retries what"), the next gpuq command records it, and the job ends SUCCEEDED in 2 attempts."""
        project = self.work / "gpuq-retry-project"
        home = self.work / "gpuq-retry-home"
        (project / "configs").mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "payload" / "configs" / "baseline.yaml", project / "configs" / "baseline.yaml")
        (project / "queue.txt").write_text("configs/baseline.yaml classify 8 gpus=1 retries=1 name=victim\n")
        extra = {"GPUQ_CKPT_INTERVAL_S": "1"}
        try:
            return self._host_retry(project, home, extra)
        finally:
            self.gpuq(home, project, "hosts", "stop-agent", "local", "--force", timeout=120)

    def _host_retry(self, project: Path, home: Path, extra: dict[str, str]) -> tuple[str, str]:
        sent = self.gpuq(home, project, "submit", "queue.txt", "--host", "local", "--json", extra=extra)
        if sent.returncode != 0:
            return FAIL, f"gpuq submit exited {sent.returncode}: {tail(sent.stdout + sent.stderr)}"
        (job_id,) = [j["id"] for j in json.loads(sent.stdout)["jobs"]]
        root = home / "local" / "jobs" / job_id
        if not _until(lambda: (root / "ckpt" / "LATEST").is_file(), 300):
            return FAIL, "no checkpoint within 300 s"
        ranks = _ranks_of(job_id)
        if not ranks:
            return FAIL, "no trainer rank of the job found in /proc"
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        decided = root / "attempts" / "1" / "next.json"
        if not _until(lambda: (root / "attempts" / "2").is_dir() and decided.is_file(), 60):
            return FAIL, f"the host started no attempt 2 within 60 s of the kill ({decided} missing)"
        after = time.monotonic() - killed
        by = json.loads(decided.read_text()).get("by")
        waited = self.gpuq(home, project, "wait", "--timeout", "600", timeout=700, extra=extra)
        if waited.returncode != 0:
            return FAIL, f"gpuq wait exited {waited.returncode}: {tail(waited.stdout + waited.stderr)}"
        listed = self.gpuq(home, project, "logs", job_id, "--attempts", timeout=120).stdout
        log = self.gpuq(home, project, "logs", job_id, timeout=120).stdout
        problems = [] if by == "host" else [f"attempts/1/next.json says by {by!r}"]
        rows = [line for line in listed.splitlines() if line.strip()[:1].isdigit()]
        if len(rows) != 2:
            problems.append(f"{len(rows)} attempts listed, want 2: {tail(listed)}")
        if "GPUQ_RESUMED" not in log or "device=cuda:0" not in log:
            problems.append(f"attempt 2's log shows no resume on cuda:0: {tail(log)}")
        if problems:
            return FAIL, "; ".join(problems)[:600]
        return PASS, (f"{len(ranks)} rank(s) SIGKILLed after a checkpoint; the host started attempt 2 "
                      f"{after:.1f} s later with resume, on cuda:0; SUCCEEDED in 2 attempts")


def _until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _ranks_of(job_id: str) -> list[int]:
    """The job's trainer ranks (train.py under torchrun, not torchrun itself nor gpuq's wrapper)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if f"GPUQ_JOB_ID={job_id}".encode() not in environ:
            continue
        if any(w.endswith("train.py") for w in words) and not any("torchrun" in w or "distributed.run" in w
                                                                  or "gpuq_wrap" in w for w in words):
            found.append(int(entry.name))
    return found
