"""What the oracle's ``plan`` places with (see the package docstring): its records, slot times, one
list-scheduling pass, gangs, candidate hosts and the reasons a job stays unplaced."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.core.specs import Assignment, HostSlots

GB = 1e9


@dataclass(frozen=True)
class PlanJob:
    job_id: str
    gpus: int
    est_s: float
    host_pin: str | None = None
    disk_bytes: int = 0  # checkpoints + scratch this job needs on its host
    nodes: int = 1  # machines the job spans (gpus on each): a Slurm host's nodes, or that many SSH hosts


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


def _unusable(host: HostSlots) -> str:
    return host.reason or "marked unusable"


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


@dataclass
class _Pass:
    """One list-scheduling pass over a job order."""

    placed: list[tuple[float, int, Placement]]
    unplaced: list[tuple[str, str]]
    slots: dict[str, list[float]]

    def key(self) -> tuple[int, float, float]:
        """Lower is better: fewer unplaced jobs, then an earlier makespan, then better-balanced slots."""
        times = [t for host in self.slots.values() for t in host]
        return len(self.unplaced), max(times, default=0.0), sum(t * t for t in times)


class _ListScheduler:
    """Each job in turn onto the candidate host where it would finish earliest (tie: earlier start, then name)."""

    def __init__(self, hosts: Sequence[HostSlots], base: Mapping[str, list[float]]) -> None:
        self.hosts = hosts
        self.by_name = {h.host: h for h in hosts}
        self.usable = sorted((h for h in hosts if h.usable), key=lambda h: h.host)
        self.base = base
        self.disk0: dict[str, float | None] = {
            h.host: None if h.disk_free_bytes is None else float(h.disk_free_bytes) for h in self.usable
        }
        self.static: dict[str, tuple[list[HostSlots], str]] = {}  # job_id → (hosts by pin and size, or why none)

    def _static(self, job: PlanJob) -> tuple[list[HostSlots], str]:
        found = self.static.get(job.job_id)
        if found is None:
            unlimited = {h.host: None for h in self.usable}
            found = _candidates(job, max(1, job.gpus), self.hosts, self.by_name, self.usable, unlimited)
            self.static[job.job_id] = found
        return found

    def run(self, order: Sequence[PlanJob]) -> _Pass:
        slots = {name: list(times) for name, times in self.base.items()}
        disk_left = dict(self.disk0)
        run = _Pass([], [], slots)
        for seq, job in enumerate(order):
            fits, why = self._static(job)
            best: tuple[float, float, str] | None = None
            est = max(0.0, job.est_s)
            for h in fits:
                left = disk_left[h.host]
                if (job.nodes > 1 and h.gang) or (left is not None and left < job.disk_bytes):
                    continue  # an SSH host takes a multi-node job only as one of a gang (below)
                start = slots[h.host][job_need(job.gpus, h) - 1]
                finish = start + est / h.speed
                if best is None or (finish, start, h.host) < best:
                    best = (finish, start, h.host)
            chosen = [best[2]] if best is not None else []
            if job.nodes > 1:
                gang = _gang(job, [h for h in fits if h.gang], slots, disk_left)
                if gang is not None and (best is None or gang[:2] < best[:2]):
                    best, chosen = (gang[0], gang[1], gang[2][0]), gang[2]
            if best is None:
                if fits:  # every host that fits it is out of disk: say how much is left
                    _, why = _candidates(job, max(1, job.gpus), self.hosts, self.by_name, self.usable, disk_left)
                run.unplaced.append((job.job_id, why))
                continue
            finish, start, name = best
            for member in chosen:
                need = job_need(job.gpus, self.by_name[member])
                times = slots[member]
                times[:need] = [finish] * need
                times.sort()
                left = disk_left[member]
                if left is not None:
                    disk_left[member] = left - job.disk_bytes
            run.placed.append((start, seq, Placement(job.job_id, name, start, finish, peers=tuple(chosen[1:]))))
        return run


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


def job_need(gpus: int, host: HostSlots) -> int:
    """Slots one job takes on ``host``: its GPUs, or the host's fixed share per job (a Slurm host
    counts places in its queue, and Slurm packs the GPUs)."""
    return host.job_slots or max(1, gpus)


def _candidates(
    job: PlanJob,
    need: int,
    hosts: Sequence[HostSlots],
    by_name: Mapping[str, HostSlots],
    usable: Sequence[HostSlots],
    disk_left: Mapping[str, float | None],
) -> tuple[list[HostSlots], str]:
    """The hosts ``job`` may go to, or none and the specific reason why."""
    if job.host_pin is not None:
        pinned = by_name.get(job.host_pin)
        if pinned is None:
            known = ", ".join(sorted(by_name)) or "none"
            return [], f"pinned to host {job.host_pin}, which is not among the hosts to plan on ({known})"
        if not pinned.usable:
            return [], f"pinned to host {job.host_pin}, which is {_unusable(pinned)}"
        # a multi-node job pinned to an SSH host runs its node 0 there, the other nodes on other hosts
        pool = [pinned] + ([h for h in usable if h.gang and h is not pinned] if job.nodes > 1 and pinned.gang else [])
    elif not usable:
        if not hosts:
            return [], "no hosts to run on"
        down = "; ".join(f"{h.host} {_unusable(h)}" for h in hosts)
        return [], f"no usable host ({down})"
    else:
        pool = list(usable)
    if job.nodes > 1 and job.host_pin is not None and pool[0].gang and pool[0].total < need:
        pool = pool[:1]  # node 0 goes to its pinned host, which is too small: said below
    elif job.nodes > 1:
        spans = [h for h in pool if not h.gang and h.max_nodes >= job.nodes]
        gang = [h for h in pool if h.gang and h.total >= need]
        if len(gang) < job.nodes:
            gang = []
        if not spans and not gang:
            most = max((h.max_nodes for h in pool if not h.gang), default=0)
            wide = sum(1 for h in pool if h.gang and h.total >= need)
            return [], (f"needs {job.nodes} nodes with gpus={need} each: {job.nodes} SSH hosts with {need} slots "
                        f"each ({wide} usable), or a Slurm host with {job.nodes} nodes"
                        + (f" (the most any has is {most})" if most > 1 else ""))
        pool = spans + gang
    fits = [h for h in pool if h.total >= job_need(job.gpus, h) and (h.max_gpus is None or need <= h.max_gpus)]
    if not fits:
        most = max(h.total if h.max_gpus is None else h.max_gpus for h in pool)
        where = f"host {job.host_pin} has" if job.host_pin is not None else "the largest usable host has"
        return [], f"needs {need} slots (gpus={need}); {where} {most}"
    room = [h for h in fits if (left := disk_left[h.host]) is None or left >= job.disk_bytes]
    if job.nodes > 1 and room and all(h.gang for h in room):  # a gang needs the disk on every node
        ready = [h.host for h in room]
        if len(ready) < job.nodes or (job.host_pin is not None and job.host_pin not in ready):
            return [], (f"needs {job.nodes} hosts with {_gb(job.disk_bytes)} of disk each"
                        + (f", {job.host_pin} among them" if job.host_pin is not None else "")
                        + f"; {len(ready)} {'has' if len(ready) == 1 else 'have'} that much left ({', '.join(ready)})")
    if not room:
        most_left = max(disk_left[h.host] or 0.0 for h in fits)
        where = (f"host {job.host_pin} has {_gb(most_left)} left" if job.host_pin is not None
                 else f"the most any host has left is {_gb(most_left)}")
        return [], f"needs {_gb(job.disk_bytes)} of disk; {where}"
    return room, ""
