"""PURE: what a plan takes and gives (``PlanJob`` in; ``Placement`` and ``Plan`` out) and when each slot of
a host frees (``slot_times``), shared by ``scheduler.plan`` and ``stealing.plan_steals``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.core.specs import Assignment, HostSlots
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed

GB = 1e9


@dataclass(frozen=True)
class PlanJob:
    job_id: str
    gpus: int
    est_s: float
    host_pin: str | None = None
    disk_bytes: int = 0  # checkpoints + scratch this job needs on its host
    nodes: int = 1  # machines the job spans (gpus on each): a Slurm host's nodes, or that many SSH hosts
    need: GpuNeed = ANY_GPU  # `gpu=` / `gpu_mem=`: only hosts whose GPUs match (none asked: any host)
    tail_s: float = 0.0  # the longest chain of work waiting on it (`after=`, chains.tail_of): such jobs go first


@dataclass(frozen=True)
class Placement:
    """Where and when (seconds from now) a planned job is projected to run."""

    job_id: str
    host: str
    start_s: float
    end_s: float
    peers: tuple[str, ...] = ()  # a multi-node job over SSH hosts: the hosts of node ranks 1.. (host is rank 0)


@dataclass(frozen=True)
class Plan:
    """``assignments`` and ``placements`` are in planned-start order (per host: run order).

    ``host_finish_s`` is, for each usable host, when its last slot is projected
    to free (work already running there included); ``makespan_s`` is the
    largest of them (0 when there are no usable hosts).
    """

    assignments: tuple[Assignment, ...]
    unplaced: tuple[tuple[str, str], ...]  # (job_id, reason)
    placements: tuple[Placement, ...] = ()
    host_finish_s: Mapping[str, float] = field(default_factory=dict)
    makespan_s: float = 0.0


def slot_times(host: HostSlots, unknown_busy_s: float) -> list[float]:
    """Seconds until each slot of ``host`` frees, ascending.

    Without ``slot_free_at``, the ``busy`` slots are assumed to free after
    ``unknown_busy_s`` (``plan`` passes the mean estimate of the jobs it plans)
    and the others are free now.
    """
    if host.slot_free_at:
        return sorted(max(0.0, t) for t in host.slot_free_at)
    total = max(0, host.total)
    busy = min(max(0, host.busy), total)
    return [0.0] * (total - busy) + [max(0.0, unknown_busy_s)] * busy
