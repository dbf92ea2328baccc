"""PURE placement: which host gets which job (``plan``: list scheduling, then polished by swaps).

Nothing here does I/O or reads the clock: callers pass what they know and get
decisions back (docs/architecture.md, docs/queue.md).

``plan`` is list scheduling.  Jobs others wait for (``after=``) go first, longest remaining chain first
(``chains.py``: the critical path first), then the rest longest first (``est_s × gpus``, ties by
job id), onto the usable host where they would *finish* earliest: on a host, a
job needing ``gpus`` slots starts when its ``gpus`` earliest-free slots are all
free and runs ``est_s / speed`` seconds there.  Only usable hosts with at least
``gpus`` slots and enough disk budget left are candidates; a ``host=`` pin is
honoured or the job stays unplaced with a reason a user can act on, and so are ``gpu=`` / ``gpu_mem=``:
a job that asks for hardware goes only to hosts whose GPUs match (``gpumatch``; a host whose GPUs are not
known matches none), decided once per distinct ask, not per job and host.  Pairwise
swaps of that order then polish the plan within a fixed budget (longest-first
alone can end ~13% past the ideal on 24 jobs over 6 slots; polished, ~1%).

The host agent runs its inbox in ``created_at`` order, starting each job the
moment enough slots are free (smaller jobs backfill).  ``Plan.assignments`` is
therefore ordered by planned start, which is non-decreasing on each host: give
the specs increasing ``created_at`` in that order and, for single-slot jobs
with accurate estimates, the agent runs exactly the planned timeline.

Its parts: ``placements`` (what a plan takes and gives), ``candidates`` (which hosts a job may go
to, or why none), ``list_scheduling`` (one pass of a job order onto the slots); ``stealing`` moves
unstarted jobs.  The estimates the plan is given (``PlanJob.est_s``) come from ``estimates.py``: ``est_min=``, the
ledger's history of similar jobs, or a guess that only orders the plan and is never shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.core.specs import Assignment, HostSlots
from orchestrator.scheduling.gpumatch import GpuNeed
from orchestrator.scheduling.list_scheduling import ListScheduler
from orchestrator.scheduling.placements import Plan, PlanJob, slot_times

# --- plan ---------------------------------------------------------------------------


IMPROVE_BUDGET = 50_000
"""Job placements ``plan`` may spend improving on the longest-first order (bounds its run time)."""


def plan(jobs: Sequence[PlanJob], hosts: Sequence[HostSlots]) -> Plan:
    """Pack ``jobs`` onto the free slots of the usable ``hosts`` (see the module docstring).

    The longest-first order is then improved by pairwise swaps, kept only when
    they leave fewer jobs unplaced, end earlier, or (same end) balance the slots
    better; the search stops at a local optimum, at the lower bound, or after
    ``IMPROVE_BUDGET`` job placements.  Same inputs, same plan (``scheduler_slots``
    finds each job's host on a large fleet without trying every host).
    """
    usable = [h for h in hosts if h.usable]
    mean_est = sum(max(0.0, j.est_s) for j in jobs) / len(jobs) if jobs else 0.0
    base = {h.host: slot_times(h, mean_est) for h in usable}
    order = sorted(jobs, key=_first)
    scheduler = ListScheduler(hosts, base)
    best = scheduler.run(order)
    best_key = best.key()
    bound = _lower_bound(jobs, usable, base)
    budget = IMPROVE_BUDGET // max(1, len(order)) - 1
    shapes = _shape_numbers(order) if budget > 0 else []
    after = _next_other_shape(shapes)
    improved = True
    while improved and budget > 0 and (best_key[0] > 0 or best_key[1] > bound * (1 + 1e-9)):
        improved = False
        for i in range(len(order) - 1):
            if budget <= 0:
                break  # spent: nothing below could run another trial
            k = i + 1
            while k < len(order) and budget > 0:
                if shapes[k] == shapes[i]:
                    k = after[k]  # the next job of another shape: swapping within a shape changes no time
                    continue
                if order[i].tail_s > 0 or order[k].tail_s > 0:
                    k += 1  # a job others wait for keeps its place: the critical path first (chains.py)
                    continue
                order[i], order[k] = order[k], order[i]
                trial = scheduler.run(order)
                budget -= 1
                if trial.key() < best_key:
                    best, best_key, improved = trial, trial.key(), True
                    shapes[i], shapes[k] = shapes[k], shapes[i]
                    after = _next_other_shape(shapes)
                else:
                    order[i], order[k] = order[k], order[i]
                k += 1
    best.placed.sort(key=lambda p: (p[0], p[1]))
    placements = tuple(p for _, _, p in best.placed)
    host_finish = {name: max(times, default=0.0) for name, times in best.slots.items()}
    return Plan(
        assignments=tuple(Assignment(job_id=p.job_id, host=p.host, peers=p.peers, start_s=p.start_s)
                          for p in placements),
        unplaced=tuple(best.unplaced),
        placements=placements,
        host_finish_s=host_finish,
        makespan_s=max(host_finish.values(), default=0.0),
    )


def _first(job: PlanJob) -> tuple[int, float, str]:
    """The list order: jobs others wait for first, longest remaining chain (the job and the work waiting behind
    it, ``chains.tail_of``) first; then the rest longest first (``est_s × gpus``); ties by job id."""
    if job.tail_s > 0:
        return 0, -(max(0.0, job.est_s) + job.tail_s), job.job_id
    return 1, -max(0.0, job.est_s) * max(1, job.gpus), job.job_id


def _shape_numbers(order: Sequence[PlanJob]) -> list[int]:
    """One number per job, the same for jobs of the same shape: swapping two such jobs changes no time,
    only which id runs where."""
    numbers: dict[tuple[float, int, str | None, int, int, GpuNeed], int] = {}
    return [numbers.setdefault((j.est_s, j.gpus, j.host_pin, j.disk_bytes, j.nodes, j.need), len(numbers))
            for j in order]


def _next_other_shape(shapes: Sequence[int]) -> list[int]:
    """For each position, the first later position holding another shape (``len(shapes)`` if none)."""
    after = [len(shapes)] * len(shapes)
    for k in range(len(shapes) - 2, -1, -1):
        after[k] = k + 1 if shapes[k + 1] != shapes[k] else after[k + 1]
    return after


def _lower_bound(jobs: Sequence[PlanJob], usable: Sequence[HostSlots], base: Mapping[str, list[float]]) -> float:
    """No plan ends before this: all the work spread over every slot's speed, or the longest job on the fastest host."""
    capacity = sum(h.speed * h.total for h in usable)
    if not jobs or capacity <= 0:
        return 0.0
    fastest = max(h.speed for h in usable)
    work = sum(max(0.0, j.est_s) * max(1, j.gpus) for j in jobs)
    work += sum(h.speed * t for h in usable for t in base[h.host])
    return max(work / capacity, max(max(0.0, j.est_s) for j in jobs) / fastest)
