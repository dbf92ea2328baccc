"""PURE placement: which host gets which job, and which unstarted jobs should move.

Nothing here does I/O or reads the clock: callers pass what they know and get
decisions back (docs/architecture.md, docs/queue.md).

``plan`` is list scheduling.  Jobs go longest first (``est_s × gpus``, ties by
job id) onto the usable host where they would *finish* earliest: on a host, a
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

``plan_steals`` decides work stealing: which jobs still waiting in one host's
inbox should move to a host that has slots free right now.  The caller carries
each move out by atomic rename out of the source inbox (if the agent has
claimed the job meanwhile, the rename fails and the job stays), then enqueues
it on the target; a job never runs twice.

The estimates the plan is given (``PlanJob.est_s``) come from ``estimates.py``: ``est_min=``, the
ledger's history of similar jobs, or a guess that only orders the plan and is never shown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.core.specs import Assignment, HostSlots
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed, HostGpus, host_matches, unmet
from orchestrator.scheduling.scheduler_slots import SlotGroup, SlotIndex, grouped
from orchestrator.scheduling.scheduler_steal import StealSearch

GB = 1e9


# --- plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanJob:
    job_id: str
    gpus: int
    est_s: float
    host_pin: str | None = None
    disk_bytes: int = 0  # checkpoints + scratch this job needs on its host
    nodes: int = 1  # machines the job spans (gpus on each): a Slurm host's nodes, or that many SSH hosts
    need: GpuNeed = ANY_GPU  # `gpu=` / `gpu_mem=`: only hosts whose GPUs match (none asked: any host)


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


IMPROVE_BUDGET = 50_000
"""Job placements ``plan`` may spend improving on the longest-first order (bounds its run time)."""

INDEX_FROM_HOSTS = 24
"""Candidate hosts from which ``plan`` looks a job's best host up in its slot index rather than trying
each (the same answer either way; below this, trying each is faster)."""


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
    order = sorted(jobs, key=lambda j: (-max(0.0, j.est_s) * max(1, j.gpus), j.job_id))
    scheduler = _ListScheduler(hosts, base)
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


_FitKey = tuple[str | None, int, int, GpuNeed]
"""(host_pin, gpus, nodes, need): all that decides which hosts may take a job (disk aside)."""


@dataclass(frozen=True)
class _Search:
    """Where jobs of one shape may go, and how ``_ListScheduler`` finds the best of those hosts."""

    fits: list[HostSlots]  # the hosts by pin, size and nodes (disk budgets aside); empty: never placed
    asks: tuple[tuple[SlotGroup, int], ...] | None  # (group, slot position) per group to ask; None: try each
    tries: tuple[tuple[str, int, float], ...]  # else (host, slot position, speed) of each host it may take alone


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
        # the slot index stands in for scanning every host when host names are unique (else scan, as ever)
        self.indexed = len(self.by_name) == len(hosts)
        self.groups = grouped(self.usable) if self.indexed else []
        self.group_of = {h.host: g for g in self.groups for h in g.hosts}
        # for jobs with `gpu=` / `gpu_mem=`: groups told apart by their GPUs too (no heap until one asks)
        self.hw_groups = grouped(self.usable, hardware=True) if self.indexed else []
        self.hw_group_of = {h.host: g for g in self.hw_groups for h in g.hosts}
        self.searches: dict[_FitKey, _Search] = {}
        self.whys: dict[tuple[_FitKey, int], str] = {}  # why a shape that fits nowhere is unplaced, by disk needed
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
        return _candidates(job, max(1, job.gpus), self.hosts, self.by_name, self.usable, disk_left,
                           self._matching(job.need))

    def _search(self, job: PlanJob, duplicated: bool) -> tuple[_Search, str]:
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
            found = self.searches[shape] = _Search(fits, self._asks(job) if indexed else None, tries)
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

    def run(self, order: Sequence[PlanJob]) -> _Pass:
        slots = {name: list(times) for name, times in self.base.items()}
        disk_left = dict(self.disk0)
        run = _Pass([], [], slots)
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
    matching: frozenset[str] | None = None,
) -> tuple[list[HostSlots], str]:
    """The hosts ``job`` may go to, or none and the specific reason why (``matching``: the hosts whose GPUs
    match its ``gpu=`` / ``gpu_mem=``; None: it asks for none)."""
    pool, why = _pool(job, hosts, by_name, usable, matching)
    if not why and job.nodes > 1:
        pool, why = _node_pool(job, need, pool)
    if why:
        return [], why
    fits = [h for h in pool if h.total >= job_need(job.gpus, h) and (h.max_gpus is None or need <= h.max_gpus)]
    if not fits:
        most = max(h.total if h.max_gpus is None else h.max_gpus for h in pool)
        where = f"host {job.host_pin} has" if job.host_pin is not None else "the largest usable host has"
        return [], f"needs {need} slots (gpus={need}); {where} {most}"
    return _with_disk(job, fits, disk_left)


def _pool(job: PlanJob, hosts: Sequence[HostSlots], by_name: Mapping[str, HostSlots], usable: Sequence[HostSlots],
          matching: frozenset[str] | None) -> tuple[list[HostSlots], str]:
    """The usable hosts the job's pin and hardware allow, or none and why."""
    if job.host_pin is not None:
        pinned = by_name.get(job.host_pin)
        if pinned is None:
            known = ", ".join(sorted(by_name)) or "none"
            return [], f"pinned to host {job.host_pin}, which is not among the hosts to plan on ({known})"
        if not pinned.usable:
            return [], f"pinned to host {job.host_pin}, which is {_unusable(pinned)}"
        if matching is not None and job.host_pin not in matching:
            return [], _unmet(job.need, [pinned])
        # a multi-node job pinned to an SSH host runs its node 0 there, the other nodes on other hosts
        pool = [pinned] + ([h for h in usable if h.gang and h is not pinned] if job.nodes > 1 and pinned.gang else [])
    elif not usable:
        if not hosts:
            return [], "no hosts to run on"
        down = "; ".join(f"{h.host} {_unusable(h)}" for h in hosts)
        return [], f"no usable host ({down})"
    else:
        pool = list(usable)
    if matching is not None:
        pool = [h for h in pool if h.host in matching]
        if not pool:
            return [], _unmet(job.need, hosts)
    return pool, ""


def _node_pool(job: PlanJob, need: int, pool: list[HostSlots]) -> tuple[list[HostSlots], str]:
    """For a multi-node job: the Slurm hosts that span its nodes and the SSH hosts of a gang, or why none."""
    if job.host_pin is not None and pool[0].gang and pool[0].total < need:
        return pool[:1], ""  # node 0 goes to its pinned host, which is too small: said by the caller
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
    return spans + gang, ""


def _with_disk(job: PlanJob, fits: list[HostSlots],
               disk_left: Mapping[str, float | None]) -> tuple[list[HostSlots], str]:
    """The hosts of ``fits`` with the disk the job needs left (on every node of a gang), or none and why."""
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


def _unmet(need: GpuNeed, hosts: Sequence[HostSlots]) -> str:
    return unmet(need, [HostGpus(h.host, h.gpu_models, h.gpu_mem_mib, h.usable, _unusable(h)) for h in hosts])


# --- work stealing ------------------------------------------------------------------


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
