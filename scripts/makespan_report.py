"""bench_makespan's yardsticks and report: the ideal schedule, where a job's time went, the printed lines.

- ``optimal_makespan``: the ideal (P||Cmax by branch and bound) the measured makespans are held against;
- ``breakdown`` and ``trainer_span``: what the hosts' own records say (launch.json, exit.json, the
  sleeper's summary.json);
- ``report_doc`` and the ``print_*`` steps: the run's lines and its one JSON document.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any


def optimal_makespan(durations: Sequence[int], machines: int, node_budget: int = 3_000_000) -> tuple[int, int, bool]:
    """P||Cmax for whole-second jobs: (best makespan found, lower bound, proven optimal).

    Branch and bound: jobs longest first, each onto a machine (machines with equal loads are
    tried once), pruned at the best found so far; the lower bound is the largest of ceil(sum/m),
    the longest job, and the m-th plus (m+1)-th longest (two of the m+1 longest share a machine).
    """
    jobs = sorted(durations, reverse=True)
    m = max(1, machines)
    lower = max(-(-sum(jobs) // m), jobs[0] if jobs else 0)
    if len(jobs) > m:
        lower = max(lower, jobs[m - 1] + jobs[m])
    loads = [0] * m
    for d in jobs:  # longest processing time first: the first upper bound
        loads[loads.index(min(loads))] += d
    best = max(loads, default=0)
    suffix = [0] * (len(jobs) + 1)
    for i in range(len(jobs) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + jobs[i]
    nodes = 0
    loads = [0] * m

    def dfs(i: int) -> bool:  # True: stop (bound reached or budget spent)
        nonlocal best, nodes
        if best == lower:
            return True
        if i == len(jobs):
            best = max(loads)
            return best == lower
        nodes += 1
        if nodes > node_budget:
            return True
        # the remaining work must fit under best - 1 on average
        if -(-(sum(loads) + suffix[i]) // m) >= best:
            return False
        tried: set[int] = set()
        for k in sorted(range(m), key=loads.__getitem__):
            if loads[k] in tried or loads[k] + jobs[i] >= best:
                continue
            tried.add(loads[k])
            loads[k] += jobs[i]
            stop = dfs(i + 1)
            loads[k] -= jobs[i]
            if stop:
                return True
        return False

    dfs(0)
    return best, lower, best == lower or nodes <= node_budget


def iso(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def breakdown(farm: Any, jobs: Sequence[tuple[str, str]]) -> dict[str, float]:
    """Where a job's time beyond its sleep goes, from the host's own records (means, seconds):
    agent launch (launch.json) -> wrapper up (exit.json started_at) -> trainer up (the sleeper's
    started_at) ... trainer done -> exit record (ended_at); and a slot's idle time between jobs."""
    runs = []
    for job_id, host in jobs:
        jdir = farm.hosts[int(host[len("bench"):])].root / "gpuq" / "jobs" / job_id
        # the attempt that ran on this host: a job stolen from a busy host's inbox runs as attempt 2
        ran = max((p for p in (jdir / "attempts").iterdir() if (p / "launch.json").is_file()),
                  key=lambda p: int(p.name))
        launch = json.loads((ran / "launch.json").read_text())
        exit_doc = json.loads((ran / "exit.json").read_text())
        summary = json.loads((jdir / "result" / "summary.json").read_text())
        runs.append({"host": host, "slots": launch["slots"], "launch": iso(launch["time"]),
                     "up": iso(exit_doc["started_at"]), "end": iso(exit_doc["ended_at"]),
                     "exec": exec_time(ran / "job.log"), "t0": summary["started_at"], "t1": summary["ended_at"]})
    gaps = []
    for host in {r["host"] for r in runs}:
        for slot in {s for r in runs if r["host"] == host for s in r["slots"]}:
            seq = sorted((r for r in runs if r["host"] == host and slot in r["slots"]), key=lambda r: r["launch"])
            gaps += [nxt["launch"] - prev["end"] for prev, nxt in itertools.pairwise(seq)]

    def mean(values: Sequence[float]) -> float:
        return sum(values) / max(1, len(values))

    execs = [r for r in runs if r["exec"] is not None]
    return {"launch_to_wrapper_s": mean([r["up"] - r["launch"] for r in runs]),
            "wrapper_to_trainer_s": mean([r["t0"] - r["up"] for r in runs]),
            "wrapper_to_exec_s": mean([r["exec"] - r["up"] for r in execs]),
            "exec_to_trainer_s": mean([r["t0"] - r["exec"] for r in execs]),
            "trainer_to_exit_s": mean([r["end"] - r["t1"] for r in runs]),
            "slot_gap_s": mean(gaps)}


START_LINE = re.compile(r"^=== gpuq \S+ a\d+ .* start (\S+Z) cwd ", re.M)


