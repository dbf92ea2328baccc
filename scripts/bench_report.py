"""Benchmark: `gpuq report` on a ledger of 2,000 finished jobs with 200 steps of curves each
(targets: the table under 2 s, the HTML page with curves under 20 s).

Builds a GPUQ_HOME in a temp dir: one sweep of CELLS cells x SEEDS seeds (`seeds=` lines), every job
SUCCEEDED with final/best val_acc and 200-point val_acc and loss curves recorded the way a collect
records them (tick.collect.record_collected).  Then times, as a user runs them (a fresh
`python -m orchestrator` process each, output to a file), the median of 3 runs of: the table,
`--format json`, `--format csv` and `--format html -o DIR`, and prints each against its target.

    python scripts/bench_report.py [--cells 200] [--seeds 10] [--points 200]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core.states import AttemptState, JobState  # noqa: E402
from orchestrator.host_documents import CollectDocument  # noqa: E402
from orchestrator.ledger import Ledger  # noqa: E402
from orchestrator.queue.queuefile import parse_queue  # noqa: E402
from orchestrator.tick.collect import record_collected  # noqa: E402


def build(home: Path, project: Path, cells: int, seeds: int, points: int) -> int:
    (project / "configs").mkdir(parents=True)
    lines = []
    for c in range(cells):
        (project / "configs" / f"c{c}.yaml").write_text(f"width: {c}\n")
        lines.append(f"configs/c{c}.yaml classify 3 name={'baseline' if c == 0 else f'cell{c}'} seeds={seeds}")
    queue = project / "queue.txt"
    queue.write_text("\n".join(lines) + "\n")
    ledger = Ledger(home / "ledger.db")
    jobs = ledger.add_sweep(sweep_id="qbench1", queue_path=str(queue), workdir=str(project),
                            queue_text=queue.read_text(), jobs=parse_queue(queue).jobs, default_retries=0)
    rng = random.Random(7)
    docs: dict[str, object] = {}
    for job in jobs:
        ledger.start_attempt(job.id, host="local", bundle_sha="s")
        ledger.transition(job.id, AttemptState.EXITED, attempt=1)
        ledger.transition(job.id, JobState.SUCCEEDED)
        level = 0.8 + 0.1 * rng.random()
        steps = [round(s * 1000 / (points - 1)) for s in range(points)]
        acc = [[s, level * (1 - math.exp(-s / 150)) + rng.gauss(0, 0.005)] for s in steps]
        loss = [[s, 2.5 * math.exp(-s / 120) + 0.01 + abs(rng.gauss(0, 0.002))] for s in steps]
        docs[job.id] = {"attempt": 1, "summary": {
            "final": {"val_acc": acc[-1][1], "step": 1000}, "best": {"val_acc": max(v for _, v in acc), "step": 900},
            "curves": {"val_acc": acc, "loss": loss}}}
    record_collected(ledger, CollectDocument.model_validate(docs).root)  # as the edge checks a host's answer
    return len(jobs)


def timed(argv: list[str], env: dict[str, str], out: Path, runs: int = 3) -> float:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        with open(out, "w") as fh:
            subprocess.run([sys.executable, "-m", "orchestrator", *argv], env=env, stdout=fh, check=True, cwd=ROOT)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--points", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-report-") as tmp:
        home, project = Path(tmp) / "home", Path(tmp) / "project"
        home.mkdir()
        os.environ["GPUQ_HOME"] = str(home)
        start = time.perf_counter()
        n = build(home, project, args.cells, args.seeds, args.points)
        built = time.perf_counter() - start
        env = {**os.environ, "GPUQ_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
        out = Path(tmp) / "out.txt"
        print(f"{n} finished jobs ({args.cells} cells x {args.seeds} seeds), {args.points} points x 2 curves each; "
              f"ledger built in {built:.1f} s ({(home / 'ledger.db').stat().st_size / 2**20:.0f} MiB)")
        rows = [("table", [], 2.0), ("json", ["--format", "json"], 2.0), ("csv", ["--format", "csv"], 2.0),
                ("html with curves", ["--format", "html", "-o", str(Path(tmp) / "html")], 20.0)]
        for label, extra, target in rows:
            took = timed(["report", *extra], env, out)
            print(f"  gpuq report {label:<18} {took:6.2f} s   target {target:4.0f} s   ratio {took / target:.2f}")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestrator", "--help"], env=env, stdout=subprocess.DEVNULL,
                       check=True, cwd=ROOT)
        print(f"  (gpuq --help, the start-up floor: {time.perf_counter() - start:.2f} s)")


if __name__ == "__main__":
    main()
