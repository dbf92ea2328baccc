#!/usr/bin/env python3
"""Wall time and SSH round trips of one patrol tick over many hosts (default 16), side by side with
a sequential loop that asks the same hosts the same question.

Starts its own farm of namespace SSH hosts (tests/support/testhosts/; needs root), registers them
with a fresh GPUQ_HOME as a user would (``rehearsal`` profile, trust on first use), submits one
long-running stand-in job per emulated GPU (``sleeper.py`` from bench_makespan, so every host has
running attempts whose logs and metrics the patrol scans), waits until all of them run, then
measures ``--ticks`` patrol ticks (``api.run_tick``: probe every host once in parallel, reconcile,
rules, one line per host):

- tick wall time: median, p90 and max, and the ratio to the default patrol interval (60 s);
- SSH round trips per host per tick (SSHHost.round_trips, summed over the command's hosts);
- the per-host probe times inside a tick (min/median/max);
- **baseline**: a sequential loop over the same hosts with OpenSSH (one ``ssh host agent status
  --json`` each, strict host keys, the farm's client key), timed the same number of times; the
  ratio baseline/gpuq says what running the probes in parallel over kept-open connections buys.

    sudo python scripts/bench_patrol.py [--hosts 16] [--gpus 2] [--ticks 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_makespan import SLEEPER  # noqa: E402


def write_project(base: Path, jobs: int, seconds: int) -> Path:
    work = base / "project"
    (work / "configs").mkdir(parents=True)
    (work / "sleeper.py").write_text(SLEEPER)
    (work / "gpuq.toml").write_text('entry = "sleeper.py"\nlauncher = "python"\nverify = ["metrics"]\n')
    (work / "configs" / "long.yaml").write_text(f"duration_s: {seconds}\n")
    lines = [f"configs/long.yaml sleep 1 gpus=1 name=p{i:03d} est_min={seconds / 60:.3f}" for i in range(jobs)]
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args()


def start_sweep(ctx: Any, farm: Any, queue: Path, jobs: int) -> tuple[float, float, str]:
    """Every farm host added, the queue submitted, and every job RUNNING: (hosts add s, submit s, sweep)."""
    from orchestrator import api
    from orchestrator.core.states import JobState

    t0 = time.monotonic()
    for i, h in enumerate(farm.hosts):
        api.hosts_add(ctx, f"p{i:02d}", f"root@{h.address}", key=str(farm.client_key), profile="rehearsal",
                      trust_new_host_key=True)
    add_s = time.monotonic() - t0
    t0 = time.monotonic()
    result = api.submit(ctx, queue)
    submit_s = time.monotonic() - t0
    if result.launch_error:
        raise RuntimeError(result.launch_error)
    deadline = time.monotonic() + 300
    while True:
        snap = api.status(ctx, sweep=result.sweep_id)
        running = sum(j.state == JobState.RUNNING.value for j in snap.jobs)
        if running == jobs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {running}/{jobs} jobs running after 300 s")
        time.sleep(1)
    return add_s, submit_s, result.sweep_id


def measure_ticks(ctx: Any, ticks: int) -> tuple[list[float], list[float], list[float], int]:
    """``ticks`` patrol ticks: (each tick's wall time, each host's probe time, round trips per host per tick,
    the last tick's line count)."""
    from orchestrator import api

    def trips() -> dict[str, int]:
        return {row.name: int(getattr(api.host_for(ctx, row), "round_trips", 0)) for row in ctx.ledger.hosts()}

    walls: list[float] = []
    per_host: list[float] = []
    per_tick_trips: list[float] = []
    lines = 0
    for _ in range(ticks):
        before = trips()
        t0 = time.monotonic()
        report = api.run_tick(ctx)
        walls.append(time.monotonic() - t0)
        after = trips()
        per_tick_trips.append(sum(after[n] - before.get(n, 0) for n in after) / len(after))
        per_host += [p.duration_s for p in report.probes.values()]
        lines = len(report.lines)
        if not all(p.ok for p in report.probes.values()):
            raise RuntimeError(f"a probe failed: {[p.error for p in report.probes.values() if not p.ok]}")
    return walls, per_host, per_tick_trips, lines


def sequential_baseline(ctx: Any, farm: Any, ticks: int) -> list[float]:
    """The baseline: one OpenSSH command per host, one host after the other; each round's wall time."""
    rows = ctx.ledger.hosts()
    seq: list[float] = []
    for _ in range(ticks):
        t0 = time.monotonic()
        for i, row in enumerate(sorted(rows, key=lambda r: r.name)):
            argv = [row.python or "python3", f"{row.root}/bundles/{row.agent_bundle}/payload/agent/gpuq_agent.py",
                    "--root", row.root, "status", "--json"]
            out = subprocess.run([*farm.ssh_argv(i), "--", *argv], capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"baseline ssh to {row.name}: {out.stderr[-300:]}")
        seq.append(time.monotonic() - t0)
    return seq


def print_report(args: argparse.Namespace, jobs: int, report_doc: dict[str, Any], lines: int) -> None:
    setup = report_doc["setup_s"]
    print(f"patrol tick over {args.hosts} hosts with {jobs} running jobs ({args.ticks} ticks):")
    w = report_doc["tick_wall_s"]
    print(f"  tick wall time        median {w['median']:.2f} s  p90 {w['p90']:.2f} s  max {w['max']:.2f} s  "
          f"({report_doc['tick_vs_interval']:.3f} of the 60 s interval)")
    print(f"  round trips per host  {report_doc['round_trips_per_host_per_tick']:.2f} per tick")
    p = report_doc["probe_s"]
    print(f"  one host's probe      min {p['min']:.2f} s  median {p['median']:.2f} s  max {p['max']:.2f} s")
    print(f"  lines per tick        {lines} (one per host)")
    b = report_doc["baseline_sequential_s"]
    ratio = report_doc["baseline_over_gpuq"]
    print(f"  sequential ssh loop   median {b['median']:.2f} s  -> baseline/gpuq {ratio:.2f}x")
    print(f"  setup: farm {setup['farm']:.1f} s, hosts add {setup['hosts_add']:.1f} s, submit {setup['submit']:.1f} s")
    print(json.dumps(report_doc, sort_keys=True))


def main() -> int:
    args = parse_args()
    from tests.support.testhosts import HostFarm, requirements_problem

    problem = requirements_problem()
    if problem:
        print(f"bench_patrol: {problem}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-patrol-"))
    os.environ["GPUQ_HOME"] = str(tmp / "home")
    os.environ.setdefault("GPUQ_HEARTBEAT_S", "2")
    os.environ.setdefault("GPUQ_PREFLIGHT_SAMPLES", "1")
    jobs = args.hosts * args.gpus
    queue = write_project(tmp, jobs, seconds=900)
    farm = HostFarm(tmp / "farm", args.hosts, args.gpus)
    ctx = None
    try:
        t0 = time.monotonic()
        farm.start()
        farm_s = time.monotonic() - t0
        from orchestrator import api

        ctx = api.open_context(project_dir=queue.parent)
        add_s, submit_s, sweep = start_sweep(ctx, farm, queue, jobs)
        walls, per_host, per_tick_trips, lines = measure_ticks(ctx, args.ticks)
        seq = sequential_baseline(ctx, farm, args.ticks)
        api.cancel(ctx, sweep=sweep)
    finally:
        if ctx is not None:
            ctx.close()
        farm.teardown()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    report_doc: dict[str, Any] = {
        "hosts": args.hosts, "running_jobs": jobs, "ticks": args.ticks,
        "tick_wall_s": {"median": statistics.median(walls), "p90": pct(walls, 0.9), "max": max(walls)},
        "tick_vs_interval": statistics.median(walls) / 60.0,
        "round_trips_per_host_per_tick": statistics.mean(per_tick_trips),
        "probe_s": {"min": min(per_host), "median": statistics.median(per_host), "max": max(per_host)},
        "lines_per_tick": lines,
        "baseline_sequential_s": {"median": statistics.median(seq), "max": max(seq)},
        "baseline_over_gpuq": statistics.median(seq) / statistics.median(walls),
        "setup_s": {"farm": farm_s, "hosts_add": add_s, "submit": submit_s},
    }
    print_report(args, jobs, report_doc, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
