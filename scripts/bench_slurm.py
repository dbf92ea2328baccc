#!/usr/bin/env python3
"""A big sweep into a real Slurm cluster: the cost of submitting it, and of one tick while it waits.

Starts a test cluster (tests/support/slurmcluster/: slurmctld on a login host, slurmd on compute
hosts, each a network namespace with its own sshd; needs root, slurm-wlm and munge), registers it with
a fresh GPUQ_HOME as a user would (``gpuq hosts add hpc --slurm root@login ...``), and measures, in one
run and on the same cluster:

- **submit**: ``api.submit`` of a ``--jobs``-line queue (default 1,000) with ``--max-jobs`` equal to it,
  into a partition set DOWN after the registration (``scontrol update PartitionName=gpu State=DOWN``),
  so all of them sit in Slurm's queue at once (reason PartitionDown) and none runs.  Wall time, and
  per job.
- **baseline submit**: what a user's script does instead: one SSH session running a bash loop of the
  same number of ``sbatch --wrap`` calls (the same partition, GRES and time limit).  The ratio
  gpuq/loop is printed: gpuq also writes each spec, batch script and launch record and checks
  exactly-once, in the same one round trip.
- **tick with N jobs in Slurm's queue**: ``api.status`` (probe, reconcile, patrol, dispatch) after the
  submit: wall time and SSH round trips to the login node, against one bare ``squeue`` over SSH of the
  same jobs (the floor of any tool that asks Slurm).
- **squeue output**: the bytes the agent's one squeue call returns for N jobs.

- **a 2-node launch vs a 1-node launch**: the partition back UP, the same one-epoch job as
  ``nodes=2 gpus=1`` and as ``nodes=1 gpus=2`` (world size 2 both times), ``--pairs`` times each, one
  job at a time, alternating: the wrapper's wall time on node 0 (from the exit record: start,
  rendezvous, training, finalize) and submit -> SUCCEEDED as gpuq saw it; medians and ratios.

Everything is cancelled (``scancel``) and torn down at the end.

    sudo python scripts/bench_slurm.py [--jobs 1000] [--ticks 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_project import TINY_CONFIG, time_one_job  # noqa: E402  (after the path insert)


def round_trips(ctx: Any) -> int:
    from orchestrator import api

    return sum(int(getattr(api.host_for(ctx, row), "round_trips", 0)) for row in ctx.ledger.hosts())


def _two_nodes_vs_one(args: argparse.Namespace, base: Path, cluster: Any) -> dict[str, Any]:
    """The same one-epoch job as nodes=2 gpus=1 and as nodes=1 gpus=2 (world size 2 both times), one
    at a time, alternating: the wrapper's wall time on node 0 (start, rendezvous, training, finalize)
    and submit -> success as gpuq saw it."""
    from orchestrator import api

    cluster.check_login(["scontrol", "update", "PartitionName=gpu", "State=UP"])
    times: dict[str, list[float]] = {"2x1": [], "1x2": []}
    whole: dict[str, list[float]] = {"2x1": [], "1x2": []}
    for rep in range(args.pairs):
        for shape, line in (("2x1", "nodes=2 gpus=1"), ("1x2", "nodes=1 gpus=2")):
            work = base / f"launch-{shape}-{rep}"
            (work / "configs").mkdir(parents=True)
            (work / "configs" / "tiny.yaml").write_text(TINY_CONFIG)
            (work / "queue.txt").write_text(f"configs/tiny.yaml classify 1 name=l{rep}x{shape} {line}\n")
            ctx = api.open_context()
            try:
                took, att = time_one_job(ctx, work / "queue.txt", "bench_slurm")
                whole[shape].append(took)
                times[shape].append(att.ended_at - att.started_at)
            finally:
                ctx.close()
    wrapper = {k: statistics.median(v) for k, v in times.items()}
    total = {k: statistics.median(v) for k, v in whole.items()}
    return {"launch_pairs": args.pairs,
            "wrapper_s_2nodes_x1": round(wrapper["2x1"], 2), "wrapper_s_1node_x2": round(wrapper["1x2"], 2),
            "wrapper_2nodes_over_1node": round(wrapper["2x1"] / wrapper["1x2"], 3),
            "submit_to_success_s_2nodes_x1": round(total["2x1"], 2),
            "submit_to_success_s_1node_x2": round(total["1x2"], 2),
            "submit_to_success_2nodes_over_1node": round(total["2x1"] / total["1x2"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=3, help="status calls to time (the median is reported)")
    ap.add_argument("--pairs", type=int, default=3, help="2-node and 1-node launches of the same job to time")
    args = ap.parse_args()

    from tests.support.slurmcluster import SlurmCluster, requirements_problem
    from tests.support.testhosts import HostFarm

    problem = requirements_problem()
    if problem:
        print(f"bench_slurm: {problem}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="gpuq-bench-slurm-"))
    farm = HostFarm(base / "farm", 3, gpus=2, routed=True).start()
    try:
        with SlurmCluster(farm, login=0, compute=(1, 2), gpus_per_node=2, cpus_per_node=2) as cluster:
            return _measure(args, base, farm, cluster)
    finally:
        farm.teardown()


def _register(args: argparse.Namespace, farm: Any, cluster: Any) -> float:
    """The login node added as a Slurm host (``hosts add --slurm``): the seconds it took."""
    from orchestrator import api

    root = cluster.shared_dir / "gpuq"
    ctx = api.open_context()
    try:
        t0 = time.perf_counter()
        api.hosts_add_slurm(ctx, "hpc", f"root@{farm.hosts[0].address}", key=str(farm.client_key),
                            profile="rehearsal", root=str(root), trust_new_host_key=True, max_jobs=args.jobs,
                            time_limit="10")
        return time.perf_counter() - t0
    finally:
        ctx.close()


def _write_queue(base: Path, jobs: int) -> Path:
    work = base / "project"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "tiny.yaml").write_text(TINY_CONFIG)
    (work / "queue.txt").write_text("".join(f"configs/tiny.yaml classify 1 name=j{i} gpus=1 seed={i}\n"
                                            for i in range(jobs)))
    return work / "queue.txt"


def _submit_and_tick(args: argparse.Namespace, cluster: Any, queue: Path) -> tuple[float, list[float], list[int], str]:
    """Submit the queue, then time ``--ticks`` status calls: (submit s, each tick's s, its round trips, sweep)."""
    from orchestrator import api

    ctx = api.open_context()
    try:
        t0 = time.perf_counter()
        result = api.submit(ctx, queue)
        submit_s = time.perf_counter() - t0
        in_slurm = [j for j in cluster.squeue() if j.name.startswith("gpuq-") and not j.ended]
        print(f"# {len(result.placements)} jobs placed, {len(in_slurm)} in Slurm's queue "
              f"({sorted({j.reason for j in in_slurm})})", flush=True)
        ticks, trips = [], []
        for _ in range(args.ticks):
            before = round_trips(ctx)
            t0 = time.perf_counter()
            api.status(ctx)
            ticks.append(time.perf_counter() - t0)
            trips.append(round_trips(ctx) - before)
    finally:
        ctx.close()
    return submit_s, ticks, trips, result.sweep_id


def _bare_squeue(farm: Any, ticks: int) -> tuple[list[float], int]:
    """One bare ``squeue`` over SSH, ``ticks`` times: (each one's seconds, the bytes of the last answer)."""
    ssh = farm.ssh_argv(0)
    squeue_s = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        out = subprocess.run([*ssh, shlex.join(["squeue", "--noheader", "--states=all", "--user", "root",
                                                "--format=%i|%T|%r|%N"])], capture_output=True, check=True)
        squeue_s.append(time.perf_counter() - t0)
    return squeue_s, len(out.stdout)


def _sbatch_loop(args: argparse.Namespace, farm: Any, cluster: Any) -> float:
    """The user's own loop: one SSH session, one sbatch per job (its jobs cancelled after): its seconds."""
    ssh = farm.ssh_argv(0)
    loop = (f"cd {shlex.quote(str(cluster.shared_dir))} && for i in $(seq {args.jobs}); do "
            "sbatch --parsable --time=10 --gres=gpu:1 --nodes=1 --ntasks=1 --output=/dev/null "
            "--job-name=loop-$i --wrap 'python3 train.py' >/dev/null || exit 1; done")
    t0 = time.perf_counter()
    subprocess.run([*ssh, "bash", "-c", shlex.quote(loop)], check=True, capture_output=True)
    loop_s = time.perf_counter() - t0
    subprocess.run([*ssh, shlex.join(["scancel", "--name", ",".join(f"loop-{i}" for i in range(1, args.jobs + 1))])],
                   check=False, capture_output=True)
    return loop_s


def _measure(args: argparse.Namespace, base: Path, farm: Any, cluster: Any) -> int:
    home = base / "home"
    os.environ["GPUQ_HOME"] = str(home)
    os.environ["GPUQ_HEARTBEAT_S"] = "5"
    from orchestrator import api

    register_s = _register(args, farm, cluster)
    # the partition stops starting jobs: every job submitted from here on waits in Slurm's queue
    cluster.check_login(["scontrol", "update", "PartitionName=gpu", "State=DOWN"])
    queue = _write_queue(base, args.jobs)
    submit_s, ticks, trips, sweep = _submit_and_tick(args, cluster, queue)
    squeue_s, squeue_bytes = _bare_squeue(farm, args.ticks)
    loop_s = _sbatch_loop(args, farm, cluster)
    ctx = api.open_context()
    try:  # gpuq's own jobs go through gpuq: the ledger says CANCELLED, nothing is retried
        api.cancel(ctx, sweep=sweep)
    finally:
        ctx.close()

    launch = _two_nodes_vs_one(args, base, cluster)
    tick = statistics.median(ticks)
    doc = {
        "jobs": args.jobs, "register_s": round(register_s, 2),
        "submit_s": round(submit_s, 2), "submit_ms_per_job": round(1000 * submit_s / args.jobs, 2),
        "loop_submit_s": round(loop_s, 2), "submit_gpuq_over_loop": round(submit_s / loop_s, 3),
        "tick_s_median": round(tick, 3), "ticks_s": [round(t, 3) for t in ticks],
        "round_trips_per_tick": trips,
        "bare_squeue_s_median": round(statistics.median(squeue_s), 3),
        "tick_over_bare_squeue": round(tick / statistics.median(squeue_s), 2),
        "squeue_bytes": squeue_bytes,
        **launch,
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
