#!/usr/bin/env python3
"""GPU check: gpuq's CUDA paths on the GPUs this machine has (world size = GPU count, 1 allowed).

    pip install -e '.[train]'        # on the GPU machine, from a clean checkout
    python scripts/gpu_check.py      # about two minutes; --keep DIR keeps every log and run directory

Checks, in this order (the agent's probes first, while nothing of this check holds a GPU):

  torch           torch sees CUDA GPUs, NCCL is available, torch >= 2.3 (the train extra's floor)
  agent status    the host agent's ``status --json`` on a fresh root parses the real nvidia-smi:
                  one GPU per device, names, UUIDs, memory and temperature read, GPU slots
  agent health    the agent's ``health`` preflight (dmon samples, this interpreter's torch): the
                  document has every check and every GPU's fields; the verdict is not FAIL
  train nccl      payload/train.py under torchrun with one process per GPU: NCCL process group
                  (NCCL_DEBUG=INFO shows each rank on its own cudaDev: set_device), AMP on, exit 0
  amp scaler      autocast float16 and torch.amp.GradScaler("cuda"): finite steps apply, an inf
                  gradient is skipped and halves the scale; the training run's checkpoints carry
                  the scaler's state
  resume          the same run stopped by SIGTERM after its first checkpoint, then relaunched,
                  ends with the weights (sha256) and evals of the uninterrupted run, with
                  deterministic algorithms (CUBLAS_WORKSPACE_CONFIG=:4096:8)
  checkpoint      --ckpt-mib MiB of CUDA tensors saved and loaded through the payload's atomic
                  checkpoint code (fsync, sha256 verified), bit-equal; MB/s both ways
  gpuq local      two one-GPU jobs through the real `gpuq submit --host local --wait`, `results` and
                  `pull`: SUCCEEDED on a GPU slot, trained on cuda:0, verified, and what each attempt
                  says it ran with (GPU model, driver, CUDA, torch, NCCL) is what this machine has
  host retry      a one-GPU job's CUDA rank SIGKILLed after its first checkpoint, no gpuq command
                  running: the host's agent starts attempt 2 with resume by itself; SUCCEEDED in 2 attempts
  reap find       a child that allocates CUDA memory and is orphaned: the agent's ``reap`` lists
                  it, or (where nvidia-smi lists its pid) leaves it to nvidia-smi by design
  reap kill       ``reap --force`` kills it and its GPU memory comes back (SKIP where nvidia-smi
                  lists the pid: the reaper rightly never kills those)

Prints one table row per check: PASS, FAIL or SKIP (with why), seconds and details.
Exit 0: no FAIL; 1: a check failed; 2: usage, or torch missing (install the train extra);
77: no CUDA GPU on this machine, nothing was checked (never a pass).
CI does not run this; docs/health.md says when to.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_check_agent import FAIL, PASS, SKIP, AgentChecks, tail
from gpu_check_gpuq import GpuqChecks

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "payload" / "train.py"
CUDA_SIDE = Path(__file__).resolve().parent / "gpu_check_cuda.py"

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NO_GPU = 77  # the automake convention for "skipped": nothing here could be checked

CHECKS = ("torch", "agent status", "agent health", "train nccl", "amp scaler", "resume", "checkpoint",
          "gpuq local", "host retry", "reap find", "reap kill")
MIN_TORCH = (2, 3)
EPOCHS = 3
STEP_SLEEP_S = 0.25  # the interrupted run's steps are slow, so the SIGTERM lands mid-run at any speed
CONFIG = """\
seed: 5
batch_size: 32
model: {width: 256, depth: 3, dropout: 0.1}
data: {n_train: 8192, n_val: 512, n_features: 32, n_classes: 8, noise: 2.0}
augment: {noise_std: 0.2, feature_drop: 0.1}
optim: {lr: 0.05, momentum: 0.9, weight_decay: 0.0001}
schedule: {warmup_steps: 20, kind: cosine}
ckpt_every_steps: 8
log_every_steps: 8
"""
NCCL_RANK = re.compile(r"\brank (\d+) nranks (\d+) cudaDev (\d+)\b")
RESUMED = re.compile(r"GPUQ_RESUMED step=(\d+)")


@dataclass
class Result:
    name: str
    status: str
    seconds: float | None
    detail: str


def format_table(results: list[Result]) -> str:
    """The check table: name, status, seconds (blank when not timed), details."""
    width = max([len("check")] + [len(r.name) for r in results])
    lines = [f"{'check':<{width}}  {'result':<6}  {'seconds':>8}  details"]
    lines.append("-" * len(lines[0]))
    for r in results:
        secs = "" if r.seconds is None else f"{r.seconds:.2f}"
        lines.append(f"{r.name:<{width}}  {r.status:<6}  {secs:>8}  {r.detail}")
    return "\n".join(lines)


def exit_code(results: list[Result]) -> int:
    return EXIT_FAIL if any(r.status == FAIL for r in results) else EXIT_OK


def no_gpu_results(why: str) -> list[Result]:
    return [Result(name, SKIP, None, why) for name in CHECKS]


class Checker(AgentChecks, GpuqChecks):
    """Runs the checks in order; each one is a method returning (status, detail)."""

    def __init__(self, work: Path, probe: dict[str, Any], ckpt_mib: int) -> None:
        super().__init__()
        self.work = work
        self.probe = probe
        self.n = int(probe["count"])
        self.ckpt_mib = ckpt_mib
        self.results: list[Result] = []
        self.reference: Path | None = None

    def run(self, name: str, fn: Callable[[], tuple[str, str]]) -> None:
        t0 = time.monotonic()
        try:
            status, detail = fn()
        except Exception as exc:  # one check's crash is its FAIL row, the others still run
            status, detail = FAIL, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        result = Result(name, status, time.monotonic() - t0, detail)
        self.results.append(result)
        print(f"[{result.status}] {name} ({result.seconds:.1f} s): {detail}", flush=True)

    # ---------------------------------------------------------------- helpers
    def train_env(self, run_dir: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                    "GPUQ_DEVICE": "cuda", "GPUQ_CKPT_DIR": str(run_dir / "ckpt"),
                    "GPUQ_RESULT_DIR": str(run_dir / "result"), "GPUQ_HEARTBEAT": str(run_dir / "heartbeat"),
                    "GPUQ_HEARTBEAT_S": "1", "GPUQ_CKPT_INTERVAL_S": "3600", "GPUQ_JOB_ID": "gpucheck00001",
                    "GPUQ_ATTEMPT": "1"})
        env.update(extra)
        return env

    def train_cmd(self) -> list[str]:
        config = self.work / "config.yaml"
        config.write_text(CONFIG)
        local_addr: list[str] = []
        try:
            socket.getaddrinfo(socket.gethostname(), None)
        except OSError:  # as the agent does (gpuq_launch.local_addr_args): single-node talks over loopback
            local_addr = ["--local-addr=127.0.0.1"]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={self.n}", *local_addr, str(TRAIN), "--config", str(config),
                "--task", "classify", "--epochs", str(EPOCHS)]

    def start_train(self, run_dir: Path, log: Path, **extra: str) -> subprocess.Popen[bytes]:
        run_dir.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as fh:
            return subprocess.Popen(self.train_cmd(), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    env=self.train_env(run_dir, **extra), start_new_session=True)

    def cuda_side(self, *args: str, timeout: float = 600) -> dict[str, Any]:
        return run_cuda_side(*args, timeout=timeout)

    # ---------------------------------------------------------------- checks
    def check_torch(self) -> tuple[str, str]:
        p = self.probe
        version = tuple(int(x) for x in re.findall(r"\d+", str(p["torch"]))[:2])
        detail = (f"torch {p['torch']} CUDA {p['cuda']}, {self.n} GPU(s): {', '.join(p['names'])}; "
                  f"NCCL {p['nccl_version'] or ('available' if p['nccl'] else 'unavailable')}")
        if version < MIN_TORCH:
            return FAIL, f"{detail}; torch < {'.'.join(map(str, MIN_TORCH))}, the train extra's floor"
        if not p["nccl"]:
            return FAIL, detail
        return PASS, detail

    def check_train(self) -> tuple[str, str]:
        run_dir = self.work / "reference"
        log = self.work / "reference.log"
        proc = self.start_train(run_dir, log, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT")
        rc = proc.wait(timeout=1200)
        text = log.read_text(errors="replace")
        if rc != 0:
            return FAIL, f"torchrun exited {rc}; see {log}: {tail(text)}"
        problems = []
        if f"world_size={self.n} device=cuda:0" not in text or "amp=True" not in text:
            problems.append("the start line lacks world_size/device=cuda:0/amp=True")
        ranks = {(int(r), int(d)) for r, nr, d in NCCL_RANK.findall(text) if int(nr) == self.n}
        if self.n > 1 and ranks != {(r, r) for r in range(self.n)}:
            problems.append(f"NCCL rank -> cudaDev {sorted(ranks)}, want each rank on its own device "
                            "(set_device before init_process_group)")
        summary = json.loads((run_dir / "result" / "summary.json").read_text())
        if summary.get("world_size") != self.n:
            problems.append(f"summary world_size {summary.get('world_size')}")
        if problems:
            return FAIL, "; ".join(problems) + f"; see {log}"
        self.reference = run_dir
        rank_note = f"NCCL ranks on cudaDev {sorted(d for _, d in ranks)}" if ranks else "NCCL rank lines not logged"
        return PASS, (f"{summary['steps']} steps in {summary['train_seconds']:.1f} s, world {self.n}, "
                      f"val_acc {summary['final']['val_acc']:.3f}; {rank_note}")

    def check_amp(self) -> tuple[str, str]:
        doc = self.cuda_side("amp", timeout=300)
        finite, poisoned = doc["finite_steps"], doc["inf_step"]
        problems = []
        if not all(s["fp16"] for s in [*finite, poisoned]):
            problems.append("autocast did not produce float16")
        if not any(s["applied"] for s in finite):
            problems.append(f"no finite step was applied in {len(finite)} (scales {[s['scale'] for s in finite]})")
        if poisoned["applied"] or poisoned["scale_after"] != poisoned["scale"] / 2:
            problems.append(f"inf gradient: applied={poisoned['applied']}, scale {poisoned['scale']} -> "
                            f"{poisoned['scale_after']} (want skipped and halved)")
        if self.reference is None:
            problems.append("no training run to read the scaler state from (train nccl failed)")
        else:
            scaler = self.cuda_side("scaler", str(self.reference / "ckpt"), timeout=300)["scaler"]
            if not isinstance(scaler, dict) or not scaler.get("scale"):
                problems.append(f"the payload's checkpoint has no GradScaler state ({scaler!r})")
        if problems:
            return FAIL, "; ".join(problems)
        return PASS, (f"inf step skipped, scale {poisoned['scale']:g} -> {poisoned['scale_after']:g}; "
                      f"the payload's checkpoint holds scaler scale {scaler['scale']:g}")

    def check_resume(self) -> tuple[str, str]:
        if self.reference is None:
            return SKIP, "needs the uninterrupted run of 'train nccl', which failed"
        run_dir = self.work / "interrupted"
        log = self.work / "interrupted.log"
        proc = self.start_train(run_dir, log, GPUQ_TEST_HOOK_STEP_SLEEP_S=str(STEP_SLEEP_S))
        pointer = run_dir / "ckpt" / "LATEST"
        deadline = time.monotonic() + 600
        while not pointer.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        rc1 = proc.wait(timeout=300)
        first = log.read_text(errors="replace")
        if "stop requested by signal" not in first or (run_dir / "result" / "summary.json").exists():
            return FAIL, f"the run was not stopped mid-run by SIGTERM (exit {rc1}); see {log}: {tail(first)}"
        rc2 = self.start_train(run_dir, log).wait(timeout=1200)
        text = log.read_text(errors="replace")[len(first):]
        resumed = RESUMED.search(text)
        if rc2 != 0 or resumed is None:
            return FAIL, f"the relaunch exited {rc2}{'' if resumed else ' without resuming'}; see {log}: {tail(text)}"
        want = json.loads((self.reference / "result" / "summary.json").read_text())
        got = json.loads((run_dir / "result" / "summary.json").read_text())
        nondet = sorted({m for m in re.findall(r"(\w+) does not have a deterministic implementation", text)})
        same = [k for k in ("weights_sha256", "final", "best", "steps") if untimed(got.get(k)) == untimed(want.get(k))]
        detail = (f"stopped at exit {rc1}, resumed at step {resumed.group(1)} of {want['steps']}; "
                  f"weights_sha256 {got['weights_sha256'][:12]} vs {want['weights_sha256'][:12]}"
                  + (f"; non-deterministic ops warned: {', '.join(nondet)}" if nondet else ""))
        return (PASS if len(same) == 4 else FAIL), detail

    def check_checkpoint(self) -> tuple[str, str]:
        doc = self.cuda_side("checkpoint", str(self.ckpt_mib), str(self.work / "ckpt-speed"), timeout=600)
        mb = doc["bytes"] / 1e6
        detail = (f"{mb:.0f} MB: save {doc['save_s']:.2f} s ({mb / doc['save_s']:.0f} MB/s, with fsync and "
                  f"sha256), load {doc['load_s']:.2f} s ({mb / doc['load_s']:.0f} MB/s, sha256 verified, to GPU)")
        return (PASS if doc["equal"] else FAIL), detail + ("" if doc["equal"] else "; loaded tensors differ")



# --------------------------------------------------------------------- process helpers


def untimed(value: Any) -> Any:
    """An eval line without its wall-clock "time" (the only field two identical runs differ in)."""
    return {k: v for k, v in value.items() if k != "time"} if isinstance(value, dict) else value


def run_cuda_side(*args: str, timeout: float = 600) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(CUDA_SIDE), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("GPUQ_CHECK "):
            doc: dict[str, Any] = json.loads(line[len("GPUQ_CHECK "):])
            return doc
    raise RuntimeError(f"gpu_check_cuda.py {args[0]} exited {proc.returncode}: {tail(proc.stderr, 500)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, run directories)")
    ap.add_argument("--ckpt-mib", type=int, default=1024, help="size of the checkpoint speed check (MiB)")
    args = ap.parse_args(argv)
    if args.ckpt_mib < 16:
        ap.error("--ckpt-mib must be >= 16")
    try:
        probe = run_cuda_side("probe", timeout=300)
    except RuntimeError as exc:
        print(f"gpu_check: cannot import torch here ({exc}); install the train extra: pip install -e '.[train]'",
              file=sys.stderr)
        return EXIT_USAGE
    if not probe["available"] or probe["count"] < 1:
        why = (f"no CUDA GPU on this machine (torch {probe['torch']}, CUDA build {probe['cuda']}, "
               f"torch.cuda.is_available() {probe['available']}): nothing checked")
        print(f"gpu_check: {why}", flush=True)
        print(format_table(no_gpu_results("no CUDA GPU")))
        return EXIT_NO_GPU
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpuq-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {probe['count']} GPU(s), world size {probe['count']}; work dir {work}", flush=True)
    checker = Checker(work, probe, args.ckpt_mib)
    try:
        for name, fn in zip(CHECKS, (checker.check_torch, checker.check_status, checker.check_health,
                                     checker.check_train, checker.check_amp, checker.check_resume,
                                     checker.check_checkpoint, checker.check_gpuq_local, checker.check_host_retry,
                                     checker.check_reap_find,
                                     checker.check_reap_kill),
                            strict=True):
            checker.run(name, fn)
    finally:
        checker.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(format_table(checker.results))
    return exit_code(checker.results)


if __name__ == "__main__":
    raise SystemExit(main())
