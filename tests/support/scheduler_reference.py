"""ORACLE for the scheduler equivalence tests: ``orchestrator/scheduling/scheduler.py`` verbatim as of commit
26cf49d (``git log -1 --format=%h`` before the scaling work); not used by gpuq itself.

``tests/unit/test_scheduler_equivalence.py`` and ``scripts/bench_scheduler.py`` compare the
optimised ``orchestrator.scheduling.scheduler`` against this copy: every ``plan`` and ``plan_steals`` result
must be equal.  Only this first paragraph was added; do not edit the code below.

The original module docstring:

PURE placement: which host gets which job, and which unstarted jobs should move.

Nothing here does I/O or reads the clock: callers pass what they know and get
decisions back (docs/architecture.md, docs/queue.md).

``plan`` is list scheduling.  Jobs go longest first (``est_s × gpus``, ties by
job id) onto the usable host where they would *finish* earliest: on a host, a
job needing ``gpus`` slots starts when its ``gpus`` earliest-free slots are all
free and runs ``est_s / speed`` seconds there.  Only usable hosts with at least
``gpus`` slots and enough disk budget left are candidates; a ``host=`` pin is
honoured or the job stays unplaced with a reason a user can act on.  Pairwise
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

``estimate_s`` turns a queue line into seconds: ``est_min`` when given, else the
ledger's history of similar jobs (``Ledger.run_history``), else a default that only
orders the plan; ``estimate_source`` says whether an estimate is one a person may be
shown (est_min= or history) or that guess, which is never shown (docs/queue.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.core.specs import DEFAULT_EPOCHS, Assignment, HostSlots

DEFAULT_EST_S_PER_EPOCH = 60.0
"""Seconds per epoch assumed when neither ``est_min`` nor any history is known."""

GB = 1e9

RunRecord = tuple[str, str, int, float]
"""(config path, task, epochs, seconds) of one successful run (``Ledger.run_history``)."""


# --- estimates ----------------------------------------------------------------------


@dataclass(frozen=True)
class EpochRates:
    """Mean seconds per epoch from history, by (config, task) and by task."""

    by_config_task: Mapping[tuple[str, str], float] = field(default_factory=dict)
    by_task: Mapping[str, float] = field(default_factory=dict)
    runs_by_config_task: Mapping[tuple[str, str], int] = field(default_factory=dict)
    runs_by_task: Mapping[str, int] = field(default_factory=dict)
    whole_runs: Mapping[tuple[str, str], list[float]] = field(default_factory=dict)  # jobs without epochs


def epoch_rates(history: Iterable[RunRecord]) -> EpochRates:
    """Index run history once (the mean of each run's seconds per epoch).

    Runs with no positive duration say nothing; runs without epochs (0: not given) count as whole
    runs of their config and task (a config path must name them: jobs without one are not alike).
    """
    pair: dict[tuple[str, str], list[float]] = {}
    task: dict[str, list[float]] = {}
    whole: dict[tuple[str, str], list[float]] = {}
    for config, task_name, epochs, seconds in history:
        if seconds <= 0:
            continue
        if epochs <= 0:
            if config:
                whole.setdefault((config, task_name), []).append(seconds)
            continue
        rate = seconds / epochs
        pair.setdefault((config, task_name), []).append(rate)
        task.setdefault(task_name, []).append(rate)
    return EpochRates(
        by_config_task={k: sum(v) / len(v) for k, v in pair.items()},
        by_task={k: sum(v) / len(v) for k, v in task.items()},
        runs_by_config_task={k: len(v) for k, v in pair.items()},
        runs_by_task={k: len(v) for k, v in task.items()},
        whole_runs=whole,
    )


def estimate_source(*, config: str, task: str, epochs: int | None, est_min: float | None,
                    rates: EpochRates) -> str | None:
    """Where an honest estimate of this job comes from ("est_min=", "history of N runs"); None when
    there is none (``estimate_s`` then only guesses for the plan's order: never show that number)."""
    if est_min is not None and est_min > 0:
        return "est_min="
    if not epochs:
        runs = len(rates.whole_runs.get((config, task), ()))
    else:
        runs = rates.runs_by_config_task.get((config, task)) or rates.runs_by_task.get(task, 0)
    return f"history of {runs} runs" if runs else None


def estimate_s(
    *,
    config: str,
    task: str,
    epochs: int | None,
    est_min: float | None = None,
    history: Iterable[RunRecord] | EpochRates = (),
) -> float:
    """Estimated seconds for one job on a speed-1.0 host.

    ``est_min`` from the queue wins; else the mean seconds per epoch of
    successful runs with the same config path and task, × ``epochs``; else
    the same for the task alone; else ``DEFAULT_EST_S_PER_EPOCH`` × ``epochs``.
    Pass an :class:`EpochRates` (from :func:`epoch_rates`) when estimating many
    jobs against the same history.
    """
    if est_min is not None and est_min > 0:
        return est_min * 60.0
    rates = history if isinstance(history, EpochRates) else epoch_rates(history)
    if not epochs:  # nothing gave epochs: whole runs of this config, else the plan's guess (never shown)
        runs = rates.whole_runs.get((config, task))
        return sum(runs) / len(runs) if runs else DEFAULT_EST_S_PER_EPOCH * DEFAULT_EPOCHS
    per_epoch = rates.by_config_task.get((config, task))
    if per_epoch is None:
        per_epoch = rates.by_task.get(task, DEFAULT_EST_S_PER_EPOCH)
    return max(0, epochs) * per_epoch


# --- plan ---------------------------------------------------------------------------


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


IMPROVE_BUDGET = 50_000
"""Job placements ``plan`` may spend improving on the longest-first order (bounds its run time)."""


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
    ``IMPROVE_BUDGET`` job placements.  Same inputs, same plan.
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
    improved = True
    while improved and budget > 0 and (best_key[0] > 0 or best_key[1] > bound * (1 + 1e-9)):
        improved = False
        for i in range(len(order) - 1):
            for k in range(i + 1, len(order)):
                if budget <= 0 or _same_shape(order[i], order[k]):
                    continue
                order[i], order[k] = order[k], order[i]
                trial = scheduler.run(order)
                budget -= 1
                if trial.key() < best_key:
                    best, best_key, improved = trial, trial.key(), True
                else:
                    order[i], order[k] = order[k], order[i]
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


def _same_shape(a: PlanJob, b: PlanJob) -> bool:
    """Swapping two such jobs changes no time, only which id runs where."""
    return (a.est_s, a.gpus, a.host_pin, a.disk_bytes, a.nodes) == (b.est_s, b.gpus, b.host_pin, b.disk_bytes,
                                                                    b.nodes)


def _lower_bound(jobs: Sequence[PlanJob], usable: Sequence[HostSlots], base: Mapping[str, list[float]]) -> float:
    """No plan ends before this: all the work spread over every slot's speed, or the longest job on the fastest host."""
    capacity = sum(h.speed * h.total for h in usable)
    if not jobs or capacity <= 0:
        return 0.0
    fastest = max(h.speed for h in usable)
    work = sum(max(0.0, j.est_s) * max(1, j.gpus) for j in jobs)
    work += sum(h.speed * t for h in usable for t in base[h.host])
    return max(work / capacity, max(max(0.0, j.est_s) for j in jobs) / fastest)


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


# --- work stealing ------------------------------------------------------------------


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
