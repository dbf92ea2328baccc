"""PURE work stealing: which jobs still waiting in one host's inbox should move to a host with slots free now.

The caller carries
each move out by atomic rename out of the source inbox (if the agent has
claimed the job meanwhile, the rename fails and the job stays), then enqueues
it on the target; a job never runs twice.

Nothing here does I/O or reads the clock (``scheduler_steal`` is the search that keeps it fast).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.specs import HostSlots
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed
from orchestrator.scheduling.placements import slot_times
from orchestrator.scheduling.scheduler_steal import StealSearch


@dataclass(frozen=True)
class QueuedJob:
    """A job in a host's inbox that its agent has not claimed yet."""

    job_id: str
    gpus: int
    est_s: float
    host_pin: str | None = None
    disk_bytes: int = 0
    need: GpuNeed = ANY_GPU  # `gpu=` / `gpu_mem=`: it moves only to a host whose GPUs match


@dataclass(frozen=True)
class Move:
    """Withdraw ``job_id`` from ``from_host``'s inbox (atomic rename), then enqueue it on ``to_host``."""

    job_id: str
    from_host: str
    to_host: str


def plan_steals(queued: Mapping[str, Sequence[QueuedJob]], hosts: Sequence[HostSlots]) -> list[Move]:
    """Moves of unstarted jobs from hosts where they would wait to hosts with slots free now.

    ``queued[host]`` is that host's unclaimed inbox in run order.  A job is
    proposed for a move only when

    * it is not pinned, and would not start now on its host (its agent would
      not find enough free slots for it after the jobs ahead of it; a host that
      is unusable or unknown starts nothing);
    * the target is usable, has at least ``gpus`` slots free now that its own
      queue will not take (and the moves already proposed to it), disk
      budget left for it (``disk_free_bytes`` minus its own queue's needs), and
      GPUs that match its ``gpu=`` / ``gpu_mem=``;
    * it would finish earlier on the target (start now, ``est_s / speed``) than
      where it is.

    Sources are taken most-loaded first (latest projected drain), each from
    the tail of its queue; each job moves at most once.  Moved jobs start at
    once on their target, so a later call never moves them back.
    (``scheduler_steal`` keeps each inbox's projection between moves.)
    """
    info = {h.host: h for h in hosts}
    every = [j for queue in queued.values() for j in queue]
    unknown_busy = sum(max(0.0, j.est_s) for j in every) / len(every) if every else 0.0
    spare: dict[str, int] = {}
    disk: dict[str, float | None] = {}
    for h in hosts:
        if not h.usable:
            continue
        free = sum(1 for t in slot_times(h, unknown_busy) if t <= 0)
        for job in queued.get(h.host, ()):
            if max(1, job.gpus) <= free:
                free -= max(1, job.gpus)
        spare[h.host] = free
        own = sum(j.disk_bytes for j in queued.get(h.host, ()))
        disk[h.host] = None if h.disk_free_bytes is None else float(h.disk_free_bytes - own)

    times = {name: slot_times(info[name], unknown_busy) for name in queued if name in info and info[name].usable}
    search = StealSearch(queued, info, times)
    moved: set[str] = set()
    moves: list[Move] = []
    while True:
        found = search.next_move(spare, disk, moved)
        if found is None:
            return moves
        job, source, target, place = found
        moves.append(Move(job.job_id, source, target))
        moved.add(job.job_id)
        search.remove(source, job, place)
        spare[target] -= max(1, job.gpus)
        left = disk[target]
        if left is not None:
            disk[target] = left - job.disk_bytes
