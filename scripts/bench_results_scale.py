#!/usr/bin/env python3
"""Benchmark: `gpuq results` and `gpuq report` on 1,000- and 10,000-job sweeps, and
`Ledger.events(subject=...)` with 1,000, 200,000 and 1,000,000 events in the table, each against
the bare-sqlite3 floor measured in the same run (targets: results and report <= 2 s at 10,000 jobs,
growth from 1k to 10k jobs <= 12x; an events read at 1M rows about what it costs at 1,000).

Each sweep is built in a throw-away GPUQ_HOME: jobs through ``Ledger.add_sweep`` (cells of SEEDS
seeds), then, with direct SQL (synthetic history; setup speed only), what a real sweep leaves:
1-3 attempts per job (preempted and lost ones before the last, multi-GPU jobs, some on a CPU-slot
host, priced hosts, provenance), final/best metrics and POINTS-point curves per succeeded job,
checkpoints, the job and attempt events and some "restarted from scratch" findings.

The commands run as a user runs them (a fresh ``python -m orchestrator`` process each, output to a
file, median of R runs), and the verbs alone (``api.results``, ``api.report.build_report``) in a
fresh interpreter after their imports, so what rendering and start-up add shows apart.  The floor is
a fresh ``python`` that reads the rows both verbs need (the sweep's jobs, attempts, final and best
metrics, checkpoints, findings, hosts) with bare sqlite3.  The events read is timed in-process (a
tick's cost), against the same rows read with bare sqlite3.

    python scripts/bench_results_scale.py [--jobs 1000 10000] [--seeds 10] [--points 50] [--repeat 3]
                                          [--events 1000 200000 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core.specs import JobSpec  # noqa: E402
from orchestrator.ledger import Ledger  # noqa: E402

SWEEP = "qscale1"
GPU = json.dumps({"slot_kind": "gpu", "gpu_model": "NVIDIA H100", "gpu_count": 1, "driver": "550", "cuda": "12.4",
                  "torch": "2.4", "nccl": "2.21", "python": "3.11"}, sort_keys=True)
CPU = json.dumps({"slot_kind": "cpu", "gpu_model": None, "gpu_count": None, "driver": None, "cuda": "none",
                  "torch": "2.4", "nccl": None, "python": "3.11"}, sort_keys=True)

# What `gpuq results` reads, with nothing but sqlite3 (the floor): the sweep's jobs, their attempts,
# final/best metrics, checkpoints and from-scratch findings, and the hosts.
RESULTS_FLOOR = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
n = 0
for sql in ("SELECT * FROM job WHERE sweep_id = ?",
            "SELECT a.* FROM attempt a JOIN job j ON a.job_id = j.id WHERE j.sweep_id = ?",
            "SELECT m.* FROM metric m JOIN job j ON m.job_id = j.id "
            "WHERE j.sweep_id = ? AND m.scope IN ('final', 'best')",
            "SELECT c.* FROM checkpoint c JOIN job j ON c.job_id = j.id WHERE j.sweep_id = ?",
            "SELECT e.* FROM event e JOIN job j ON e.subject = j.id WHERE j.sweep_id = ? AND e.rule != ''"):
    n += len(db.execute(sql, (sys.argv[2],)).fetchall())
n += len(db.execute("SELECT * FROM host").fetchall())
print(n)
"""
# The verbs alone, in a fresh interpreter: its imports, then the api call (no rendering).
API_ONLY = """
import sys, time
start = time.perf_counter()
from orchestrator import api
from orchestrator.api.report import build_report
imported = time.perf_counter()
ctx = api.open_context()
if sys.argv[1] == "results":
    api.results(ctx, sweep=sys.argv[2])
else:
    build_report(ctx, [sys.argv[2]])
print(f"{imported - start:.3f} {time.perf_counter() - imported:.3f}")
"""


@dataclass
class Tables:
    """The rows build_sweep writes past the ORM, table by table."""

    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    metrics: list[tuple[Any, ...]] = field(default_factory=list)
    ckpts: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    states: list[tuple[Any, ...]] = field(default_factory=list)


