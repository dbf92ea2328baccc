#!/usr/bin/env python3
"""Makespan of a queue on several SSH hosts: gpuq vs the ideal vs one sequential loop per host.

Starts its own test host farm (tests/support/testhosts.py: real OpenSSH servers in network/PID/mount
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

Targets (issue): gpuq/ideal <= 1.10, baseline/gpuq >= 1.8, 1 round trip per host per status, 0 bytes.

    sudo python scripts/bench_makespan.py [--jobs 24] [--hosts 3] [--gpus 2] [--durations 4-12] [--seed 7]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
                     "t0": summary["started_at"], "t1": summary["ended_at"]})
    gaps = []
    for host in {r["host"] for r in runs}:
        for slot in {s for r in runs if r["host"] == host for s in r["slots"]}:
            seq = sorted((r for r in runs if r["host"] == host and slot in r["slots"]), key=lambda r: r["launch"])
            gaps += [nxt["launch"] - prev["end"] for prev, nxt in itertools.pairwise(seq)]

    def mean(values: Sequence[float]) -> float:
        return sum(values) / max(1, len(values))

    return {"launch_to_wrapper_s": mean([r["up"] - r["launch"] for r in runs]),
            "wrapper_to_trainer_s": mean([r["t0"] - r["up"] for r in runs]),
            "trainer_to_exit_s": mean([r["end"] - r["t1"] for r in runs]),
            "slot_gap_s": mean(gaps)}


def trainer_span(files: Sequence[Path]) -> float:
    """Last trainer end - first trainer start, from the sleeper's own summary.json files."""
    docs = [json.loads(p.read_text()) for p in files]
    return max(d["ended_at"] for d in docs) - min(d["started_at"] for d in docs)


# --- baseline --------------------------------------------------------------------------------------------


def _ship(farm: Any, project: Path, dirname: str) -> None:
    """Copy the trainer and configs to /root/<dirname> on every host (before any clock starts)."""
    tar = subprocess.run(["tar", "-C", str(project), "-cf", "-", "sleeper.py", "configs"], capture_output=True,
                         check=True).stdout
    unpack = f"rm -rf /root/{dirname} && mkdir -p /root/{dirname} && tar -xf - -C /root/{dirname}"
    for i in range(len(farm.hosts)):
        subprocess.run([*farm.ssh_argv(i), "--", unpack], input=tar, capture_output=True, check=True, timeout=60)


def _job_cmd(dirname: str, cfg: str, gpu: int | None) -> str:
    """One job the way a user's script runs it (``$cfg`` may be a shell variable)."""
    pin = "" if gpu is None else f"CUDA_VISIBLE_DEVICES={gpu} "
    return (f"name=${{cfg##*/}}; name=${{name%.yaml}}; {pin}GPUQ_RESULT_DIR=/root/{dirname}/results/$name "
            f"python3 sleeper.py --config \"{cfg}\" --task sleep --epochs 1 || echo \"FAILED {cfg}\" >&2")


def _summaries(farm: Any, dirname: str, configs: Sequence[str], label: str) -> list[Path]:
    found = [p for h in farm.hosts for p in (h.root / dirname / "results").glob("*/summary.json")]
    if len(found) != len(configs):
        raise RuntimeError(f"{label}: {len(found)} of {len(configs)} jobs left a summary")
    return found


