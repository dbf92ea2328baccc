"""A user's project for end-to-end sweeps: the tiny benchmark config with checkpoints every few steps
(and, for a job that must be interrupted mid-run, a sleep in every step), a queue file, and what a
finished job left behind (its newest checkpoint step, its final weights' sha256)."""

from __future__ import annotations

import json
from pathlib import Path

from scripts.bench_project import TINY_CONFIG

CKPT_EVERY = 4


# TEST HOOK: one torch thread per rank.  A 1-GPU test host (and a Slurm job of one GPU) gets the agent's
# thread cap of 2 on a 2-core machine, whose cores every test host and worker share: torch's two OpenMP
# threads then spin at each barrier while the other waits for a core (a 2-epoch baseline run: 20 s of CPU
# instead of 4.6 s, the same weights).  The weights do not depend on it (tiny matrices: one thread does
# every op either way), so an interrupted job and its twin still end equal.
THREADS = "test_hook_threads: 1\n"


def tiny_config(step_sleep_s: float = 0.0, n_train: int = 256) -> str:
    text = (TINY_CONFIG.replace("n_train: 256", f"n_train: {n_train}")
            .replace("ckpt_every_steps: 0", f"ckpt_every_steps: {CKPT_EVERY}")) + THREADS
    return text + (f"test_hook_step_sleep_s: {step_sleep_s}\n" if step_sleep_s else "")


def write_project(tmp_path: Path, configs: dict[str, str], lines: list[str]) -> Path:
    """``tmp_path/project`` with ``configs/<name>.yaml`` and ``queue.txt`` (returned)."""
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    for name, text in configs.items():
        (work / "configs" / f"{name}.yaml").write_text(text)
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def latest_step(job_dir: Path) -> int:
    """The step of the job's newest checkpoint (its ckpt/LATEST), -1 before the first."""
    try:
        return int(json.loads((job_dir / "ckpt" / "LATEST").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def final_weights(job_dir: Path) -> str:
    """The sha256 of the final weights the payload wrote into result/summary.json."""
    return str(json.loads((job_dir / "result" / "summary.json").read_text())["weights_sha256"])
