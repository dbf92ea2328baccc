#!/usr/bin/env python3
"""Scaling of the pure scheduler: ``plan`` and ``plan_steals`` against the pre-scaling copy (the oracle).

The reference is ``tests/support/scheduler_reference/`` (``orchestrator/scheduling/scheduler.py`` before the
scaling work), measured in the same run on the same inputs.  For each case: the median wall time of
``--repeat`` runs (fewer once they took over 5 s) and the peak extra memory of one more run under
``tracemalloc`` (Python allocations made during the call: inputs are built before), for the reference
and for the new code, their ratios, and whether both gave the same result (every plan and move
compared field by field).

Cases:

- **plan N jobs on 256 hosts x 8 GPUs** (N = 1,000 / 10,000 / 100,000): a mixed fleet (speeds 1, 1.5 and
  2; a quarter of the hosts busy for a while; 2 TB disk budgets; half of them SSH hosts that may form
  gangs) and a mixed queue (1-8 GPUs, a dozen estimates including the unknown-estimate guess, 2% pinned,
  1% over 2 nodes, some disk).  The reference is skipped above 25,000 jobs (about half a minute and
  ~285 MiB at 100,000; ``--reference-100k`` runs it there too).
- **filed: 25,000 / 26,000 identical jobs on 64 hosts x 8 GPUs** (``--filed``; the reference runs once:
  ~50 s for 25,000, where its swap pass walked every pair after one trial).
- **steal: 8 busy + 8 idle hosts x 8 GPUs, 100 / 400 queued per busy host**: each busy host's slots free
  within an hour, its inbox holds mixed 1-2 GPU jobs; the idle hosts take what would finish earlier.
- **steal: 128 busy + 128 idle hosts, 400 queued per busy host** (new code only: the reference would
  project every inbox again for each of ~1,000 moves).

    python scripts/bench_scheduler.py [--repeat 3] [--filed] [--reference-100k]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core.specs import DEFAULT_EPOCHS, HostSlots  # noqa: E402
from orchestrator.scheduling import scheduler, stealing  # noqa: E402
from orchestrator.scheduling.estimates import DEFAULT_EST_S_PER_EPOCH  # noqa: E402
from orchestrator.scheduling.placements import PlanJob  # noqa: E402
from orchestrator.scheduling.stealing import QueuedJob  # noqa: E402
from tests.support import scheduler_reference as reference  # noqa: E402

GB = 10**9
MIB = 2**20
REFERENCE_MOST_JOBS = 25_000
ESTIMATES = [300.0, 600.0, 900.0, 1200.0, 1800.0, 2400.0, 3600.0, 5400.0, 7200.0, 10800.0, 14400.0,
             DEFAULT_EST_S_PER_EPOCH * DEFAULT_EPOCHS]


def fleet(count: int, seed: int = 1) -> list[HostSlots]:
    rng = random.Random(seed)
    hosts = []
    for i in range(count):
        busy = tuple(rng.uniform(60, 7200) for _ in range(8)) if i % 4 == 3 else ()
        hosts.append(HostSlots(host=f"h{i:03d}", total=8, slot_free_at=busy, speed=(1.0, 1.0, 1.5, 2.0)[i % 4],
                               disk_free_bytes=2000 * GB, gang=i % 2 == 0))
    return hosts


def mixed_jobs(n: int, hosts: int, seed: int = 2) -> list[PlanJob]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        draw = rng.random()
        jobs.append(PlanJob(f"job{i:06d}", rng.choice([1, 1, 1, 1, 2, 2, 4, 8]), rng.choice(ESTIMATES),
                            host_pin=f"h{rng.randrange(hosts):03d}" if draw < 0.02 else None,
                            disk_bytes=rng.choice([0, 0, 2 * GB, 10 * GB]), nodes=2 if 0.02 <= draw < 0.03 else 1))
    return jobs


def steal_case(busy: int, idle: int, queued: int, seed: int = 3) -> tuple[dict[str, list[QueuedJob]],
                                                                          list[HostSlots]]:
    rng = random.Random(seed)
    hosts, inboxes = [], {}
    for b in range(busy):
        name = f"b{b:03d}"
        hosts.append(HostSlots(host=name, total=8, slot_free_at=tuple(rng.uniform(60, 3600) for _ in range(8))))
        inboxes[name] = [QueuedJob(f"{name}-{k}", rng.choice([1, 1, 1, 2]), rng.choice(ESTIMATES[:7]))
                         for k in range(queued)]
    hosts += [HostSlots(host=f"i{i:03d}", total=8, speed=(1.0, 1.5)[i % 2]) for i in range(idle)]
    return inboxes, hosts


def plan_fields(plan: Any) -> tuple[Any, ...]:
    return (plan.assignments, plan.unplaced, tuple(astuple(p) for p in plan.placements), dict(plan.host_finish_s),
            plan.makespan_s)


def measure(call: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(median seconds of ``repeat`` runs, or of fewer once one took over 5 s; peak extra MiB; result)."""
    times: list[float] = []
    result = None
    while len(times) < repeat and sum(times) <= 5.0:
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    call()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return statistics.median(times), peak / MIB, result


