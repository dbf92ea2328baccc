#!/usr/bin/env python3
"""What `gpu=` / `gpu_mem=` cost the pure scheduler (docs/queue.md, "GPU model and memory").

The fleet and queue of ``scripts/bench_scheduler.py`` (256 hosts x 8 GPUs, mixed speeds, busy slots,
pins, gangs, disk), the hosts given GPUs of three kinds (A100 80 GiB, H100 79.6 GiB, A10 22.5 GiB).  Per
queue size, the median of ``--repeat`` runs of:

- **baseline**: the queue without asks on hosts without GPU facts (what ``plan`` did before);
- **facts, no asks**: the same queue on the hosts with facts (their groups split by kind; the plan must
  be the baseline's: printed as ``same``);
- **30% ask**: 30% of the jobs carry one of four asks (``gpu=A100``, ``gpu_mem=40``,
  ``gpu=A100|H100 gpu_mem=79``, ``gpu=A10``); checked: every such job lands on a host that matches.

Ratios are against the baseline measured in the same run.

    python scripts/bench_gpu_constraints.py [--repeat 3] [--jobs 1000,10000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.scheduling.gpumatch import GpuNeed, host_matches  # noqa: E402
from orchestrator.scheduling.scheduler import plan  # noqa: E402
from scripts.bench_scheduler import fleet, mixed_jobs  # noqa: E402

CARDS = [(("NVIDIA A100-SXM4-80GB",), 81920.0), (("NVIDIA H100 80GB HBM3",), 81559.0), (("NVIDIA A10",), 23028.0)]
ASKS = [GpuNeed(("A100",)), GpuNeed((), 40.0), GpuNeed(("A100", "H100"), 79.0), GpuNeed(("A10",))]


def median_s(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default="1000,10000", help="queue sizes, comma-separated")
    args = parser.parse_args()
    bare = fleet(256)
    hosts = [h.model_copy(update={"gpu_models": CARDS[i % 7 % 3][0], "gpu_mem_mib": CARDS[i % 7 % 3][1]})
             for i, h in enumerate(bare)]
    by_name = {h.host: h for h in hosts}
    print(f"{'case':<34} {'seconds':>9} {'ratio':>7}  check")
    for n in (int(x) for x in args.jobs.split(",")):
        jobs = mixed_jobs(n, len(bare))
        rng = random.Random(5)
        asked = [replace(j, need=rng.choice(ASKS)) if rng.random() < 0.3 else j for j in jobs]
        base_s, base = median_s(lambda: plan(jobs, bare), args.repeat)  # noqa: B023
        facts_s, facts = median_s(lambda: plan(jobs, hosts), args.repeat)  # noqa: B023
        ask_s, got = median_s(lambda: plan(asked, hosts), args.repeat)  # noqa: B023
        need = {j.job_id: j.need for j in asked}
        ok = all(host_matches(need[a.job_id], by_name[a.host].gpu_models, by_name[a.host].gpu_mem_mib)
                 and all(host_matches(need[a.job_id], by_name[p].gpu_models, by_name[p].gpu_mem_mib) for p in a.peers)
                 for a in got.assignments)
        print(f"{f'{n} jobs: baseline':<34} {base_s:>9.3f} {1.0:>6.2f}x")
        print(f"{f'{n} jobs: facts, no asks':<34} {facts_s:>9.3f} {facts_s / base_s:>6.2f}x  "
              f"{'same' if facts == base else 'DIFFERENT'}")
        print(f"{f'{n} jobs: 30% ask':<34} {ask_s:>9.3f} {ask_s / base_s:>6.2f}x  "
              f"{'all on matching hosts' if ok else 'MISPLACED'}; {len(got.unplaced)} unplaced")


if __name__ == "__main__":
    main()
