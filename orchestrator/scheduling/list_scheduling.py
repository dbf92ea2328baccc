"""PURE: one list-scheduling pass of a job order onto the slots of the usable hosts (``scheduler.plan`` runs
it on the longest-first order and on each swap it tries): each job goes to the candidate host where it
would finish earliest, a multi-node job onto a gang of hosts reserved together (``_gang``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.specs import HostSlots
from orchestrator.scheduling.candidates import host_candidates, job_need
from orchestrator.scheduling.gpumatch import GpuNeed, host_matches
from orchestrator.scheduling.placements import Placement, PlanJob
from orchestrator.scheduling.scheduler_slots import SlotGroup, SlotIndex, grouped

INDEX_FROM_HOSTS = 24
"""Candidate hosts from which ``scheduler.plan`` looks a job's best host up in its slot index rather than trying
each (the same answer either way; below this, trying each is faster)."""


@dataclass
class SchedulingPass:
    """One list-scheduling pass over a job order."""

    placed: list[tuple[float, int, Placement]]
    unplaced: list[tuple[str, str]]
    slots: dict[str, list[float]]

    def key(self) -> tuple[int, float, float]:
        """Lower is better: fewer unplaced jobs, then an earlier makespan, then better-balanced slots."""
        times = [t for host in self.slots.values() for t in host]
        return len(self.unplaced), max(times, default=0.0), sum(t * t for t in times)


FitKey = tuple[str | None, int, int, GpuNeed]
"""(host_pin, gpus, nodes, need): all that decides which hosts may take a job (disk aside)."""


@dataclass(frozen=True)
class ShapeSearch:
    """Where jobs of one shape may go, and how ``ListScheduler`` finds the best of those hosts."""

    fits: list[HostSlots]  # the hosts by pin, size and nodes (disk budgets aside); empty: never placed
    asks: tuple[tuple[SlotGroup, int], ...] | None  # (group, slot position) per group to ask; None: try each
    tries: tuple[tuple[str, int, float], ...]  # else (host, slot position, speed) of each host it may take alone


class ListScheduler:
    """Each job in turn onto the candidate host where it would finish earliest (tie: earlier start, then name)."""

    def __init__(self, hosts: Sequence[HostSlots], base: Mapping[str, list[float]]) -> None:
        self.hosts = hosts
        self.by_name = {h.host: h for h in hosts}
        self.usable = sorted((h for h in hosts if h.usable), key=lambda h: h.host)
        self.base = base
        self.disk0: dict[str, float | None] = {
            h.host: None if h.disk_free_bytes is None else float(h.disk_free_bytes) for h in self.usable
        }
        # the slot index stands in for scanning every host when host names are unique (else scan, as ever)
        self.indexed = len(self.by_name) == len(hosts)
        self.groups = grouped(self.usable) if self.indexed else []
        self.group_of = {h.host: g for g in self.groups for h in g.hosts}
        # for jobs with `gpu=` / `gpu_mem=`: groups told apart by their GPUs too (no heap until one asks)
        self.hw_groups = grouped(self.usable, hardware=True) if self.indexed else []
        self.hw_group_of = {h.host: g for g in self.hw_groups for h in g.hosts}
        self.searches: dict[FitKey, ShapeSearch] = {}
        self.whys: dict[tuple[FitKey, int], str] = {}  # why a shape that fits nowhere is unplaced, by disk needed
        self.first: dict[str, PlanJob] = {}  # a job id given twice: its first job decides where both may go
        self.duplicated: set[str] | None = None
        self.matching: dict[GpuNeed, frozenset[str]] = {}  # per distinct ask: the hosts whose GPUs match

    def _matching(self, need: GpuNeed) -> frozenset[str] | None:
        """The hosts whose GPUs match ``need`` (each host looked at once per distinct ask); None: any host."""
        if not need:
            return None
        found = self.matching.get(need)
        if found is None:
            found = self.matching[need] = frozenset(
                h.host for h in self.hosts if host_matches(need, h.gpu_models, h.gpu_mem_mib))
        return found

    def _candidates(self, job: PlanJob, disk_left: Mapping[str, float | None]) -> tuple[list[HostSlots], str]:
        return host_candidates(job, max(1, job.gpus), self.hosts, self.by_name, self.usable, disk_left,
                           self._matching(job.need))

    def _search(self, job: PlanJob, duplicated: bool) -> tuple[ShapeSearch, str]:
        if duplicated:
            job = self.first.setdefault(job.job_id, job)
        shape = (job.host_pin, job.gpus, job.nodes, job.need)
        found = self.searches.get(shape)
        if found is None:
            unlimited = {h.host: None for h in self.usable}
            fits, reason = self._candidates(job, unlimited)
            indexed = self.indexed and len(fits) >= INDEX_FROM_HOSTS
            # an SSH host takes a multi-node job only as one of a gang (``_gang``)
            tries = tuple((h.host, job_need(job.gpus, h) - 1, h.speed) for h in fits if not (job.nodes > 1 and h.gang))
            found = self.searches[shape] = ShapeSearch(fits, self._asks(job) if indexed else None, tries)
            self.whys[shape, job.disk_bytes] = reason
        if found.fits:
            return found, ""
        why = self.whys.get((shape, job.disk_bytes))
        if why is None:  # the reason may name the disk the job needs: one per amount
            unlimited = {h.host: None for h in self.usable}
            why = self._candidates(job, unlimited)[1]
            self.whys[shape, job.disk_bytes] = why
        return found, why

    def _asks(self, job: PlanJob) -> tuple[tuple[SlotGroup, int], ...] | None:
        """For a job not pinned: each group of hosts ``_candidates`` lets it run on alone, with the slot it
        starts on there (the gang hosts of a multi-node job are ``_gang``'s); None for a pinned job."""
        if job.host_pin is not None:
            return None
        need = max(1, job.gpus)
        hardware = job.need
        return tuple((g, (g.key[1] or need) - 1) for g in (self.hw_groups if hardware else self.groups)
                     if (g.key[2] is None or need <= g.key[2])
                     and (job.nodes <= 1 or (not g.key[4] and g.key[3] >= job.nodes))
                     and (not hardware or host_matches(hardware, g.key[5], g.key[6])))

    def run(self, order: Sequence[PlanJob]) -> SchedulingPass:
        slots = {name: list(times) for name, times in self.base.items()}
        disk_left = dict(self.disk0)
        run = SchedulingPass([], [], slots)
        index = SlotIndex(self.groups, self.group_of, slots)
        hw_index = SlotIndex(self.hw_groups, self.hw_group_of, slots)
        if self.duplicated is None:  # the same jobs in every order: count once
            self.duplicated = {i for i, n in Counter(job.job_id for job in order).items() if n > 1}
        duplicated = self.duplicated
        for seq, job in enumerate(order):
            twice = job.job_id in duplicated
            search, why = self._search(job, twice)
            fits = search.fits
            best: tuple[float, float, str] | None
            if twice:  # as ever: the hosts of the first job with this id, tried one by one
                best = _try_each(job, [(h.host, job_need(job.gpus, h) - 1, h.speed) for h in fits
                                       if not (job.nodes > 1 and h.gang)], slots, disk_left)
            elif search.asks is not None:
                best = _ask_index(job, search.asks, hw_index if job.need else index, disk_left)
            else:
                best = _try_each(job, search.tries, slots, disk_left)
            chosen = [best[2]] if best is not None else []
            if job.nodes > 1:
                gang = _gang(job, [h for h in fits if h.gang], slots, disk_left)
                if gang is not None and (best is None or gang[:2] < best[:2]):
                    best, chosen = (gang[0], gang[1], gang[2][0]), gang[2]
            if best is None:
                if fits:  # every host that fits it is out of disk: say how much is left
                    _, why = self._candidates(job, disk_left)
                run.unplaced.append((job.job_id, why))
                continue
            finish, start, name = best
            for member in chosen:
                need = job_need(job.gpus, self.by_name[member])
                times = slots[member]
                before = index.watched(member) if index.heaps else None
                hw_before = hw_index.watched(member) if hw_index.heaps else None
                times[:need] = [finish] * need
                times.sort()
                if before:
                    index.changed(member, before)
                if hw_before:
                    hw_index.changed(member, hw_before)
                left = disk_left[member]
                if left is not None:
                    disk_left[member] = left - job.disk_bytes
            run.placed.append((start, seq, Placement(job.job_id, name, start, finish, peers=tuple(chosen[1:]))))
        return run


def _try_each(job: PlanJob, tries: Iterable[tuple[str, int, float]], slots: Mapping[str, list[float]],
              disk_left: Mapping[str, float | None]) -> tuple[float, float, str] | None:
    """(finish, start, host) of the earliest finish over ``tries`` (host, slot position, speed) with the disk
    ``job`` needs left; ties by start, then host name."""
    est = max(0.0, job.est_s)
    best = None
    for name, position, speed in tries:
        left = disk_left[name]
        if left is not None and left < job.disk_bytes:
            continue
        start = slots[name][position]
        found = (start + est / speed, start, name)
        if best is None or found < best:
            best = found
    return best


def _ask_index(job: PlanJob, asks: Iterable[tuple[SlotGroup, int]], index: SlotIndex,
               disk_left: Mapping[str, float | None]) -> tuple[float, float, str] | None:
    """What ``_try_each`` finds over the same hosts, from each group's earliest slot at its position
    (within a group, speed is the same, so the earliest start, then name, finishes first)."""
    est = max(0.0, job.est_s)
    best = None
    for group, position in asks:
        earliest = index.earliest(group, position, disk_left, job.disk_bytes)
        if earliest is not None:
            start = earliest[0]
            found = (start + est / group.speed, start, earliest[1])
            if best is None or found < best:
                best = found
    return best


def _gang(job: PlanJob, hosts: Sequence[HostSlots], slots: Mapping[str, list[float]],
          disk_left: Mapping[str, float | None]) -> tuple[float, float, list[str]] | None:
    """A multi-node job over ``job.nodes`` distinct SSH hosts, reserved together: the hosts whose
    ``gpus``-th slot frees first (the pinned host, if any, is node 0); all start when the last of them
    is free and run at the slowest one's speed.  (finish, start, [node 0, node 1, ...]) or None."""
    need = max(1, job.gpus)
    ready = sorted((slots[h.host][need - 1], -h.speed, h.host, h) for h in hosts
                   if h.total >= need and ((left := disk_left[h.host]) is None or left >= job.disk_bytes))
    head = [r for r in ready if r[2] == job.host_pin]
    if job.host_pin is not None and not head:
        return None
    chosen = (head + [r for r in ready if r[2] != job.host_pin])[:job.nodes]
    if len(chosen) < job.nodes:
        return None
    start = max(r[0] for r in chosen)
    finish = start + max(0.0, job.est_s) / min(r[3].speed for r in chosen)
    return finish, start, [r[2] for r in chosen]