def exec_time(log: Path) -> float | None:
    """When the wrapper started the trainer's process: its ``=== gpuq ... start <time> cwd`` line in job.log."""
    found = START_LINE.search(log.read_text(errors="replace")) if log.is_file() else None
    return iso(found.group(1)) if found else None


def trainer_span(files: Sequence[Path]) -> float:
    """Last trainer end - first trainer start, from the sleeper's own summary.json files."""
    docs = [json.loads(p.read_text()) for p in files]
    return max(d["ended_at"] for d in docs) - min(d["started_at"] for d in docs)


@dataclass
class Measured:
    """What one run of bench_makespan measured, and the ideal it is held against."""

    durations: list[int]
    ideal: int
    lower: int
    proven: bool
    farm_s: float
    gpuq: dict[str, Any]
    baseline: dict[str, Any] | None
    static: dict[str, Any] | None
    pool: dict[str, Any] | None
    idle_trips: dict[str, int]
    first_push: tuple[int, int]
    resubmit_calls: int
    resubmit_bytes: int


def report_doc(args: Any, m: Measured) -> dict[str, Any]:
    """The run's numbers as the one JSON document the script prints last."""
    gpuq, baseline, static, pool, durations = m.gpuq, m.baseline, m.static, m.pool, m.durations
    ideal, lower, proven, idle_trips, first_push = m.ideal, m.lower, m.proven, m.idle_trips, m.first_push
    during = gpuq["trips_during"]
    return {
        "jobs": args.jobs, "hosts": args.hosts, "gpus_per_host": args.gpus, "durations": durations,
        "sum_s": sum(durations), "ideal_s": ideal, "ideal_lower_bound_s": lower, "ideal_proven": proven,
        "gpuq_makespan_s": round(gpuq["makespan_s"], 2), "gpuq_planned_s": round(gpuq["planned_makespan_s"], 2),
        "gpuq_trainer_span_s": round(gpuq["trainer_span_s"], 2),
        "gpuq_job_overhead_mean_s": round(gpuq["overhead_mean_s"], 3),
        "gpuq_job_overhead_max_s": round(gpuq["overhead_max_s"], 3),
        "gpuq_breakdown_mean_s": {k: round(v, 3) for k, v in gpuq["breakdown"].items()},
        "gpuq_submit_s": round(gpuq["submit_s"], 2),
        "gpuq_submit_to_last_end_s": round(gpuq["submit_to_last_end_s"], 2),
        "gpuq_over_ideal": round(gpuq["makespan_s"] / (ideal if proven else lower), 3),
        "jobs_per_host": gpuq["jobs_per_host"],
        "baseline_makespan_s": round(baseline["makespan_s"], 2) if baseline else None,
        "baseline_trainer_span_s": round(baseline["trainer_span_s"], 2) if baseline else None,
        "baseline_over_gpuq": round(baseline["makespan_s"] / gpuq["makespan_s"], 3) if baseline else None,
        "static_split_makespan_s": round(static["makespan_s"], 2) if static else None,
        "gpuq_over_static_split": round(gpuq["makespan_s"] / static["makespan_s"], 3) if static else None,
        "dynamic_pool_makespan_s": round(pool["makespan_s"], 2) if pool else None,
        "gpuq_over_dynamic_pool": round(gpuq["makespan_s"] / pool["makespan_s"], 3) if pool else None,
        "ssh_round_trips_per_status": sum(idle_trips.values()),
        "ssh_round_trips_per_status_per_host": round(sum(idle_trips.values()) / max(1, len(idle_trips)), 2),
        "ssh_round_trips_per_status_during_sweep_mean": round(sum(during) / max(1, len(during)), 2),
        "status_calls_during_sweep": len(during),
        "bundle_bytes_pushed_first_submit": first_push[1], "bundle_puts_first_submit": first_push[0],
        "bundle_bytes_pushed_resubmit": m.resubmit_bytes, "bundle_puts_resubmit": m.resubmit_calls,
        "farm_start_s": round(m.farm_s, 2),
    }


