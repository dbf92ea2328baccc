#!/usr/bin/env python3
"""A big sweep into a real Slurm cluster: the cost of submitting it, and of one tick while it waits.

Starts a test cluster (tests/support/slurmcluster.py: slurmctld on a login host, slurmd on compute
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

TINY = """seed: 3
batch_size: 32
model: {width: 32, depth: 1, dropout: 0.0}
data: {n_train: 256, n_val: 64, n_features: 8, n_classes: 4, noise: 1.0}
augment: {noise_std: 0.1, feature_drop: 0.0}
optim: {lr: 0.05, momentum: 0.9, weight_decay: 0.0}
schedule: {warmup_steps: 1, kind: constant}
ckpt_every_steps: 0
log_every_steps: 4
"""


def round_trips(ctx: Any) -> int:
    from orchestrator import api

    return sum(int(getattr(api.host_for(ctx, row), "round_trips", 0)) for row in ctx.ledger.hosts())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=3, help="status calls to time (the median is reported)")
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


def _measure(args: argparse.Namespace, base: Path, farm: Any, cluster: Any) -> int:
    home = base / "home"
    os.environ["GPUQ_HOME"] = str(home)
    os.environ["GPUQ_HEARTBEAT_S"] = "5"
    from orchestrator import api

    root = cluster.shared_dir / "gpuq"
    ctx = api.open_context()
    try:
        t0 = time.perf_counter()
        api.hosts_add_slurm(ctx, "hpc", f"root@{farm.hosts[0].address}", key=str(farm.client_key),
                            profile="rehearsal", root=str(root), trust_new_host_key=True, max_jobs=args.jobs,
                            time_limit="10")
        register_s = time.perf_counter() - t0
    finally:
        ctx.close()
    # the partition stops starting jobs: every job submitted from here on waits in Slurm's queue
    cluster.check_login(["scontrol", "update", "PartitionName=gpu", "State=DOWN"])
    work = base / "project"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "tiny.yaml").write_text(TINY)
    (work / "queue.txt").write_text("".join(f"configs/tiny.yaml classify 1 name=j{i} gpus=1 seed={i}\n"
                                            for i in range(args.jobs)))

    ctx = api.open_context()
    try:
        t0 = time.perf_counter()
        result = api.submit(ctx, work / "queue.txt")
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

    ssh = farm.ssh_argv(0)
    squeue_s = []
    for _ in range(args.ticks):
        t0 = time.perf_counter()
        out = subprocess.run([*ssh, shlex.join(["squeue", "--noheader", "--states=all", "--user", "root",
                                                "--format=%i|%T|%r|%N"])], capture_output=True, check=True)
        squeue_s.append(time.perf_counter() - t0)
    squeue_bytes = len(out.stdout)

    # the user's own loop: one SSH session, one sbatch per job
    loop = (f"cd {shlex.quote(str(cluster.shared_dir))} && for i in $(seq {args.jobs}); do "
            "sbatch --parsable --time=10 --gres=gpu:1 --nodes=1 --ntasks=1 --output=/dev/null "
            "--job-name=loop-$i --wrap 'python3 train.py' >/dev/null || exit 1; done")
    t0 = time.perf_counter()
    subprocess.run([*ssh, "bash", "-c", shlex.quote(loop)], check=True, capture_output=True)
    loop_s = time.perf_counter() - t0
    subprocess.run([*ssh, "scancel", "--user", "root"], check=False, capture_output=True)

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
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