def _insert_hosts(db: sqlite3.Connection, t0: float) -> None:
    for name, kind, price in (("gpu1", "gpu", 16.0), ("cpu1", "cpu", None)):
        db.execute("INSERT INTO host (name, kind, target, root, python, profile, agent_bundle, slots_kind, "
                   "slots_total, price_per_hour, created_at, port, user, key_path, host_key, train_device, "
                   "min_free_gb, health, health_detail, hold_detail, probe_failures, kernel_cursor, provider, "
                   "instance_id, spot, gpu_type, gpu_count, region, lease_state, lease_reason, replaces, slurm) "
                   "VALUES (?, 'ssh', '', '/r', '', '', '', ?, 8, ?, ?, 22, '', '', '', '', 0, '', '', '', 0, '', "
                   "'', '', 0, '', 0, '', '', '', '', '')", (name, kind, price, t0))


def _job_attempts(out: Tables, i: int, job: Any, host: str, tries: int, state: str, start: float,
                  rng: random.Random) -> float:
    """Job ``i``'s attempts, checkpoints and their events; returns when its last attempt ended (+10 s)."""
    for n in range(1, tries + 1):
        last = n == tries
        ended = start + 600 + rng.random() * 600
        a_state = "EXITED" if last else ("PREEMPTED" if n == 1 else "LOST")
        out.attempts.append((job.id, n, host, a_state, "s", "" if n == 1 else f"ckpt-{n - 1}", start, start, ended,
                             (0 if state == "SUCCEEDED" else 1) if last else None, None if last else ended - 30,
                             16.0 if host == "gpu1" else None, job.gpus / 8, CPU if host == "cpu1" else GPU))
        out.ckpts.append((job.id, n, f"e{n}.pt", 100 * n, n, f"{i:058x}{n:06x}", 1000, start + 300))
        out.events += [(start, "attempt", f"{job.id}/a{n}", "", "STARTING", host, "", ""),
                       (start + 1, "attempt", f"{job.id}/a{n}", "STARTING", "RUNNING", "", "", ""),
                       (ended, "attempt", f"{job.id}/a{n}", "RUNNING", a_state, "exit", "", "")]
        if n > 1 and i % 2:
            out.events.append((start + 2, "job", job.id, "", "", f"{job.name} a{n}: restarted from scratch",
                               "escalate", "from_scratch"))
        start = ended + 10
    return start


