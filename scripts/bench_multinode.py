#!/usr/bin/env python3
"""A 2-node launch against a 1-node launch of the same job, over SSH hosts.

Starts three namespace SSH hosts on a routed test network (tests/support/testhosts/: each its own
sshd and root, two emulated GPUs, training on CPU; needs root), registers them with a fresh GPUQ_HOME
as a user would, and runs the same one-epoch job as ``nodes=2 gpus=1`` (two hosts, torchrun's static
rendezvous on node 0 after the reachability check) and as ``nodes=1 gpus=2`` (one host), world size 2
both times, ``--pairs`` times each, one job at a time, alternating.  It reports the medians of:

- **the wrapper's wall time on node 0** (from its exit record: setup, the rendezvous, training,
  finalize);
- **submit -> SUCCEEDED** as gpuq saw it (planning, bundle push, delivery to every node, ticks).

Ratios 2-node / 1-node are printed side by side from the same run.  Everything is torn down at the end.

    sudo python scripts/bench_multinode.py [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_project import TINY_CONFIG, time_one_job  # noqa: E402  (after the path insert)


def _launches(args: argparse.Namespace, base: Path, farm: Any) -> dict[str, Any]:
    from orchestrator import api

    ctx = api.open_context(overrides={"heartbeat_s": 1})
    try:
        for i, host in enumerate(farm.hosts):
            api.hosts_add(ctx, f"s{i}", f"root@{host.address}", key=str(farm.client_key), profile="rehearsal",
                          root="/root/bench", trust_new_host_key=True)
    finally:
        ctx.close()
    wrapper: dict[str, list[float]] = {"2x1": [], "1x2": []}
    whole: dict[str, list[float]] = {"2x1": [], "1x2": []}
    for rep in range(args.pairs):
        for shape, line in (("2x1", "nodes=2 gpus=1"), ("1x2", "nodes=1 gpus=2")):
            work = base / f"launch-{shape}-{rep}"
            (work / "configs").mkdir(parents=True)
            (work / "configs" / "tiny.yaml").write_text(TINY_CONFIG)
            (work / "queue.txt").write_text(f"configs/tiny.yaml classify 1 name=l{rep}x{shape} {line}\n")
            ctx = api.open_context(overrides={"heartbeat_s": 1})
            try:
                took, att = time_one_job(ctx, work / "queue.txt", "bench_multinode")
                whole[shape].append(took)
                if shape == "2x1" and len(att.node_hosts()) != 2:
                    raise SystemExit(f"bench_multinode: the 2-node job ran on {att.node_hosts() or [att.host]}")
                wrapper[shape].append(att.ended_at - att.started_at)
            finally:
                ctx.close()
    w = {k: statistics.median(v) for k, v in wrapper.items()}
    t = {k: statistics.median(v) for k, v in whole.items()}
    return {"pairs": args.pairs,
            "wrapper_s_2nodes_x1": round(w["2x1"], 2), "wrapper_s_1node_x2": round(w["1x2"], 2),
            "wrapper_2nodes_over_1node": round(w["2x1"] / w["1x2"], 3),
            "submit_to_success_s_2nodes_x1": round(t["2x1"], 2), "submit_to_success_s_1node_x2": round(t["1x2"], 2),
            "submit_to_success_2nodes_over_1node": round(t["2x1"] / t["1x2"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="2-node and 1-node launches of the same job to time")
    args = ap.parse_args()
    from tests.support.testhosts import HostFarm, requirements_problem

    problem = requirements_problem()
    if problem:
        print(f"bench_multinode: {problem}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="gpuq-bench-multinode-"))
    os.environ["GPUQ_HOME"] = str(base / "home")
    farm = HostFarm(base / "farm", 3, 2, routed=True).start()
    try:
        figures = _launches(args, base, farm)
    finally:
        farm.teardown()
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
