"""gpuq training payload: a small DDP trainer with atomic, bit-exact resumable checkpoints.

Launch (docs/trainer-contract.md)::

    python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=N payload/train.py \
        --config <abs yaml> --task classify|regress --epochs E

or as a single plain process: ``python payload/train.py --config ... --task ... --epochs E``.
Paths come from GPUQ_CKPT_DIR, GPUQ_RESULT_DIR and GPUQ_HEARTBEAT (default ./gpuq_run/...).
Exit codes: 0 done, 1 non-finite loss, 3 transient (collective failure), 4 configuration error
(also a checkpoint from another world size or one failing its sha256), 143 stopped by SIGTERM/SIGINT.
GPUQ_SIGTERM_GRACE_S (seconds from SIGTERM to SIGKILL; unset/empty = unknown) decides whether the
last checkpoint on SIGTERM is written or skipped (gpuq_payload/grace.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpuq_payload import ConfigError, contract, grace, signals
from gpuq_payload.config import TASKS, load_config

PREFIX = "gpuq-payload"


def _env(name: str) -> str | None:
    """An environment value; an empty value counts as unset for the optional knobs read here."""
    value = os.environ.get(name)
    return value if value else None


def _env_float(name: str, default: float) -> float:
    raw = _env(name)
    if raw is None:
        return float(default)
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"environment {name}={raw!r} is not a number") from exc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="gpuq payload trainer")
    p.add_argument("--config", required=True, help="path to the ablation YAML")
    p.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)}")
    p.add_argument("--epochs", type=int, default=None, help="epochs (wins over the config's 'epochs')")
    return p.parse_args(argv)


class Settings:
    """Everything resolved before the process group exists (config errors surface here)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.config_path = os.path.abspath(args.config)
        self.cfg = load_config(self.config_path)
        if args.task not in TASKS:
            raise ConfigError(f"unknown task '{args.task}' (known: {', '.join(TASKS)})")
        self.task = args.task
        epochs = args.epochs if args.epochs is not None else self.cfg.get("epochs")
        if epochs is None:
            raise ConfigError(f"{self.config_path}: no epochs (pass --epochs or set key 'epochs')")
        if epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {epochs}")
        self.epochs = int(epochs)
        seed_env = _env(contract.ENV_SEED)
        try:
            self.seed = int(seed_env) if seed_env is not None else int(self.cfg["seed"])
        except ValueError as exc:
            raise ConfigError(f"environment {contract.ENV_SEED}={seed_env!r} is not an integer") from exc
        base = os.path.abspath("gpuq_run")
        self.ckpt_dir = _env(contract.ENV_CKPT_DIR) or os.path.join(base, "ckpt")
        self.result_dir = _env(contract.ENV_RESULT_DIR) or os.path.join(base, "result")
        self.heartbeat_path = _env(contract.ENV_HEARTBEAT) or os.path.join(base, contract.HEARTBEAT_FILE)
        self.heartbeat_s = _env_float(contract.ENV_HEARTBEAT_S, contract.DEFAULT_HEARTBEAT_S)
        self.ckpt_interval_s = _env_float(contract.ENV_CKPT_INTERVAL_S, contract.DEFAULT_CKPT_INTERVAL_S)
        self.dist_timeout_s = _env_float(contract.ENV_DIST_TIMEOUT_S, contract.DEFAULT_DIST_TIMEOUT_S)
        self.ckpt_on_sigterm = os.environ.get(contract.ENV_CKPT_ON_SIGTERM) != "0"
        # seconds from SIGTERM to SIGKILL (None = unknown: save on SIGTERM regardless, as always)
        self.sigterm_grace_s = grace.effective_grace(os.environ.get(contract.ENV_SIGTERM_GRACE_S))
        # TEST HOOK: a slow step, from the environment or the config (tests that interrupt a job mid-run)
        self.test_hook_step_sleep_s = _env_float(contract.ENV_TEST_HOOK_STEP_SLEEP_S,
                                                 float(self.cfg.get("test_hook_step_sleep_s") or 0.0))
        # TEST HOOK: torch's intra-op threads (0 = the OMP_NUM_THREADS the agent set).  The test hosts share
        # the machine's cores, so two threads of a 1-slot host spin against every other process there
        self.test_hook_threads = int(self.cfg.get("test_hook_threads") or 0)
        self.resume_from = _env(contract.ENV_RESUME_FROM)
        device = _env(contract.ENV_DEVICE)
        if device not in (None, "cpu", "cuda"):
            raise ConfigError(f"environment {contract.ENV_DEVICE}={device!r} must be 'cpu' or 'cuda'")
        self.device = device
        self.meta = {
            "job_id": os.environ.get(contract.ENV_JOB_ID, ""),
            "attempt": os.environ.get(contract.ENV_ATTEMPT, ""),
            "spec_hash": os.environ.get(contract.ENV_SPEC_HASH, ""),
            "bundle_sha": os.environ.get(contract.ENV_BUNDLE_SHA, ""),
            "config": self.config_path,
            "task": self.task,
            "seed": self.seed,
        }


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    args = parse_args(argv)
    try:
        settings = Settings(args)
    except ConfigError as exc:
        if rank == 0:
            print(f"{PREFIX}: config error: {exc}", file=sys.stderr, flush=True)
        return contract.EXIT_CONFIG
    signals.install()
    signals.die_with_parent()

    import torch
    from gpuq_payload.checkpoint import CheckpointError
    from gpuq_payload.distributed import Dist
    from gpuq_payload.trainer import Trainer

    if settings.test_hook_threads:
        torch.set_num_threads(settings.test_hook_threads)
    want_cuda = torch.cuda.is_available() and settings.device != "cpu"
    if settings.device == "cuda" and not torch.cuda.is_available():
        if rank == 0:
            print(f"{PREFIX}: config error: {contract.ENV_DEVICE}=cuda but CUDA is unavailable",
                  file=sys.stderr, flush=True)
        return contract.EXIT_CONFIG
    dist = None
    try:
        dist = Dist(settings.dist_timeout_s, want_cuda)
        return Trainer(settings, dist).run()
    except (ConfigError, CheckpointError) as exc:
        if rank == 0:
            print(f"{PREFIX}: config error: {exc}", file=sys.stderr, flush=True)
        return contract.EXIT_CONFIG
    except Exception as exc:
        if _is_transient(exc):
            msg = " ".join(str(exc).split())[:300]
            print(f"{PREFIX}: transient failure on rank {rank}: {type(exc).__name__}: {msg}",
                  file=sys.stderr, flush=True)
            return contract.EXIT_TRANSIENT
        raise
    finally:
        if dist is not None:
            dist.close()