def print_gpuq_lines(args: Any, m: Measured, report: dict[str, Any]) -> None:
    """The header line, the ideal, and gpuq's makespan with where its time went."""
    gpuq, durations, ideal, lower, proven = m.gpuq, m.durations, m.ideal, m.lower, m.proven
    ideal_note = "optimal, proven" if proven else f"best found {ideal} s, lower bound {lower} s"
    print(f"{args.jobs} jobs ({args.durations} s, seed {args.seed}, sum {sum(durations)} s) on {args.hosts} hosts x "
          f"{args.gpus} emulated GPUs over real SSH; farm up in {m.farm_s:.1f} s")
    print(f"  {'ideal (P||Cmax, ' + ideal_note + ')':<52} {ideal if proven else lower:8.1f} s")
    print(f"  {'gpuq (ledger: first start -> last end)':<52} {gpuq['makespan_s']:8.1f} s   "
          f"gpuq/ideal {report['gpuq_over_ideal']:.3f} (target <= 1.05; a month ago {MONTH_AGO['gpuq_over_ideal']})")
    print(f"  {'   plan said':<52} {gpuq['planned_makespan_s']:8.1f} s")
    print(f"  {'   trainers only (first sleep start -> last end)':<52} {gpuq['trainer_span_s']:8.1f} s")
    print(f"  {'   per job beyond its sleep (wrapper, finalize)':<52} {gpuq['overhead_mean_s']:8.2f} s mean, "
          f"{gpuq['overhead_max_s']:.2f} s max")
    print_breakdown(gpuq["breakdown"])
    submit_label = f"   submit -> last end (submit took {gpuq['submit_s']:.2f} s)"
    print(f"  {submit_label:<52} {gpuq['submit_to_last_end_s']:8.1f} s")


# the same steps a month ago (issue 42): wrapper -> trainer up 0.24-0.29 s, gpuq/ideal 1.07-1.09 (4 runs)
MONTH_AGO = {"wrapper_to_trainer_s": "0.24-0.29 s", "gpuq_over_ideal": "1.07-1.09"}
STEPS = (("launch_to_wrapper_s", "agent launch -> wrapper up"),
         ("wrapper_to_trainer_s", "wrapper up -> trainer up"),
         ("wrapper_to_exec_s", "   wrapper up -> trainer's process started (job.log)"),
         ("exec_to_trainer_s", "   process started -> trainer up (jail, interpreter)"),
         ("trainer_to_exit_s", "trainer done -> exit record"),
         ("slot_gap_s", "slot idle between jobs"))


def print_breakdown(b: dict[str, float]) -> None:
    """Where a job's time went, step by step (means per job), beside the month-ago figure where there is one."""
    print(f"     {'per-job step (mean)':<56} {'now':>8}   a month ago")
    for key, label in STEPS:
        print(f"     {label:<56} {b[key]:7.3f} s   {MONTH_AGO.get(key, '-')}")


def print_other_lines(m: Measured, report: dict[str, Any]) -> None:
    """The baselines' makespans, the round trips per status call and the bytes pushed."""
    baseline, static, pool, idle_trips, first_push = m.baseline, m.static, m.pool, m.idle_trips, m.first_push
    if baseline:
        print(f"  {'baseline (sequential loop per host, wall)':<52} {baseline['makespan_s']:8.1f} s   "
              f"baseline/gpuq {report['baseline_over_gpuq']:.3f} (target >= 1.8)")
        print(f"  {'   trainers only':<52} {baseline['trainer_span_s']:8.1f} s")
    if static:
        print(f"  {'static split (one loop per GPU, round-robin, wall)':<52} {static['makespan_s']:8.1f} s   "
              f"gpuq/static {report['gpuq_over_static_split']:.3f}")
    if pool:
        print(f"  {'dynamic pool (next job on first free GPU, wall)':<52} {pool['makespan_s']:8.1f} s   "
              f"gpuq/pool {report['gpuq_over_dynamic_pool']:.3f}")
    print(f"  ssh round trips per status call (sweep ended): {report['ssh_round_trips_per_status']} "
          f"for {len(idle_trips)} hosts = {report['ssh_round_trips_per_status_per_host']:.2f} per host; "
          f"while running: mean {report['ssh_round_trips_per_status_during_sweep_mean']:.2f} per call "
          f"over {len(m.gpuq['trips_during'])} calls (result collection included)")
    print(f"  bundle bytes pushed: first submit {first_push[1]} ({first_push[0]} puts), "
          f"re-submit {m.resubmit_bytes} ({m.resubmit_calls} puts; target 0)")


def print_summary(m: Measured, report: dict[str, Any]) -> None:
    """The one-line summary, then the JSON document."""
    gpuq, baseline, static, pool = m.gpuq, m.baseline, m.static, m.pool
    baseline_part = (f" | baseline (sequential loop per host) {baseline['makespan_s']:.1f} s | baseline/gpuq "
                     f"{report['baseline_over_gpuq']:.2f}" if baseline else "")
    if static and pool:
        baseline_part += (f" | gpuq/static-split {report['gpuq_over_static_split']:.3f} | gpuq/dynamic-pool "
                          f"{report['gpuq_over_dynamic_pool']:.3f}")
    print(f"gpuq makespan {gpuq['makespan_s']:.1f} s | ideal {m.ideal if m.proven else m.lower:.1f} s | gpuq/ideal "
          f"{report['gpuq_over_ideal']:.3f}{baseline_part} | ssh round trips per status: "
          f"{report['ssh_round_trips_per_status_per_host']:.2f} per host | bundle bytes pushed on re-submit: "
          f"{m.resubmit_bytes}")
    print(json.dumps(report))
