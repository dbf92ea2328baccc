#!/usr/bin/env python3
"""Wall time of the host agent's ``status --json`` (the patrol's one probe per host) over a root with
many finished jobs, interpreter start included.

Builds a throw-away agent root with ``--jobs`` exited attempts (launch record, process group record,
heartbeat, a log line, exit record and checkpoint pointer each, as the integration tests lay them out)
and one queued job, then runs ``python payload/agent/gpuq_agent.py --root R status --json`` ``--repeat``
times and prints the median, p90 and max wall time and the median CPU time of a call.

    python scripts/bench_agent_status.py [--jobs 100] [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.host_documents import unframe

AGENT = Path(__file__).resolve().parents[1] / "payload" / "agent" / "gpuq_agent.py"


def spec(job_id: str, name: str) -> dict[str, object]:
    """A one-GPU job spec as the controller writes it (the agent reads nothing more here)."""
    return {
        "schema": "gpuq.job/1",
        "job_id": job_id,
        "name": name,
        "queue_id": "q1",
        "attempt": 1,
        "task": "cls",
        "epochs": 2,
        "gpus": 1,
        "nodes": 1,
        "seed": None,
        "config": "configs/x.json",
        "bundle_sha": "f" * 64,
        "entry": "payload/train.py",
        "launcher": "python",
        "python": "",
        "verify": ["metrics"],
        "heartbeat_s": 1,
        "ckpt_interval_s": 600,
        "kill_grace_s": 2,
        "min_free_gb": 0,
        "scratch_gb": 0,
        "durable_dir": "",
        "resume_from": None,
        "spec_hash": "h" + job_id,
        "env": {},
        "created_at": 1000.0,
    }


def build(root: Path, jobs: int) -> None:
    for d in ("inbox", "claimed", "withdrawn", "jobs"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "inbox" / "c000000000000.json").write_text(json.dumps(spec("c000000000000", "queued")))
    for i in range(1, jobs + 1):
        job_id = f"c{i:012x}"
        (root / "claimed" / f"{job_id}.json").write_text(json.dumps(spec(job_id, f"done{i}")))
        adir = root / "jobs" / job_id / "attempts" / "1"
        adir.mkdir(parents=True)
        (adir / "launch.json").write_text(json.dumps({"time": "2024-01-01T00:00:00.000Z", "slots": [0]}))
        (adir / "pgid").write_text(json.dumps({"pgid": 999999, "start_ticks": 1, "boot_id": "x"}))
        (adir / "heartbeat").write_text(json.dumps({"step": 5, "epoch": 1}))
        (adir / "job.log").write_text("hello\n")
        (adir / "exit.json").write_text(json.dumps({"wrapper_code": 0}))
        ckpt = root / "jobs" / job_id / "ckpt"
        ckpt.mkdir()
        (ckpt / "LATEST").write_text(json.dumps({"file": "latest.pt", "step": 5}))


def cpu_of_children() -> float:
    """User plus system CPU seconds of this process's waited-for children so far."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-status-") as tmp:
        root = Path(tmp) / "root"
        build(root, args.jobs)
        times, cpus = [], []
        for _ in range(args.repeat):
            c0 = cpu_of_children()
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, str(AGENT), "--root", str(root), "status", "--json"],
                capture_output=True,
                text=True,
                check=False,
            )
            times.append(time.perf_counter() - t0)
            cpus.append(cpu_of_children() - c0)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
        got = len(json.loads(unframe(out.stdout)[0])["jobs"])
    times.sort()
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    print(
        f"agent status --json, {got} jobs, {args.repeat} runs: median {statistics.median(times):.3f}s "
        f"p90 {p90:.3f}s max {times[-1]:.3f}s; CPU (user+sys) median {statistics.median(cpus):.3f}s "
        f"(interpreter start included)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