def _is_transient(exc: BaseException) -> bool:
    import torch.distributed as tdist

    dist_errors = tuple(getattr(tdist, n) for n in ("DistError", "DistBackendError", "DistNetworkError",
                                                    "DistStoreError") if hasattr(tdist, n))
    if dist_errors and isinstance(exc, dist_errors):
        return True
    text = str(exc).lower()
    markers = ("timed out", "timeout", "connection reset", "connection closed", "broken pipe",
               "nccl error", "gloo", "socket")
    return isinstance(exc, (RuntimeError, ConnectionError, TimeoutError)) and any(m in text for m in markers)


def record_exit(code: int, message: str = "") -> None:
    """Leave the deliberate exit code where the wrapper finds it: torchrun reports any worker
    failure as a bare 1, which would hide a configuration error (4) or a transient one (3).
    First writer wins, so the rank that failed first names the cause, not a rank that merely
    lost its peers afterwards."""
    path = os.environ.get(contract.ENV_EXIT_FILE)
    if not path or code == 0:
        return
    doc = {"code": code, "rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(), "message": message[:500]}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


def run() -> int:
    try:
        code = main()
    except Exception as exc:  # a crash: record it (exit 1) before the traceback, then let it propagate
        record_exit(1, f"{type(exc).__name__}: {exc}")
        raise
    record_exit(code)
    return code


if __name__ == "__main__":
    exit_code = run()
    # Every result is written and fsynced and the process group destroyed by now.  Skip the
    # interpreter's finalization: torch's C++ worker threads (gloo) can abort it (SIGABRT) after
    # a clean finish, and torchrun would then report a finished run as a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
