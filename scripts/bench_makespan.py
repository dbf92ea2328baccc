#!/usr/bin/env python3
"""Makespan of a queue on several SSH hosts: gpuq vs the ideal vs one sequential loop per host.

Starts its own test host farm (tests/support/testhosts/: real OpenSSH servers in network/PID/mount
namespaces with emulated GPUs; needs root), registers the hosts with a fresh GPUQ_HOME exactly as a
user would (``rehearsal`` profile, trust on first use), writes a project whose trainer ``sleeper.py``
(stdlib only) sleeps the duration its config names and honours the payload contract (metrics.jsonl,
summary.json, exit 0), and then measures, in one run:

- **gpuq**: submit the queue (``est_min=`` on every line, so the scheduler knows the durations) and poll
  ``api.status`` every ``--poll`` seconds until the sweep has ended.  Makespan = last attempt's
  ``ended_at`` - first attempt's ``started_at`` in the ledger (both from the wrapper's exit.json on the
  host: wrapper start and end, so gpuq's per-job wrapper/finalize overhead is inside it).  Submit ->
  last end is printed too.
- **ideal**: the optimal makespan of the same durations on hosts x gpus slots, jobs indivisible
  (P||Cmax, exact by branch and bound; if the search budget runs out, the best schedule found and
  the lower bound are both printed, and the ratio uses the lower bound).
- **baseline**: the classic ``run_queue.sh`` in tmux: per host one OpenSSH session (farm key, strict
  host keys) running ``bash -c 'for cfg in ...; do python3 sleeper.py ...; done'``, jobs dealt
  round-robin in queue order, hosts in parallel, one job at a time per host (the loop ignores the
  second GPU).  Makespan = wall time from starting the loops to the last one ending (the project is
  copied to the hosts before the clock starts).
- **static split**: what a careful user runs instead: one loop per GPU (``CUDA_VISIBLE_DEVICES=g``), the
  queue dealt round-robin in queue order over every host x GPU slot, all loops started at once.
- **dynamic pool**: the careful user's best script: one local worker per host x GPU slot; the first slot
  to be free starts the next job in queue order (one OpenSSH command per job, like ``xargs -P``).
  gpuq/static and gpuq/pool are printed (below 1: gpuq is faster).
- **SSH round trips per status call**: SSHHost.round_trips summed over the command's hosts, before and
  after one ``api.status`` once the sweep has ended (and the mean over the status calls made while it
  ran, which includes collecting finished jobs' results).
- **bytes pushed on a re-submit**: the same project submitted again (a new sweep, same bundle); every
  ``SSHHost.put`` of this process is counted (a wrapper installed by this script only).  That sweep is
  cancelled right away; it runs after the makespan measurement, so it cannot disturb it.

Targets (issue 42): gpuq/ideal <= 1.05 (a month ago 1.07-1.09; per-step breakdown beside the month-ago
figures), baseline/gpuq >= 1.8, 1 round trip per host per status, 0 bytes.
The baselines are ``makespan_baselines.py``; the ideal, the breakdown and the printed report ``makespan_report.py``.

    sudo python scripts/bench_makespan.py [--jobs 24] [--hosts 3] [--gpus 2] [--durations 4-12] [--seed 7]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.makespan_baselines import run_baseline, run_dynamic_pool, run_static_split  # noqa: E402
from scripts.makespan_report import (  # noqa: E402
    Measured,
    breakdown,
    optimal_makespan,
    print_gpuq_lines,
    print_other_lines,
    print_summary,
    report_doc,
    trainer_span,
)

SLEEPER = '''\
"""A stand-in trainer: sleeps the config's duration_s and honours gpuq's payload contract (stdlib only)."""
import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
parser.add_argument("--task", default="sleep")
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
duration = None
with open(args.config, encoding="utf-8") as fh:
    for line in fh:
        key, _, value = line.partition(":")
        if key.strip() == "duration_s":
            duration = float(value)
if duration is None:
    raise SystemExit("no duration_s in " + args.config)
name = os.path.splitext(os.path.basename(args.config))[0]
result = os.environ.get("GPUQ_RESULT_DIR") or os.path.join("results", name)
os.makedirs(result, exist_ok=True)


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def beat(phase, step):
    path = os.environ.get("GPUQ_HEARTBEAT")
    if path:
        write_json(path, {"time": time.time(), "step": step, "total_steps": 1, "epoch": 1, "epochs": 1,
                          "loss": None, "lr": None, "phase": phase, "steps_per_s": None})


started = time.time()
beat("train", 0)
time.sleep(duration)
ended = time.time()
line = {"kind": "eval", "step": 1, "epoch": 1, "val_loss": 0.0, "val_acc": 1.0, "time": ended}
with open(os.path.join(result, "metrics.jsonl"), "a", encoding="utf-8") as fh:
    fh.write(json.dumps(line) + "\\n")
write_json(os.path.join(result, "summary.json"),
           {"metric": "val_acc", "mode": "max", "final": line, "best": line, "steps": 1,
            "started_at": started, "ended_at": ended, "duration_s": duration})
beat("done", 1)
'''


# --- the instance ----------------------------------------------------------------------------------------


def parse_durations(spec: str, jobs: int, seed: int) -> list[int]:
    """"4-12": a seeded uniform integer mix; "8": all equal; "4,8,12": cycled in queue order."""
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-", 1))
        if not 1 <= lo <= hi:
            raise ValueError(f"--durations {spec}: want LO-HI with 1 <= LO <= HI")
        rng = random.Random(seed)
        return [rng.randint(lo, hi) for _ in range(jobs)]
    values = [int(x) for x in spec.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"--durations {spec}: want whole seconds >= 1")
    return [values[i % len(values)] for i in range(jobs)]


def write_project(base: Path, durations: Sequence[int]) -> Path:
    work = base / "project"
    (work / "configs").mkdir(parents=True)
    (work / "sleeper.py").write_text(SLEEPER)
    (work / "gpuq.toml").write_text('entry = "sleeper.py"\nlauncher = "python"\nverify = ["metrics"]\n')
    lines = []
    for i, seconds in enumerate(durations):
        (work / "configs" / f"j{i:02d}.yaml").write_text(f"duration_s: {seconds}\n")
        lines.append(f"configs/j{i:02d}.yaml sleep 1 gpus=1 est_min={seconds / 60:.6f}")
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


# --- gpuq ------------------------------------------------------------------------------------------------


class PutCounter:
    """Counts SSHHost.put calls of this process (host, remote path, bytes)."""

    def __init__(self) -> None:
        from orchestrator.hosts import ssh

        self.calls: list[tuple[str, str, int]] = []
        self._ssh = ssh
        self._orig: Callable[..., None] = ssh.SSHHost.put
        counter = self

        def put(host: Any, local: Path, remote: str, **kwargs: Any) -> None:  # progress=, as SSHHost.put
            counter.calls.append((host.name, remote, local.stat().st_size))
            counter._orig(host, local, remote, **kwargs)

        ssh.SSHHost.put = put  # type: ignore[method-assign]

    def mark(self) -> int:
        return len(self.calls)

    def since(self, mark: int) -> tuple[int, int]:
        calls = self.calls[mark:]
        return len(calls), sum(size for _, _, size in calls)


def round_trips(ctx: Any) -> dict[str, int]:
    from orchestrator import api

    return {row.name: int(getattr(api.host_for(ctx, row), "round_trips", 0)) for row in ctx.ledger.hosts()}


def run_gpuq(ctx: Any, queue: Path, durations: dict[str, int], poll_s: float, timeout_s: float) -> dict[str, Any]:
    from orchestrator import api
    from orchestrator.core.states import JobState

    submitted_at = time.time()
    result = api.submit(ctx, queue)
    submit_s = time.time() - submitted_at
    if result.launch_error:
        raise RuntimeError(f"submit: {result.launch_error}")
    per_call: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        before = round_trips(ctx)
        snap = api.status(ctx, sweep=result.sweep_id)
        after = round_trips(ctx)
        per_call.append(sum(after.values()) - sum(before.values()))
        if all(JobState(j.state).terminal or j.state == JobState.LOST.value for j in snap.jobs):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"sweep {result.sweep_id} still running after {timeout_s:.0f} s")
        time.sleep(poll_s)
    observed_done = time.time()
    bad = {j.name: j.state for j in snap.jobs if j.state != JobState.SUCCEEDED.value}
    if bad:
        raise RuntimeError(f"jobs did not succeed: {bad}; see `GPUQ_HOME={ctx.settings.home} gpuq status --all`")
    attempts = ctx.ledger.latest_attempts(j.id for j in snap.jobs)
    starts = [a.started_at for a in attempts.values() if a.started_at is not None]
    ends = [a.ended_at for a in attempts.values() if a.ended_at is not None]
    if len(starts) != len(snap.jobs) or len(ends) != len(snap.jobs):
        raise RuntimeError("the ledger lacks start or end times of some attempts")
    # what a job costs beyond its sleep: wrapper start-up, disk gate, finalize (metrics check)
    overhead = [attempts[j.id].ended_at - attempts[j.id].started_at - durations[j.name] for j in snap.jobs]
    per_host: dict[str, int] = {}
    for job in snap.jobs:
        per_host[job.host or "?"] = per_host.get(job.host or "?", 0) + 1
    return {"sweep": result.sweep_id, "makespan_s": max(ends) - min(starts), "submit_s": submit_s,
            "submit_to_last_end_s": max(ends) - submitted_at, "submit_to_observed_s": observed_done - submitted_at,
            "status_calls": len(per_call), "trips_during": per_call, "jobs_per_host": per_host,
            "planned_makespan_s": result.makespan_s, "jobs": [(j.id, j.host) for j in snap.jobs],
            "overhead_mean_s": sum(overhead) / len(overhead), "overhead_max_s": max(overhead)}


# --- main ------------------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=2, help="emulated GPUs (slots) per host")
    parser.add_argument("--durations", default="4-12",
                        help='job durations in whole seconds: "LO-HI" (seeded mix), "S" or "S1,S2,..." (cycled)')
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between status calls while waiting")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the baselines (sequential loop per host, static per-GPU split, dynamic pool)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (farm state, GPUQ_HOME)")
    return parser


def register_hosts(ctx: Any, farm: Any) -> None:
    """Every farm host added as a user would: ``rehearsal`` profile, trust on first use."""
    from orchestrator import api

    for i, h in enumerate(farm.hosts):
        api.hosts_add(ctx, f"bench{i}", f"root@{h.address}", key=str(farm.client_key), profile="rehearsal",
                      trust_new_host_key=True)


def measure_gpuq(ctx: Any, farm: Any, queue: Path, durations: list[int], args: argparse.Namespace,
                 puts: PutCounter) -> tuple[dict[str, Any], tuple[int, int], dict[str, int], tuple[int, int]]:
    """gpuq's run of the queue: (its numbers, the first submit's puts and bytes, the round trips per host
    of one status call once it has ended, the re-submit's puts and bytes)."""
    from orchestrator import api

    first_put = puts.mark()
    by_name = {f"j{i:02d}": d for i, d in enumerate(durations)}
    gpuq = run_gpuq(ctx, queue, by_name, args.poll, timeout_s=max(600.0, 10.0 * sum(durations)))
    first_push = puts.since(first_put)
    gpuq["trainer_span_s"] = trainer_span(
        [farm.hosts[int(host[len("bench"):])].root / "gpuq" / "jobs" / job_id / "result" / "summary.json"
         for job_id, host in gpuq["jobs"]])
    gpuq["breakdown"] = breakdown(farm, gpuq["jobs"])
    before = round_trips(ctx)
    api.status(ctx)
    after = round_trips(ctx)
    idle_trips = {name: after[name] - before.get(name, 0) for name in after}

    mark = puts.mark()
    again = api.submit(ctx, queue)
    resubmit = puts.since(mark)
    api.cancel(ctx, sweep=again.sweep_id)
    return gpuq, first_push, idle_trips, resubmit


