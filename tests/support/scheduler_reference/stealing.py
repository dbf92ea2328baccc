"""The oracle's work-stealing section (see the package docstring): ``plan_steals``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.specs import HostSlots
from tests.support.scheduler_reference.placing import slot_times


@dataclass(frozen=True)
class QueuedJob:
    """A job in a host's inbox that its agent has not claimed yet."""

    job_id: str
    gpus: int
    est_s: float
    host_pin: str | None = None
    disk_bytes: int = 0


@dataclass(frozen=True)
class Move:
    """Withdraw ``job_id`` from ``from_host``'s inbox (atomic rename), then enqueue it on ``to_host``."""

    job_id: str
    from_host: str
    to_host: str


def _agent_run(times: Sequence[float], queue: Sequence[QueuedJob], speed: float) -> dict[str, tuple[float, float]]:
    """{job_id: (start, end)} as the agent would run ``queue``: in order, each job the moment
    enough slots are free, smaller jobs backfilling; a job larger than the host never starts."""
    slots = sorted(times)
    total = len(slots)
    out: dict[str, tuple[float, float]] = {}
    pending = []
    for job in queue:
        if max(1, job.gpus) > total:
            out[job.job_id] = (float("inf"), float("inf"))
        else:
            pending.append(job)
    now = 0.0
    while pending:
        free = [i for i, t in enumerate(slots) if t <= now]
        waiting = []
        for job in pending:
            need = max(1, job.gpus)
            if need <= len(free):
                end = now + max(0.0, job.est_s) / speed
                for i in free[:need]:
                    slots[i] = end
                free = free[need:]
                out[job.job_id] = (now, end)
            else:
                waiting.append(job)
        pending = waiting
        later = [t for t in slots if t > now]
        if later:
            now = min(later)
        # else: only zero-length jobs started, and every slot is free again at `now`: the next
        # round starts the waiting jobs (each fits the host), so the loop always progresses
    return out


def plan_steals(queued: Mapping[str, Sequence[QueuedJob]], hosts: Sequence[HostSlots]) -> list[Move]:
    """Moves of unstarted jobs from hosts where they would wait to hosts with slots free now.

    ``queued[host]`` is that host's unclaimed inbox in run order.  A job is
    proposed for a move only when

    * it is not pinned, and would not start now on its host (its agent would
      not find enough free slots for it after the jobs ahead of it; a host that
      is unusable or unknown starts nothing);
    * the target is usable, has at least ``gpus`` slots free now that its own
      queue will not take (and the moves already proposed to it), and disk
      budget left for it (``disk_free_bytes`` minus its own queue's needs);
    * it would finish earlier on the target (start now, ``est_s / speed``) than
      where it is.

    Sources are taken most-loaded first (latest projected drain), each from
    the tail of its queue; each job moves at most once.  Moved jobs start at
    once on their target, so a later call never moves them back.
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

    remaining = {name: list(queue) for name, queue in queued.items()}
    moved: set[str] = set()
    moves: list[Move] = []
    while True:
        move = _next_steal(remaining, info, spare, disk, unknown_busy, moved)
        if move is None:
            return moves
        job, source, target = move
        moves.append(Move(job.job_id, source, target))
        moved.add(job.job_id)
        remaining[source] = [j for j in remaining[source] if j is not job]
        spare[target] -= max(1, job.gpus)
        left = disk[target]
        if left is not None:
            disk[target] = left - job.disk_bytes


def _next_steal(
    remaining: Mapping[str, Sequence[QueuedJob]],
    info: Mapping[str, HostSlots],
    spare: Mapping[str, int],
    disk: Mapping[str, float | None],
    unknown_busy: float,
    moved: set[str],
) -> tuple[QueuedJob, str, str] | None:
    """The best single move now: (job, source host, target host), or None."""
    if not any(n > 0 for n in spare.values()):
        return None
    runs: dict[str, dict[str, tuple[float, float]]] = {}
    drain: dict[str, float] = {}
    for name, queue in remaining.items():
        host = info.get(name)
        if host is None or not host.usable:
            runs[name] = {j.job_id: (float("inf"), float("inf")) for j in queue}
            drain[name] = float("inf") if queue else 0.0
            continue
        runs[name] = _agent_run(slot_times(host, unknown_busy), queue, host.speed)
        drain[name] = max((end for _, end in runs[name].values()), default=0.0)
    for source in sorted(remaining, key=lambda n: (-drain[n], n)):
        for job in reversed(remaining[source]):
            if job.host_pin is not None or job.job_id in moved:
                continue
            start, end = runs[source][job.job_id]
            if start <= 0:
                continue  # its agent starts it now
            need = max(1, job.gpus)
            best: tuple[float, int, str] | None = None
            for target, free in spare.items():
                left = disk[target]
                if target == source or free < need or (left is not None and left < job.disk_bytes):
                    continue
                finish = max(0.0, job.est_s) / info[target].speed
                if finish < end and (best is None or (finish, free, target) < best):
                    best = (finish, free, target)
            if best is not None:
                return job, source, best[2]
    return None