def row(name: str, new: tuple[float, float, Any], old: tuple[float, float, Any] | None, same: str, note: str) -> None:
    new_s, new_mib, _ = new
    if old is None:
        print(f"{name:<44} {'-':>9} {new_s:>9.3f} {'-':>8} {'-':>9} {new_mib:>9.1f} {'-':>8}  {same:<5} {note}")
        return
    old_s, old_mib, _ = old
    print(f"{name:<44} {old_s:>9.3f} {new_s:>9.3f} {old_s / new_s:>7.1f}x {old_mib:>9.1f} {new_mib:>9.1f} "
          f"{old_mib / max(new_mib, 1e-3):>7.1f}x  {same:<5} {note}")


def compare(name: str, new_call: Callable[[], Any], old_call: Callable[[], Any] | None, repeat: int,
            fields: Callable[[Any], Any], note: str = "") -> None:
    old = measure(old_call, repeat) if old_call is not None else None  # the reference first
    new = measure(new_call, repeat)
    same = "-" if old is None else ("yes" if fields(old[2]) == fields(new[2]) else "NO")
    row(name, new, old, same, note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (median); fewer once "
                        "the runs so far took over 5 s")
    parser.add_argument("--filed", action="store_true", help="also the filed 25,000/26,000 identical-job cases")
    parser.add_argument("--reference-100k", action="store_true",
                        help=f"run the reference above {REFERENCE_MOST_JOBS:,} jobs too (100,000: about half a minute)")
    args = parser.parse_args()
    print(f"{'case':<44} {'ref s':>9} {'new s':>9} {'speedup':>8} {'ref MiB':>9} {'new MiB':>9} {'less':>8}  same")

    hosts = fleet(256)
    for n in (1_000, 10_000, 100_000):
        jobs = mixed_jobs(n, len(hosts))
        run_old = n <= REFERENCE_MOST_JOBS or args.reference_100k
        compare(f"plan {n:,} jobs, 256 hosts x 8 GPUs", lambda j=jobs: scheduler.plan(j, hosts),
                (lambda j=jobs: reference.plan(j, hosts)) if run_old else None, args.repeat, plan_fields,
                "" if run_old else f"reference skipped above {REFERENCE_MOST_JOBS:,} jobs")

    if args.filed:
        small = [HostSlots(host=f"h{i:02d}", total=8) for i in range(64)]
        for n in (25_000, 26_000):
            jobs = [PlanJob(f"job{i:06d}", 1, 600.0) for i in range(n)]
            compare(f"filed: {n:,} identical jobs, 64 hosts x 8", lambda j=jobs: scheduler.plan(j, small),
                    lambda j=jobs: reference.plan(j, small), args.repeat, plan_fields)

    def moves(result: Any) -> list[tuple[str, ...]]:
        return [astuple(m) for m in result]

    for busy, idle, queued in ((8, 8, 100), (8, 8, 400), (128, 128, 400)):
        inboxes, steal_hosts = steal_case(busy, idle, queued)
        run_old = busy <= 8
        compare(f"steal {queued} queued x {busy} busy, {idle} idle hosts",
                lambda q=inboxes, h=steal_hosts: stealing.plan_steals(q, h),
                (lambda q=inboxes, h=steal_hosts: reference.plan_steals(q, h)) if run_old else None,
                args.repeat, moves,
                "" if run_old else "reference skipped: it projects every inbox again per move")


if __name__ == "__main__":
    main()