def _job_metrics(out: Tables, job: Any, tries: int, points: int, rng: random.Random) -> None:
    """A succeeded job's final and best metrics and its learning curves (``points`` steps)."""
    level = 0.8 + 0.1 * rng.random()
    curve = [(s * 1000 // max(1, points - 1), level * (1 - 2.718 ** (-s / 15)) + rng.gauss(0, 0.005))
             for s in range(points)]
    out.metrics += [(job.id, tries, "final", "val_acc", curve[-1][1], 1000, 3),
                    (job.id, tries, "final", "loss", 0.1 + rng.random() / 10, 1000, 3),
                    (job.id, tries, "best", "val_acc", max(v for _, v in curve), 900, 3)]
    out.metrics += [(job.id, tries, "curve", name, value * scale, step, None)
                    for name, scale in (("val_acc", 1.0), ("loss", 2.0)) for step, value in curve]


def _write_tables(db: sqlite3.Connection, out: Tables) -> None:
    db.executemany("INSERT INTO attempt (job_id, number, host, state, bundle_sha, resume_from, created_at, "
                   "started_at, ended_at, exit_code, heartbeat_at, price_per_hour, gpu_share, provenance, message, "
                   "log_scanned, metrics_scanned, nodes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', 0, 0, "
                   "'')", out.attempts)
    db.executemany("INSERT INTO metric (job_id, attempt, scope, name, value, step, epoch) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   out.metrics)
    db.executemany("INSERT INTO checkpoint (job_id, attempt, file, step, epoch, sha256, bytes, written_at, durable, "
                   "durable_path, host) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, '', '')", out.ckpts)
    db.executemany("INSERT INTO event (time, kind, subject, old, new, message, severity, rule, action) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, '')", out.events)
    db.executemany("UPDATE job SET state = ?, attempt_count = ?, host = ? WHERE id = ?", out.states)


def build_sweep(home: Path, jobs: int, seeds: int, points: int, seed: int = 7) -> None:
    """A ledger at ``home`` with one finished sweep of ``jobs`` jobs (``jobs // seeds`` cells)."""
    ledger = Ledger(home / "ledger.db")
    cells = max(1, jobs // seeds)
    specs = [JobSpec(name=("baseline" if c == 0 else f"cell{c}") + f"-seed{k}", config=f"configs/c{c}.yaml",
                     task="classify", epochs=3, gpus=2 if c % 7 == 3 else 1, seed=k,
                     cell="baseline" if c == 0 else f"cell{c}", config_sha256=f"{c:064x}", line=c + 1)
             for c in range(cells) for k in range(seeds)][:jobs]
    rows = ledger.add_sweep(sweep_id=SWEEP, queue_path="queue.txt", workdir=str(home), queue_text="", jobs=specs,
                            default_retries=2, run=json.dumps({"metric": "val_acc", "mode": "max"}))
    ledger.close()
    rng = random.Random(seed)
    db = sqlite3.connect(home / "ledger.db")
    t0 = 1_700_000_000.0
    _insert_hosts(db, t0)
    out = Tables()
    for i, job in enumerate(rows):
        host = "cpu1" if i % 11 == 5 else "gpu1"
        tries = 1 + (i % 9 == 4) + (i % 27 == 13)
        state = "FAILED" if i % 23 == 17 else "SUCCEEDED"
        start = _job_attempts(out, i, job, host, tries, state, t0 + i * 5.0, rng)
        out.events += [(t0, "job", job.id, "QUEUED", "ASSIGNED", "placed", "", ""),
                       (start, "job", job.id, "RUNNING", state, "", "", "")]
        out.states.append((state, tries, host, job.id))
        if state == "SUCCEEDED":
            _job_metrics(out, job, tries, points, rng)
    _write_tables(db, out)
    db.commit()
    db.close()


def build_events(path: Path, total: int, picked: int = 20, each: int = 12) -> list[str]:
    """A ledger at ``path`` whose event table holds ``total`` events: ``picked`` jobs with ``each``
    events apiece (their own and their attempts', spread over the whole table, as a long-running
    job's are) and, around them, other jobs' and hosts'.  Returns the picked job ids."""
    ledger = Ledger(path)
    ledger.close()
    rng = random.Random(total)
    ids = [f"c{n:012x}" for n in range(picked)]
    mine = [(job if k % 3 == 0 else f"{job}/a{k % 4 + 1}") for job in ids for k in range(each)]
    slots = set(rng.sample(range(total), len(mine)))
    others = (f"c{n:012x}" for n in range(picked, 10**9))
    rows, fill, subject = [], iter(mine), ""
    for n in range(total):
        if n in slots:
            rows.append((1_700_000_000.0 + n, "job", next(fill)))
            continue
        if n % 25 == 0:
            subject = next(others)
        rows.append((1_700_000_000.0 + n, "host" if n % 5 == 4 else "job", f"gpu{n % 4}" if n % 5 == 4 else subject))
    db = sqlite3.connect(path)
    db.executemany("INSERT INTO event (time, kind, subject, old, new, message, severity, rule, action) "
                   "VALUES (?, ?, ?, '', '', 'event', '', '', '')", rows)
    db.commit()
    db.close()
    return ids


def timed_process(argv: list[str], env: dict[str, str], out: Path, runs: int) -> float:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        with open(out, "w") as fh:
            subprocess.run(argv, env=env, stdout=fh, stderr=subprocess.DEVNULL, check=True, cwd=ROOT)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def timed_call(fn: Callable[[], object], runs: int) -> float:
    """The fastest of ``runs`` calls (in-process timings on a shared machine: noise only adds)."""
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        took.append(time.perf_counter() - start)
    return min(took)


def sweep_rows(tmp: Path, jobs: int, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    home = tmp / f"home{jobs}"
    home.mkdir()
    start = time.perf_counter()
    build_sweep(home, jobs, args.seeds, args.points)
    built = time.perf_counter() - start
    db = home / "ledger.db"
    env = {**os.environ, "GPUQ_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    out = tmp / "out.txt"
    py = sys.executable
    print(f"{jobs} jobs ({jobs // args.seeds} cells x {args.seeds} seeds, {args.points}-point curves): ledger built "
          f"in {built:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)")
    floor = timed_process([py, "-c", RESULTS_FLOOR, str(db), SWEEP], env, out, args.repeat)
    print(f"  floor: a fresh python reading the rows with bare sqlite3: {floor:.3f} s")
    found: dict[str, tuple[float, float]] = {}
    for verb in ("results", "report"):
        parts = []
        for _ in range(args.repeat):
            done = subprocess.run([py, "-c", API_ONLY, verb, SWEEP], env=env, capture_output=True, text=True,
                                  check=True, cwd=ROOT)
            parts.append(tuple(float(x) for x in done.stdout.split()))
        imports, call = statistics.median(p[0] for p in parts), statistics.median(p[1] for p in parts)
        name = "api.results()" if verb == "results" else "api.report.build_report()"
        found[name] = (call, floor)
        print(f"  {name:<26} {call:7.3f} s   ratio {call / floor:6.1f}   "
              f"(in a fresh interpreter, after {imports:.3f} s of imports)")
    for label, argv in (("results (table)", ["results", "--sweep", SWEEP]),
                        ("results --json", ["results", "--sweep", SWEEP, "--json"]),
                        ("results --csv", ["results", "--sweep", SWEEP, "--csv"]),
                        ("report (table)", ["report", SWEEP]),
                        ("report --format csv", ["report", SWEEP, "--format", "csv"])):
        took = timed_process([py, "-m", "orchestrator", *argv], env, out, args.repeat)
        found[label] = (took, floor)
        print(f"  gpuq {label:<21} {took:7.3f} s   ratio {took / floor:6.1f}   target 2 s: "
              f"{'ok' if took <= 2.0 else 'MISSED'}")
    return found


def events_rows(tmp: Path, sizes: list[int]) -> None:
    print("Ledger.events(subject=JOB, limit=50), a tick's read of a job's and its attempts' 12 events; "
          "in-process, best of 30:")
    base: float | None = None
    for total in sizes:
        path = tmp / f"events{total}.db"
        picks = build_events(path, total)
        ledger = Ledger(path)
        db = sqlite3.connect(path)

        def gpuq(ledger: Ledger = ledger, picks: list[str] = picks) -> None:
            for job in picks:
                ledger.events(subject=job, limit=50)

        def floor(db: sqlite3.Connection = db, picks: list[str] = picks) -> None:
            for job in picks:  # the same rows: the job's own and those of its attempts (JOB/a1, ...)
                db.execute("SELECT * FROM event WHERE subject = ? OR (subject >= ? AND subject < ?) "
                           "ORDER BY id DESC LIMIT 50", (job, job + "/", job + "0")).fetchall()

        def like(db: sqlite3.Connection = db, picks: list[str] = picks) -> None:
            for job in picks[:5]:  # the query it replaced (bare sqlite3): a LIKE prefix scans the table
                db.execute("SELECT * FROM event WHERE subject LIKE ? || '%' ESCAPE '/' ORDER BY id DESC LIMIT 50",
                           (job,)).fetchall()

        took = timed_call(gpuq, 30) / len(picks)
        bare = timed_call(floor, 30) / len(picks)
        before = timed_call(like, 3) / 5
        ledger.close()
        db.close()
        base = took if base is None else base
        print(f"  {total:>9} events: {took * 1e6:6.0f} us   floor (bare sqlite3) {bare * 1e6:4.0f} us   ratio "
              f"{took / bare:5.1f}   vs {sizes[0]} events {took / base:4.2f}x   (the LIKE it replaced: "
              f"{before * 1e6:7.0f} us)")
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="*", default=[1000, 10_000])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events", type=int, nargs="*", default=[1000, 200_000, 1_000_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-results-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start_up = timed_process([sys.executable, "-m", "orchestrator", "--help"], env, Path(tmp) / "help.txt",
                                 args.repeat)
        bare = timed_process([sys.executable, "-c", "pass"], env, Path(tmp) / "help.txt", args.repeat)
        print(f"start-up: gpuq --help {start_up:.3f} s, python -c pass {bare:.3f} s (both in every figure below)")
        runs = {jobs: sweep_rows(Path(tmp), jobs, args) for jobs in args.jobs}
        if len(args.jobs) >= 2:
            small, large = min(args.jobs), max(args.jobs)
            for label in runs[small]:
                growth = runs[large][label][0] / runs[small][label][0]
                print(f"  growth {small} -> {large} jobs, {label:<24} {growth:5.1f}x "
                      f"(jobs {large / small:.0f}x; target <= 12x: {'ok' if growth <= 12 else 'MISSED'})")
        if args.events:
            events_rows(Path(tmp), args.events)


if __name__ == "__main__":
    main()
