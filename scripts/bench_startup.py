#!/usr/bin/env python3
"""CLI start-up time: `gpuq --help` and `gpuq status` (--once, --no-probe, --all) on a 10,000-job ledger.

Targets: --help < 0.1 s; status --once --no-probe <= 0.5 s (status --once: that plus one probe
round trip); status --all (10,000 rows) < 2 s.

Builds a throw-away GPUQ_HOME: one real sweep run on the local host (so status probes a real
host agent), then 10,000 finished jobs in 50 sweeps bulk-inserted through Ledger.add_sweep and
marked finished with direct SQL (synthetic history; setup speed only).  Each command runs in a
fresh interpreter R times; medians are printed next to a bare `python -c pass` for scale.

    python scripts/bench_startup.py [--jobs 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))



def timed(argv: list[str], repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, check=False)
        runs.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed: {proc.stderr.decode()[-500:]}")
    return statistics.median(runs), max(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    from bench_project import add_history, make_project, stop_local_agent

    tmp, queue = make_project("gpuq-bench-start-", 1)
    work = queue.parent
    from orchestrator import api

    ctx = api.open_context()
    real = api.submit(ctx, queue)
    api.wait(ctx, sweep=real.sweep_id, interval_s=0.5)
    per_sweep = 200
    t0 = time.monotonic()
    total = add_history(ctx, work, real.bundle.sha256, args.jobs, per_sweep)
    setup = time.monotonic() - t0
    ctx.close()

    py = sys.executable
    gpuq = [py, "-m", "orchestrator"]
    base = timed([py, "-c", "pass"], args.repeat)
    rows = [
        ("gpuq --help", [*gpuq, "--help"], 0.1, args.repeat),
        ("gpuq status --once --no-probe", [*gpuq, "status", "--once", "--no-probe"], 0.5, args.repeat),
        ("gpuq status --once (1 probe)", [*gpuq, "status", "--once"], None, args.repeat),
        ("gpuq status --json", [*gpuq, "status", "--json"], None, args.repeat),
        (f"gpuq status --all ({total} rows)", [*gpuq, "status", "--once", "--all"], 2.0, max(3, args.repeat // 2)),
        ("gpuq status --all --no-probe", [*gpuq, "status", "--once", "--all", "--no-probe"], 2.0,
         max(3, args.repeat // 2)),
    ]
    print(f"ledger: {total} jobs in {total // per_sweep + 1} sweeps (setup {setup:.1f} s); "
          f"median / max of {args.repeat} fresh processes")
    print(f"{'python -c pass':40} {base[0]:.3f} s / {base[1]:.3f} s")
    probe = None
    for label, argv, target, repeat in rows:
        median, worst = timed(argv, repeat)
        if label.startswith("gpuq status --once (1"):
            probe = median
        verdict = "" if target is None else f"  target < {target:.1f} s: {'ok' if median < target else 'MISSED'}"
        print(f"{label:40} {median:.3f} s / {worst:.3f} s{verdict}")
    complete = timed(["env", "_GPUQ_COMPLETE=bash_complete", "COMP_WORDS=gpuq logs cell00", "COMP_CWORD=2", *gpuq],
                     args.repeat)
    print(f"{'completion of a JOB (Tab)':40} {complete[0]:.3f} s / {complete[1]:.3f} s")
    no_probe = timed([*gpuq, "status", "--once", "--no-probe"], args.repeat)[0]
    if probe is not None:
        print(f"{'status --once minus --no-probe':40} {probe - no_probe:.3f} s (the probe round trip)")
    print(f"state in {tmp}")
    stop_local_agent(tmp / "home")
    return 0


if __name__ == "__main__":
    sys.exit(main())