def measure(args: argparse.Namespace, durations: list[int], ideal: tuple[int, int, bool]) -> Measured:
    """Start the farm, register its hosts, run the baselines and then gpuq; the farm torn down after."""
    from tests.support.testhosts import HostFarm

    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-makespan-"))
    os.environ["GPUQ_HOME"] = str(tmp / "home")
    queue = write_project(tmp, durations)
    configs = [f"configs/j{i:02d}.yaml" for i in range(args.jobs)]
    farm = HostFarm(tmp / "farm", args.hosts, args.gpus)
    ctx = None
    try:
        t0 = time.monotonic()
        farm.start()
        farm_s = time.monotonic() - t0
        from orchestrator import api

        puts = PutCounter()
        ctx = api.open_context(project_dir=queue.parent)
        register_hosts(ctx, farm)
        baseline = None if args.no_baseline else run_baseline(farm, queue.parent, configs)
        static = None if args.no_baseline else run_static_split(farm, queue.parent, configs, args.gpus)
        pool = None if args.no_baseline else run_dynamic_pool(farm, queue.parent, configs, args.gpus)
        gpuq, first_push, idle_trips, (resubmit_calls, resubmit_bytes) = measure_gpuq(
            ctx, farm, queue, durations, args, puts)
    finally:
        if ctx is not None:
            ctx.close()
        farm.teardown()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return Measured(durations=durations, ideal=ideal[0], lower=ideal[1], proven=ideal[2], farm_s=farm_s, gpuq=gpuq,
                    baseline=baseline, static=static, pool=pool, idle_trips=idle_trips, first_push=first_push,
                    resubmit_calls=resubmit_calls, resubmit_bytes=resubmit_bytes)


def main() -> int:
    parser = make_parser()
    args = parser.parse_args()

    from tests.support.testhosts import requirements_problem

    problem = requirements_problem()
    if problem:
        print(f"bench_makespan: {problem}", file=sys.stderr)
        return 2
    try:
        durations = parse_durations(args.durations, args.jobs, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    slots = args.hosts * args.gpus
    measured = measure(args, durations, optimal_makespan(durations, slots))
    report = report_doc(args, measured)
    print_gpuq_lines(args, measured, report)
    print_other_lines(measured, report)
    print_summary(measured, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
