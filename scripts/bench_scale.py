#!/usr/bin/env python3
"""Sweeps of 10,000 jobs: every command against its floor, measured side by side in one run.

Sections (``--only`` picks some; each prints its own rows, every figure a median of fresh processes
next to a floor measured in the same run, as a ratio):

* ``status``: ``gpuq status --once --no-probe`` and ``--all --no-probe`` on a ledger of 10,001 jobs
  (one real sweep run on the local host, then 10,000 finished jobs bulk-inserted), against a bare
  ``python`` that reads the same rows with sqlite3 (targets: 0.3 s and 1 s);
* ``tick``: ``gpuq status --once`` (one patrol tick: probe, reconcile, rules) on that ledger with
  1,000 events, then with 200,000 and 1,000,000 (target: no growth beyond noise);
* ``submit``: ``gpuq submit`` of 10 and of 1,000 jobs of a sleeping ``[run]`` project onto the
  local host, each in a fresh GPUQ_HOME (target: 1,000 at most 1.5x 10);
* ``agent``: a serving agent's CPU with 100 and 1,000 jobs waiting, against 10 (target: <= 2 % of a
  core), from ``bench_agent_idle.py``;
* ``results``: ``gpuq results`` / ``gpuq report`` at 1k and 10k jobs and ``Ledger.events`` at 1k /
  200k / 1M rows, from ``bench_results_scale.py``;
* ``scheduler``: planning 1k / 10k / 100k jobs on 256 hosts x 8 GPUs and work stealing, from
  ``bench_scheduler.py``;
* ``reads``: ``results``, ``report`` and ``status --all`` at 1k / 10k / 100k jobs, time and peak RSS
  against the bare-sqlite3 floor of the same rows, from ``bench_reads.py`` (the 100k ledger takes a while
  to build).

    python scripts/bench_scale.py [--only status tick submit agent results scheduler reads] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PY = sys.executable
GPUQ = [PY, "-m", "orchestrator"]
SECTIONS = ("status", "tick", "submit", "agent", "results", "scheduler", "reads")


def timed(argv: list[str], repeat: int, env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Median wall time of ``repeat`` fresh processes (each must exit 0)."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, check=False, env=env, cwd=cwd)
        runs.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed: {proc.stderr.decode()[-800:]}")
    return statistics.median(runs)


def row(label: str, seconds: float, floor: float, note: str = "") -> None:
    print(f"  {label:52} {seconds:7.3f} s   floor {floor:6.3f} s   {seconds / floor:6.1f}x  {note}")


def floor_read(db: Path, repeat: int) -> float:
    """A fresh python reading every job and attempt row with bare sqlite3 (read-only)."""
    code = ("import sqlite3, sys; c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True); "
            "c.execute('select * from job').fetchall(); c.execute('select * from attempt').fetchall()")
    return timed([PY, "-c", code, str(db)], repeat)


def build_status_home(jobs: int) -> tuple[Path, Path]:
    """A GPUQ_HOME with one real sweep run on the local host and ``jobs`` finished jobs besides."""
    from bench_project import add_history, make_project

    tmp, queue = make_project("gpuq-bench-scale-", 1)
    from orchestrator import api

    ctx = api.open_context()
    real = api.submit(ctx, queue)
    api.wait(ctx, sweep=real.sweep_id, interval_s=0.5)
    add_history(ctx, queue.parent, real.bundle.sha256, jobs)
    db = ctx.settings.ledger_path
    ctx.close()
    return tmp, db


def add_events(db: Path, total: int) -> int:
    """Fill the event table up to ``total`` rows of job, attempt and host events (bulk SQL)."""
    conn = sqlite3.connect(db)
    have = conn.execute("SELECT count(*) FROM event").fetchone()[0]
    ids = [r[0] for r in conn.execute("SELECT id FROM job")]
    now = time.time()
    rows = ((now - (total - i), "job", ids[i % len(ids)], "", "", f"synthetic event {i}", "", "", "")
            for i in range(have, total))
    cols = [r[1] for r in conn.execute("PRAGMA table_info(event)") if r[1] != "id"]
    wanted = ["time", "kind", "subject", "old", "new", "message", "severity", "rule", "action"]
    if set(wanted) - set(cols):
        raise SystemExit(f"event table has columns {cols}; this benchmark writes {wanted}")
    conn.executemany(f"INSERT INTO event ({', '.join(wanted)}) VALUES ({', '.join('?' * len(wanted))})", rows)
    conn.commit()
    count = int(conn.execute("SELECT count(*) FROM event").fetchone()[0])
    conn.close()
    return count


def status_and_tick(sections: set[str], repeat: int) -> None:
    from bench_project import stop_local_agent

    tmp, db = build_status_home(10_000)
    try:
        env = dict(os.environ)
        total = sqlite3.connect(db).execute("SELECT count(*) FROM job").fetchone()[0]
        floor = floor_read(db, repeat)
        if "status" in sections:
            print(f"status: a ledger of {total} jobs")
            row("gpuq status --once --no-probe", timed([*STATUS, "--no-probe"], repeat, env), floor,
                "target <= 0.3 s")
            row("gpuq status --once --all --no-probe", timed([*STATUS, "--all", "--no-probe"], repeat, env),
                floor, "target <= 1 s")
        if "tick" in sections:
            print("tick: gpuq status --once (probe the local host, reconcile, rules) as the event table grows")
            base = None
            for size in (1_000, 200_000, 1_000_000):
                have = add_events(db, size)
                took = timed(STATUS, repeat, env)
                base = base if base is not None else took
                row(f"with {have:,} events", took, base, "(floor: the same tick at 1,000 events)")
    finally:
        stop_local_agent(tmp / "home")
        shutil.rmtree(tmp, ignore_errors=True)


STATUS = [*GPUQ, "status", "--once"]

SLEEPER = "import sys, time\ntime.sleep(600)\n"


def submit_once(jobs: int) -> float:
    """One ``gpuq submit`` of ``jobs`` sleeping jobs onto the local host, in a fresh GPUQ_HOME."""
    from bench_project import stop_local_agent

    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-submit-"))
    try:
        work = tmp / "project"
        work.mkdir()
        (work / "sleep.py").write_text(SLEEPER)
        (work / "gpuq.toml").write_text('[run]\ncommand = "sleep.py {args}"\nlauncher = "python"\n')
        (work / "queue.txt").write_text("".join(f"name=j{i:05d} -- {i}\n" for i in range(jobs)))
        env = {**os.environ, "GPUQ_HOME": str(tmp / "home")}
        t0 = time.perf_counter()
        proc = subprocess.run([*GPUQ, "submit", "queue.txt"], cwd=work, env=env, capture_output=True, check=False)
        took = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"submit of {jobs} failed: {proc.stderr.decode()[-800:]}")
        subprocess.run([*GPUQ, "cancel", "--all", "--yes"], cwd=work, env=env, capture_output=True, check=False)
        return took
    finally:
        stop_local_agent(tmp / "home")
        shutil.rmtree(tmp, ignore_errors=True)


def submit_section(repeat: int) -> None:
    print("submit: gpuq submit onto the local host, a fresh GPUQ_HOME each (alternating sizes)")
    small, big = [], []
    for _ in range(repeat):
        small.append(submit_once(10))
        big.append(submit_once(1000))
    s, b = statistics.median(small), statistics.median(big)
    row("gpuq submit, 10 jobs (the floor)", s, s)
    row("gpuq submit, 1,000 jobs", b, s, "target <= 1.5x")


def agent_section() -> None:
    from bench_agent_idle import measure

    print("agent: a serving agent whose jobs all wait (share of one core over 10 s)")
    floor = measure(10, 10.0)
    for n in (100, 1000):
        share = measure(n, 10.0)
        print(f"  {n:5d} waiting: {share * 100:5.2f} % of a core, {share / floor if floor else float('inf'):.2f}x "
              f"10 waiting ({floor * 100:.2f} %)  target <= 2 %")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    chosen = set(args.only)
    if chosen & {"status", "tick"}:
        status_and_tick(chosen, args.repeat)
    if "submit" in chosen:
        submit_section(max(3, args.repeat // 2))
    if "agent" in chosen:
        agent_section()
    here = Path(__file__).resolve().parent
    for name, script in (("results", "bench_results_scale.py"), ("scheduler", "bench_scheduler.py"),
                         ("reads", "bench_reads.py")):
        if name in chosen:
            print(f"{name}: {script}")
            sys.stdout.flush()
            subprocess.run([PY, str(here / script)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
