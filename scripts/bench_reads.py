#!/usr/bin/env python3
"""Benchmark: the read commands (``results``, ``report``, ``status --all``) at 1k / 10k / 100k jobs, time and
peak memory, against the floor measured in the same run (a fresh ``python`` reading the same rows with bare
sqlite3), and optionally against another checkout of gpuq's code (``--before ROOT``: the code before a change,
on the same ledgers, alternating).

Each ledger is one finished sweep built by ``bench_results_scale.build_sweep`` (cells of 10 seeds, 50-point
curves) in DIR/homeN (kept: ``--keep DIR`` reuses what is there).  Every figure is the median of ``--repeat``
fresh processes (output to a file, ``COLUMNS=200``); peak RSS is the process's own (``wait4``'s ``ru_maxrss``).

    python scripts/bench_reads.py [--jobs 1000 10000 100000] [--repeat 3] [--keep DIR] [--before ROOT]
                                  [--only results report status]

``--jobs 1000000`` with ``--keep DIR`` holding ``home100000`` copies that sweep ten times over in SQL
(``tenfold``: minutes, where building it row by row would take an hour and many GiB); ``--repeat 1`` there.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = "qscale1"
VERBS: dict[str, list[str]] = {
    "results": ["results", "--sweep", SWEEP],
    "results --csv": ["results", "--sweep", SWEEP, "--csv"],
    "report": ["report", SWEEP],
    "report --format csv": ["report", SWEEP, "--format", "csv"],
    "status --once --all --no-probe": ["status", "--once", "--all", "--no-probe"],
}
# the rows each verb reads, with nothing but sqlite3 (fetched, as the verbs hold them)
RESULTS_FLOOR = """
import sqlite3, sys
db = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)
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
STATUS_FLOOR = ("import sqlite3, sys; c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True); "
                "c.execute('select * from job').fetchall(); c.execute('select * from attempt').fetchall()")


def measured(argv: list[str], env: dict[str, str], out: Path, cwd: Path = ROOT) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one fresh process run in ``cwd`` (it must exit 0)."""
    with open(out, "wb") as fh:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.PIPE, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {err[-800:]}")
    return took, usage.ru_maxrss / 1024


def median_of(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def build(home: Path, jobs: int) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    from bench_results_scale import build_sweep

    home.mkdir(parents=True)
    start = time.perf_counter()
    build_sweep(home, jobs, 10, 50)
    print(f"built {jobs} jobs in {time.perf_counter() - start:.0f} s "
          f"({(home / 'ledger.db').stat().st_size / 2**20:.0f} MiB)", flush=True)


def tenfold(src: Path, home: Path) -> None:
    """A 1,000,000-job sweep at ``home`` from the 100,000-job ledger ``src``: its host, sweep, jobs, attempts,
    final/best metrics, checkpoints and job/attempt events copied ten times over in SQL (each copy's job ids
    given a digit; curves left out), in a ledger the ``Ledger`` created (its schema)."""
    from orchestrator.ledger import Ledger

    home.mkdir(parents=True)
    path = home / "ledger.db"
    Ledger(path).close()
    start = time.perf_counter()
    db = sqlite3.connect(path)
    db.execute("ATTACH ? AS src", (str(src),))
    cols = {t: [r[1] for r in db.execute(f"PRAGMA main.table_info({t})")]
            for t in ("host", "sweep", "job", "attempt", "metric", "checkpoint", "event")}

    def copy(table: str, where: str = "", subst: dict[str, str] | None = None) -> None:
        names = [c for c in cols[table] if c != "id" or table in ("host", "sweep", "job")]
        picked = [(subst or {}).get(c, c) for c in names]
        db.execute(f"INSERT INTO main.{table} ({', '.join(names)}) SELECT {', '.join(picked)} FROM src.{table} {where}")

    copy("host")
    copy("sweep")
    for k in range(10):
        d = f"'{k}'"
        copy("job", subst={"id": f"id || {d}", "spec_hash": f"spec_hash || {d}", "line": f"line + {k} * 100000",
                           "content_key": f"CASE WHEN content_key = '' THEN '' ELSE content_key || {d} END"})
        copy("attempt", subst={"job_id": f"job_id || {d}"})
        copy("metric", "WHERE scope IN ('final', 'best', 'best_row')", subst={"job_id": f"job_id || {d}"})
        copy("checkpoint", subst={"job_id": f"job_id || {d}"})
        copy("event", "WHERE kind IN ('job', 'attempt')",  # ids are 13 characters: JOB, JOB/aN
             subst={"subject": f"substr(subject, 1, 13) || {d} || substr(subject, 14)"})
        db.commit()
    total = db.execute("SELECT count(*) FROM job").fetchone()[0]
    db.close()
    print(f"built {total:,} jobs from {src} in {time.perf_counter() - start:.0f} s "
          f"({path.stat().st_size / 2**20:.0f} MiB)", flush=True)


def one_size(home: Path, jobs: int, args: argparse.Namespace, tmp: Path) -> None:
    if not (home / "ledger.db").is_file():
        if jobs == 1_000_000 and (home.parent / "home100000" / "ledger.db").is_file():
            tenfold(home.parent / "home100000" / "ledger.db", home)
        else:
            build(home, jobs)
    db = str(home / "ledger.db")
    codes = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    out = tmp / "out.txt"
    base = {**os.environ, "GPUQ_HOME": str(home), "COLUMNS": "200"}
    py = sys.executable
    floors = {"results": median_of([measured([py, "-c", RESULTS_FLOOR, db, SWEEP], base, out)
                                    for _ in range(args.repeat)]),
              "status": median_of([measured([py, "-c", STATUS_FLOOR, db], base, out) for _ in range(args.repeat)])}
    print(f"{jobs} jobs: floor (bare sqlite3, fresh python): results/report rows {floors['results'][0]:.3f} s "
          f"{floors['results'][1]:.0f} MiB; status rows {floors['status'][0]:.3f} s {floors['status'][1]:.0f} MiB")
    for label, argv in VERBS.items():
        if not any(label.startswith(w) for w in args.only):
            continue
        floor = floors["status" if label.startswith("status") else "results"]
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in codes}
        for _ in range(args.repeat):  # alternating: the machine's load falls on both alike
            for name, code in codes.items():
                env = {**base, "PYTHONPATH": str(code)}
                runs[name].append(measured([py, "-m", "orchestrator", *argv], env, out, cwd=code))  # -m: cwd first
        line = f"  gpuq {label:<32}"
        for name in codes:
            took, rss = median_of(runs[name])
            line += f" {name} {took:7.3f} s ({took / floor[0]:5.1f}x) {rss:6.0f} MiB ({rss / floor[1]:4.1f}x)"
        print(line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="where the ledgers are built and kept (default: a temporary dir)")
    ap.add_argument("--before", type=Path, help="another checkout of gpuq, measured on the same ledgers")
    ap.add_argument("--only", nargs="+", default=["results", "report", "status"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-reads-") as tmp:
        where = args.keep or Path(tmp)
        py = sys.executable
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        helps = median_of([measured([py, "-m", "orchestrator", "--help"], env, Path(tmp) / "h") for _ in range(5)])
        bare = median_of([measured([py, "-c", "pass"], env, Path(tmp) / "h") for _ in range(5)])
        print(f"gpuq --help {helps[0]:.3f} s; python -c pass {bare[0]:.3f} s (start-up, in every figure below)")
        for jobs in args.jobs:
            one_size(where / f"home{jobs}", jobs, args, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