def _run_loops(farm: Any, loops: Sequence[str], label: str) -> list[float]:
    """One OpenSSH session per host running ``loops[i]``; wall time of each from a common start."""
    started = time.monotonic()
    procs = [subprocess.Popen([*farm.ssh_argv(i), "--", shlex.join(["bash", "-c", loop])],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, loop in enumerate(loops)]
    walls = []
    for i, proc in enumerate(procs):
        _out, err = proc.communicate(timeout=3600)
        walls.append(time.monotonic() - started)
        if proc.returncode != 0 or b"FAILED" in err:
            raise RuntimeError(f"{label} on host {i} failed ({proc.returncode}): {err.decode()[-500:]}")
    return walls


def run_baseline(farm: Any, project: Path, configs: Sequence[str]) -> dict[str, Any]:
    """run_queue.sh: one sequential loop per host, jobs dealt round-robin in queue order."""
    n = len(farm.hosts)
    _ship(farm, project, "baseline")
    loops = [f"cd /root/baseline && for cfg in {' '.join(shlex.quote(c) for c in configs[i::n])}; do "
             + _job_cmd("baseline", "$cfg", None) + "; done" for i in range(n)]
    walls = _run_loops(farm, loops, "baseline loop")
    summaries = _summaries(farm, "baseline", configs, "baseline")
    return {"makespan_s": max(walls), "per_host_s": walls, "trainer_span_s": trainer_span(summaries)}


def run_static_split(farm: Any, project: Path, configs: Sequence[str], gpus: int) -> dict[str, Any]:
    """The careful user's static split: one loop per GPU (CUDA_VISIBLE_DEVICES=g), the queue dealt
    round-robin in queue order over every host x GPU slot, all loops started together."""
    n = len(farm.hosts)
    slots = n * gpus
    _ship(farm, project, "static")
    loops = []
    for i in range(n):
        parts = []
        for g in range(gpus):
            mine = configs[i * gpus + g::slots]
            if mine:
                parts.append(f"( for cfg in {' '.join(shlex.quote(c) for c in mine)}; do "
                             + _job_cmd("static", "$cfg", g) + "; done ) &")
        loops.append("cd /root/static || exit 1; " + " ".join(parts) + " wait")
    walls = _run_loops(farm, loops, "static split")
    summaries = _summaries(farm, "static", configs, "static split")
    return {"makespan_s": max(walls), "per_host_s": walls, "trainer_span_s": trainer_span(summaries)}


def run_dynamic_pool(farm: Any, project: Path, configs: Sequence[str], gpus: int) -> dict[str, Any]:
    """The careful user's dynamic pool: a local worker per host x GPU slot; whichever slot is free first
    starts the next job in queue order, one OpenSSH command per job (like ``xargs -P`` over ssh)."""
    import queue as queue_mod
    import threading

    _ship(farm, project, "pool")
    todo: queue_mod.Queue[str] = queue_mod.Queue()
    for cfg in configs:
        todo.put(cfg)
    errors: list[str] = []

    def worker(host: int, gpu: int) -> None:
        while True:
            try:
                cfg = todo.get_nowait()
            except queue_mod.Empty:
                return
            cmd = f"cd /root/pool && cfg={shlex.quote(cfg)}; " + _job_cmd("pool", "$cfg", gpu)
            proc = subprocess.run([*farm.ssh_argv(host), "--", shlex.join(["bash", "-c", cmd])],
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=3600)
            if proc.returncode != 0 or b"FAILED" in proc.stderr:
                errors.append(f"{cfg} on host {host} GPU {gpu}: {proc.stderr.decode()[-300:]}")

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(h, g)) for h in range(len(farm.hosts)) for g in range(gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if errors:
        raise RuntimeError("dynamic pool: " + "; ".join(errors[:3]))
    summaries = _summaries(farm, "pool", configs, "dynamic pool")
    return {"makespan_s": wall, "trainer_span_s": trainer_span(summaries)}


# --- main ------------------------------------------------------------------------------------------------


def main() -> int:
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
    args = parser.parse_args()

    from tests.support.testhosts import HostFarm, requirements_problem

    problem = requirements_problem()
    if problem:
        print(f"bench_makespan: {problem}", file=sys.stderr)
        return 2
    try:
        durations = parse_durations(args.durations, args.jobs, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    slots = args.hosts * args.gpus
    ideal, lower, proven = optimal_makespan(durations, slots)

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
        for i, h in enumerate(farm.hosts):
            api.hosts_add(ctx, f"bench{i}", f"root@{h.address}", key=str(farm.client_key), profile="rehearsal",
                          trust_new_host_key=True)
        baseline = None if args.no_baseline else run_baseline(farm, queue.parent, configs)
        static = None if args.no_baseline else run_static_split(farm, queue.parent, configs, args.gpus)
        pool = None if args.no_baseline else run_dynamic_pool(farm, queue.parent, configs, args.gpus)

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
        resubmit_calls, resubmit_bytes = puts.since(mark)
        api.cancel(ctx, sweep=again.sweep_id)
    finally:
        if ctx is not None:
            ctx.close()
        farm.teardown()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    during = gpuq["trips_during"]
    report = {
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
        "bundle_bytes_pushed_resubmit": resubmit_bytes, "bundle_puts_resubmit": resubmit_calls,
        "farm_start_s": round(farm_s, 2),
    }
    ideal_note = "optimal, proven" if proven else f"best found {ideal} s, lower bound {lower} s"
    print(f"{args.jobs} jobs ({args.durations} s, seed {args.seed}, sum {sum(durations)} s) on {args.hosts} hosts x "
          f"{args.gpus} emulated GPUs over real SSH; farm up in {farm_s:.1f} s")
    print(f"  {'ideal (P||Cmax, ' + ideal_note + ')':<52} {ideal if proven else lower:8.1f} s")
    print(f"  {'gpuq (ledger: first start -> last end)':<52} {gpuq['makespan_s']:8.1f} s   "
          f"gpuq/ideal {report['gpuq_over_ideal']:.3f} (target <= 1.10)")
    print(f"  {'   plan said':<52} {gpuq['planned_makespan_s']:8.1f} s")
    print(f"  {'   trainers only (first sleep start -> last end)':<52} {gpuq['trainer_span_s']:8.1f} s")
    print(f"  {'   per job beyond its sleep (wrapper, finalize)':<52} {gpuq['overhead_mean_s']:8.2f} s mean, "
          f"{gpuq['overhead_max_s']:.2f} s max")
    b = gpuq["breakdown"]
    print(f"       means per job: agent launch -> wrapper up {b['launch_to_wrapper_s']:.2f} s, wrapper -> trainer up "
          f"{b['wrapper_to_trainer_s']:.2f} s, trainer done -> exit record {b['trainer_to_exit_s']:.2f} s, "
          f"slot idle between jobs {b['slot_gap_s']:.2f} s")
    submit_label = f"   submit -> last end (submit took {gpuq['submit_s']:.2f} s)"
    print(f"  {submit_label:<52} {gpuq['submit_to_last_end_s']:8.1f} s")
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
          f"over {len(during)} calls (result collection included)")
    print(f"  bundle bytes pushed: first submit {first_push[1]} ({first_push[0]} puts), "
          f"re-submit {resubmit_bytes} ({resubmit_calls} puts; target 0)")
    baseline_part = (f" | baseline (sequential loop per host) {baseline['makespan_s']:.1f} s | baseline/gpuq "
                     f"{report['baseline_over_gpuq']:.2f}" if baseline else "")
    if static and pool:
        baseline_part += (f" | gpuq/static-split {report['gpuq_over_static_split']:.3f} | gpuq/dynamic-pool "
                          f"{report['gpuq_over_dynamic_pool']:.3f}")
    print(f"gpuq makespan {gpuq['makespan_s']:.1f} s | ideal {ideal if proven else lower:.1f} s | gpuq/ideal "
          f"{report['gpuq_over_ideal']:.3f}{baseline_part} | ssh round trips per status: "
          f"{report['ssh_round_trips_per_status_per_host']:.2f} per host | bundle bytes pushed on re-submit: "
          f"{resubmit_bytes}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
