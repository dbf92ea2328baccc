"""Helpers of the host-retry and host-stall tests (tests/integration/test_host_retries.py,
test_host_stalls.py): their stdlib trainer appends ``ATTEMPT PID START_STEP`` to ``launches.log`` and
checkpoints ``{"step": N}`` to ``ckpt.json``; these read what it and the host's agent left."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from orchestrator.core import protocol
from orchestrator.ledger import Ledger


def write_project(base: Path, trainer: str, toml: str, lines: list[str]) -> Path:
    """A project with ``trainer`` as train.py, ``toml`` as gpuq.toml and a queue of ``lines``; its queue."""
    work = base / "project"
    work.mkdir(parents=True)
    (work / "train.py").write_text(trainer)
    (work / "gpuq.toml").write_text(toml)
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def job_dirs(root: Path) -> dict[str, Path]:
    """job name -> its directory under a host's data dir."""
    out = {}
    for spec in root.glob(f"{protocol.JOBS_DIR}/*/{protocol.SPEC_FILE}"):
        out[json.loads(spec.read_text())["name"]] = spec.parent
    return out


def launches(job_dir: Path) -> list[tuple[int, int, int]]:
    """(attempt, trainer pid, step it started from) of every launch of the job's trainer."""
    path = job_dir / protocol.RUN_DIR / "launches.log"
    lines = path.read_text().split() if path.is_file() else []
    return [(int(lines[i]), int(lines[i + 1]), int(lines[i + 2])) for i in range(0, len(lines) - 2, 3)]


def checkpointed_step(job_dir: Path) -> int:
    """The last step the job's trainer checkpointed (0: none yet)."""
    try:
        return int(json.loads((job_dir / protocol.RUN_DIR / "ckpt.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def attempt_dir(job_dir: Path, n: int) -> Path:
    return job_dir / protocol.ATTEMPTS_DIR / str(n)


def ledger_view(home: Path, job_id: str) -> tuple[str, list[tuple[int, str]], list[str]]:
    """(job state, [(attempt, state)], history messages) from the ledger."""
    ledger = Ledger(home / "ledger.db")
    try:
        job = ledger.job(job_id)
        attempts = [(a.number, a.state) for a in ledger.attempts(job_id)]
        return job.state, attempts, [e.message for e in ledger.events(subject=job_id, limit=200)]
    finally:
        ledger.close()


def agent_pid(root: Path) -> int:
    return int(json.loads((root / protocol.AGENT_PID).read_text())["pid"])


class Concurrent(threading.Thread):
    """A gpuq command started now, in a process of its own, while the test goes on (a kill)."""

    def __init__(self, gpuq: Callable[..., subprocess.CompletedProcess[str]], *args: str) -> None:
        super().__init__(daemon=True)
        self.gpuq, self.args = gpuq, args
        self.result: subprocess.CompletedProcess[str] | None = None
        self.start()

    def run(self) -> None:
        self.result = self.gpuq(*self.args)

    def succeeded(self) -> bool:
        self.join(timeout=300)
        return self.result is not None and self.result.returncode == 0
