"""Which host's n-th slot frees first: the lookup that keeps ``scheduler.plan`` fast on many hosts.

``plan`` puts each job on the candidate host where it would finish earliest: the host's ``n``-th
earliest-free slot plus ``est_s / speed``, ties by that start, then by host name.  Hosts that agree on
everything a candidate check or the finish time reads (speed, ``job_slots``, ``max_gpus``,
``max_nodes``, ``gang``; and, for a job with ``gpu=`` / ``gpu_mem=``, their GPUs' models and memory)
are interchangeable except for their slot times, and among them the earliest finish is simply the
earliest ``n``-th slot (adding the same ``est_s / speed`` keeps the order, ties included).  So each
such group keeps one heap per slot position in use, and a job asks each group once instead of every
host.  Jobs that ask nothing of the GPUs use groups that ignore them (a fleet of three GPU kinds does
not triple their groups); jobs that do, a second grouping by them as well.

Heaps hold ``(time, host)``; a host's slot times only grow, so an entry whose time is no longer the
host's is stale and dropped when it surfaces.  Nothing here reads the clock or does I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.specs import HostSlots

GroupKey = tuple[float, int, int | None, int, bool, tuple[str, ...] | None, float | None]
"""(speed, job_slots, max_gpus, max_nodes, gang, gpu_models, gpu_mem_mib): what makes two hosts
interchangeable for ``plan`` (the GPU fields None in a grouping that ignores them)."""


def group_key(host: HostSlots, hardware: bool = False) -> GroupKey:
    """``hardware``: hosts with other GPUs are told apart (for jobs with ``gpu=`` / ``gpu_mem=``)."""
    gpus = (host.gpu_models, host.gpu_mem_mib) if hardware else (None, None)
    return host.speed, host.job_slots, host.max_gpus, host.max_nodes, host.gang, *gpus


@dataclass(frozen=True)
class SlotGroup:
    """Interchangeable hosts (``number``: the group's place in its list)."""

    number: int
    key: GroupKey
    hosts: tuple[HostSlots, ...]

    @property
    def speed(self) -> float:
        return self.key[0]


def grouped(hosts: Sequence[HostSlots], hardware: bool = False) -> list[SlotGroup]:
    """``hosts`` in groups of interchangeable ones, in order of first appearance."""
    by_key: dict[GroupKey, list[HostSlots]] = {}
    for h in hosts:
        by_key.setdefault(group_key(h, hardware), []).append(h)
    return [SlotGroup(n, key, tuple(members)) for n, (key, members) in enumerate(by_key.items())]


class SlotIndex:
    """The earliest ``position``-th free slot per group of hosts, over the slot times of one planning pass.

    ``slots`` is the pass's own ``{host: sorted free times}``; call :meth:`changed` after each change to
    a host's times (with the times it had before) so the heaps follow.  Host names must be unique.
    A heap is built the first time a job asks for its group and position.
    """

    def __init__(self, groups: Sequence[SlotGroup], group_of: Mapping[str, SlotGroup],
                 slots: Mapping[str, list[float]]) -> None:
        self.groups = groups
        self.group_of = group_of
        self.slots = slots
        self.heaps: dict[tuple[int, int], list[tuple[float, str]]] = {}
        self.positions: list[list[int]] = [[] for _ in groups]  # per group: the positions with a heap

    def _fresh(self, group: SlotGroup, position: int) -> list[tuple[float, str]]:
        heap = [(self.slots[h.host][position], h.host) for h in group.hosts if h.total > position]
        heapq.heapify(heap)
        return heap

    def earliest(self, group: SlotGroup, position: int, disk_left: Mapping[str, float | None],
                 disk_bytes: int) -> tuple[float, str] | None:
        """``(time, host)`` of the group's host whose ``position``-th slot frees first (then by name), among
        its hosts with more than ``position`` slots and ``disk_bytes`` of disk left; None when there is none."""
        heap = self.heaps.get((group.number, position))
        if heap is None:
            heap = self.heaps[group.number, position] = self._fresh(group, position)
            self.positions[group.number].append(position)
        slots = self.slots
        aside: list[tuple[float, str]] = []
        found = None
        while heap:
            time, name = heap[0]
            if slots[name][position] != time:
                heapq.heappop(heap)  # stale: that slot has been taken since
                continue
            left = disk_left[name]
            if left is not None and left < disk_bytes:
                aside.append(heapq.heappop(heap))
                continue
            found = heap[0]
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    def watched(self, host: str) -> list[float]:
        """``host``'s slot times at the positions with a heap: pass them to :meth:`changed` after a change."""
        times = self.slots[host]
        return [times[p] if p < len(times) else 0.0 for p in self.positions[self.group_of[host].number]]

    def changed(self, host: str, before: Sequence[float]) -> None:
        """``host``'s slot times changed from ``before`` (:meth:`watched`), each to a later time or the same."""
        group = self.group_of[host]
        times = self.slots[host]
        for position, old in zip(self.positions[group.number], before, strict=True):
            if position < len(times) and times[position] != old:
                heap = self.heaps[group.number, position]
                heapq.heappush(heap, (times[position], host))
                if len(heap) > 2 * len(group.hosts) + 8:  # mostly stale entries: rebuild from the times
                    heap[:] = self._fresh(group, position)
