"""PURE: dependency chains as the scheduler sees them (``after=``, docs/queue.md).

A job that others wait for carries the longest chain of estimated work waiting behind it (``tail_of``): the
plan orders such jobs first, longest remaining chain (the job itself plus its tail) first, so the critical
path starts as early as it can.  Jobs that still wait are never in a plan (the tick's gate keeps them out).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from orchestrator.scheduling.placements import PlanJob


def tail_of(est_s: Mapping[str, float], needs: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """{job: seconds of the longest chain of jobs that wait on it, directly or not} for every job some job waits
    on; ``needs`` maps a job to the jobs it waits for (acyclic: the queue refuses cycles at submit).  A job whose
    estimate is unknown counts as 0 s; a chain is never shorter than its number of links (each counts at least
    1 s), so a waited-on job always outranks one nobody waits for."""
    waiters: dict[str, list[str]] = {}
    for job, wanted in needs.items():
        for dep in wanted:
            waiters.setdefault(dep, []).append(job)
    tails: dict[str, float] = {}
    seen: set[str] = set()  # entered: a cycle (refused at submit) ends where it meets itself, never loops
    for root in sorted(waiters):  # depth first, without recursion: a chain may be thousands of jobs long
        stack = [(root, False)]
        while stack:
            job, expanded = stack.pop()
            if job in tails or (job in seen and not expanded):
                continue
            behind = waiters.get(job, [])
            if not expanded:
                seen.add(job)
                stack.append((job, True))
                stack.extend((w, False) for w in behind if w not in seen)
                continue
            tails[job] = max((max(1.0, est_s.get(w, 0.0)) + tails.get(w, 0.0) for w in behind), default=0.0)
    return {job: tails[job] for job in waiters}


def critical_first(jobs: Sequence[PlanJob], needs: Mapping[str, Sequence[str]],
                   placeable: Collection[str]) -> tuple[list[PlanJob], list[PlanJob]]:
    """(the ``placeable`` jobs, each with the estimated work waiting behind it as ``tail_s``: the plan orders them
    first, longest chain first; the others, which wait and count only for their estimates)."""
    tails = tail_of({j.job_id: j.est_s for j in jobs}, needs) if needs else {}
    now = [replace(j, tail_s=tails.get(j.job_id, 0.0)) for j in jobs if j.job_id in placeable]
    return now, [j for j in jobs if j.job_id not in placeable]
