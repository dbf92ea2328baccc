#!/usr/bin/env python3
"""Slot idle gap between consecutive jobs on the local host, measured on a real sweep.

Submits N short real-payload jobs (torchrun, gloo on CPU) through gpuq's own api onto the local host
with S CPU slots, waits for the sweep, then reads each attempt's launch.json (when the agent
started the wrapper) and exit.json (when the wrapper finished) from the host root.  Per slot,
gap = next launch - previous exit.  Also reported, side by side: the makespan against the ideal
(sum of attempt durations / slots), and the wrapper's finalize time (trainer done -> exit.json),
which holds the slot but is not agent overhead.

    python scripts/bench_idle_gap.py [--jobs 10] [--slots 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))



def iso(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    from bench_project import make_project, stop_local_agent

    tmp, queue = make_project("gpuq-bench-gap-", args.jobs)
    from orchestrator import api

    ctx = api.open_context(overrides={"local_cpu_slots": args.slots, "heartbeat_s": 1})
    t0 = time.monotonic()
    submitted = api.submit(ctx, queue)
    submit_s = time.monotonic() - t0
    snap = api.wait(ctx, sweep=submitted.sweep_id, interval_s=0.5)
    wall = time.monotonic() - t0
    bad = [j.name for j in snap.jobs if j.state != "SUCCEEDED"]
    if bad:
        print(f"jobs did not succeed: {bad}", file=sys.stderr)
        return 1

    host_root = ctx.settings.local_host_root
    runs = []
    for job in snap.jobs:
        adir = host_root / "jobs" / job.id / "attempts" / "1"
        launch = json.loads((adir / "launch.json").read_text())
        exit_doc = json.loads((adir / "exit.json").read_text())
        beat = json.loads((adir / "heartbeat").read_text())
        runs.append({"slots": tuple(launch["slots"]), "launch": iso(launch["time"]),
                     "end": iso(exit_doc["ended_at"]), "trainer_done": float(beat["time"])})
    gaps: list[float] = []
    for slot in range(args.slots):
        on_slot = sorted((r for r in runs if slot in r["slots"]), key=lambda r: r["launch"])
        gaps += [nxt["launch"] - prev["end"] for prev, nxt in itertools.pairwise(on_slot)]
    finalize = [r["end"] - r["trainer_done"] for r in runs]
    busy = sum((r["end"] - r["launch"]) * len(r["slots"]) for r in runs)
    first, last = min(r["launch"] for r in runs), max(r["end"] for r in runs)
    makespan, ideal = last - first, busy / args.slots
    print(f"local host, {args.jobs} real torchrun jobs (1 process each) on {args.slots} CPU slots")
    print(f"submit returned in            {submit_s:8.3f} s")
    print(f"slot idle gap (exit -> next)   median {statistics.median(gaps):.3f} s   max {max(gaps):.3f} s   "
          f"n={len(gaps)}   target: median < 0.5 s")
    print(f"finalize (trainer done -> exit.json, best.pt load check)   median {statistics.median(finalize):.2f} s")
    print(f"makespan {makespan:.1f} s vs ideal {ideal:.1f} s (busy slot-seconds / slots): ratio {makespan / ideal:.3f}")
    print(f"whole run incl. submit and wait: {wall:.1f} s; state in {tmp}")
    ctx.close()
    stop_local_agent(tmp / "home")
    return 0


if __name__ == "__main__":
    sys.exit(main())
