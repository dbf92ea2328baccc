"""A throw-away gpuq project for benchmarks: a tiny real-payload config and a queue of N jobs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TINY_CONFIG = """seed: 3
batch_size: 32
model: {width: 32, depth: 1, dropout: 0.0}
data: {n_train: 256, n_val: 64, n_features: 8, n_classes: 4, noise: 1.0}
augment: {noise_std: 0.1, feature_drop: 0.0}
optim: {lr: 0.05, momentum: 0.9, weight_decay: 0.0}
schedule: {warmup_steps: 1, kind: constant}
ckpt_every_steps: 0
log_every_steps: 4
"""


def make_project(prefix: str, jobs: int) -> tuple[Path, Path]:
    """A fresh GPUQ_HOME (set in the environment) and a queue of ``jobs`` one-epoch jobs.

    Returns (temp dir, queue file).
    """
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["GPUQ_HOME"] = str(tmp / "home")
    work = tmp / "project"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "tiny.yaml").write_text(TINY_CONFIG)
    lines = [f"configs/tiny.yaml classify 1 name=j{i:03d}" for i in range(jobs)]
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return tmp, work / "queue.txt"


def add_history(ctx: object, workdir: Path, bundle_sha: str, jobs: int, per_sweep: int = 200) -> int:
    """``jobs`` finished jobs in sweeps of ``per_sweep`` (``qhist000``...), added through
    ``Ledger.add_sweep`` and marked SUCCEEDED with one exited attempt each by direct SQL (synthetic
    history: setup speed only).  Returns how many jobs the ledger holds."""
    import sqlite3

    from orchestrator.core.specs import JobSpec

    ledger = ctx.ledger  # type: ignore[attr-defined]
    for s in range(jobs // per_sweep):
        specs = [JobSpec(name=f"cell{i:04d}", config="configs/tiny.yaml", task="classify",
                         config_sha256="0" * 64, line=i + 1) for i in range(per_sweep)]
        ledger.add_sweep(sweep_id=f"qhist{s:03d}", queue_path="history.txt", workdir=str(workdir),
                         queue_text="", jobs=specs, default_retries=1, bundle_sha=bundle_sha)
    conn = sqlite3.connect(ctx.settings.ledger_path)  # type: ignore[attr-defined]
    conn.execute("UPDATE job SET state = 'SUCCEEDED', attempt_count = 1 WHERE sweep_id LIKE 'qhist%'")
    conn.execute("""INSERT INTO attempt (job_id, number, host, state, bundle_sha, resume_from, created_at,
                    exit_code, message, step, total_steps, epoch, loss)
                    SELECT id, 1, 'local', 'EXITED', '', '', created_at, 0, 'exit 0', 100, 100, 1, 0.1
                    FROM job WHERE sweep_id LIKE 'qhist%'""")
    conn.commit()
    total = int(conn.execute("SELECT count(*) FROM job").fetchone()[0])
    conn.close()
    return total


def stop_local_agent(home: Path) -> None:
    """Stop the agent this benchmark started, by the process group it recorded (never by pattern)."""
    import json
    import signal

    pid_file = home / "local" / "agent.pid"
    try:
        record = json.loads(pid_file.read_text())
        os.killpg(int(record["pgid"]), signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        pass


def time_one_job(ctx: object, queue: Path, who: str) -> tuple[float, object]:
    """Submit a one-job queue, wait for it, and return (submit -> end in seconds, its last attempt);
    exits naming ``who`` unless the job SUCCEEDED with a start and end recorded."""
    import time

    from orchestrator import api

    t0 = time.perf_counter()
    result = api.submit(ctx, queue)  # type: ignore[arg-type]
    api.wait(ctx, sweep=result.sweep_id, interval_s=0.5, timeout_s=300)  # type: ignore[arg-type]
    took = time.perf_counter() - t0
    (job,) = ctx.ledger.jobs(sweep_id=result.sweep_id)  # type: ignore[attr-defined]
    att = ctx.ledger.attempts(job.id)[-1]  # type: ignore[attr-defined]
    if job.state != "SUCCEEDED" or att.started_at is None or att.ended_at is None:
        raise SystemExit(f"{who}: job {job.name} ended {job.state}: {att.message}")
    return took, att
