"""The work-stealing search behind ``stealing.plan_steals``, kept fast on long inboxes.

``plan_steals`` proposes one move at a time: the first job, taking sources most loaded first (latest
projected drain, then name) and each source's inbox from its tail, that its agent would not start now
and that would finish earlier on a host with slots free now.  Projecting an inbox means running the
agent's rule (:func:`agent_run`) over it; this module keeps each source's projection between moves and
redoes only what a move changes:

* only the source's inbox changes.  When the moved job is the last of it to start (its agent starts
  every other job earlier, or at the same time and ahead of it), no other job's start or end changes;
  otherwise the source is projected again;
* a job that could not move stays unable to while its own projection stands: targets only lose free
  slots and disk, and a job once moved stays moved.  So each source remembers how many jobs at its
  tail are known to stay, and the next search starts behind them.

Pure: nothing here reads the clock or does I/O.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from orchestrator.core.specs import HostSlots
from orchestrator.scheduling.gpumatch import GpuNeed, host_matches

INF = float("inf")


class Queued(Protocol):
    """What the search reads of a job waiting in an inbox (``stealing.QueuedJob``)."""

    @property
    def job_id(self) -> str: ...

    @property
    def gpus(self) -> int: ...

    @property
    def est_s(self) -> float: ...

    @property
    def host_pin(self) -> str | None: ...

    @property
    def disk_bytes(self) -> int: ...

    @property
    def need(self) -> GpuNeed: ...


J = TypeVar("J", bound=Queued)


def agent_run(times: Sequence[float], queue: Sequence[Queued], speed: float) -> dict[str, tuple[float, float]]:
    """{job_id: (start, end)} as the agent would run ``queue``: in order, each job the moment
    enough slots are free, smaller jobs backfilling; a job larger than the host never starts.

    Each round takes the slots free at ``now`` and starts, in inbox order, every waiting job that fits
    in what is left; the next round is at the next time a slot frees.  (A job that ends at once frees
    its slots for the next round, not this one.)  The next job to start is therefore always the first
    waiting one that fits: the waiting jobs are kept in one line per size, and only the lines' heads
    are compared."""
    busy = sorted(times)  # a sorted list is a heap: the slots not free yet, by when they free
    total = len(busy)
    out: dict[str, tuple[float, float]] = {}
    lines: dict[int, deque[tuple[int, Queued]]] = {}  # slots needed -> the jobs waiting, in inbox order
    for place, job in enumerate(queue):
        need = max(1, job.gpus)
        if need > total:
            out[job.job_id] = (INF, INF)
        else:
            lines.setdefault(need, deque()).append((place, job))
    sizes = sorted(lines.items())
    waiting = sum(len(line) for line in lines.values())
    free = 0  # slots free at `now`
    now = 0.0
    while waiting:
        while busy and busy[0] <= now:
            heapq.heappop(busy)
            free += 1
        while free:
            first: deque[tuple[int, Queued]] | None = None
            for need, line in sizes:
                if need > free:
                    break
                if line and (first is None or line[0][0] < first[0][0]):
                    first = line
            if first is None:
                break
            job = first.popleft()[1]
            need = max(1, job.gpus)
            end = now + max(0.0, job.est_s) / speed
            out[job.job_id] = (now, end)
            free -= need
            waiting -= 1
            for _ in range(need):
                heapq.heappush(busy, end)
        while busy and busy[0] <= now:  # ended at once: free in the next round
            heapq.heappop(busy)
            free += 1
        if busy:
            now = busy[0]
        # else: every slot is free at `now`, and each waiting job fits the host: the next round starts one
    return out


@dataclass
class Inbox(Generic[J]):
    """One source's unclaimed jobs in run order, as projected."""

    queue: list[J]
    runs: dict[str, tuple[float, float]] = field(default_factory=dict)  # job_id -> (start, end)
    drain: float = 0.0  # when its last job ends (inf: never, on a host that starts nothing)
    by_start: list[tuple[float, int, J]] = field(default_factory=list)  # started jobs by (start, place in inbox)
    staying: int = 0  # jobs at the tail known not to move


class StealSearch(Generic[J]):
    """The inboxes of ``plan_steals`` with their projections (see the module docstring)."""

    def __init__(self, queued: Mapping[str, Sequence[J]], info: Mapping[str, HostSlots],
                 times: Mapping[str, Sequence[float]]) -> None:
        """``info`` by host name; ``times``: the slot times of each usable host with an inbox."""
        self.info = info
        self.times = times
        self.inboxes: dict[str, Inbox[J]] = {}
        self.matching: dict[GpuNeed, frozenset[str]] = {}  # per distinct `gpu=` / `gpu_mem=`: hosts that match
        for name, queue in queued.items():
            self.inboxes[name] = inbox = Inbox(list(queue))
            self._project(name, inbox)

    def _project(self, name: str, inbox: Inbox[J]) -> None:
        queue = inbox.queue
        inbox.staying = 0
        if name not in self.times:  # unusable or unknown: its agent starts nothing
            inbox.runs = {j.job_id: (INF, INF) for j in queue}
            inbox.drain = INF if queue else 0.0
            inbox.by_start = []
            return
        inbox.runs = runs = agent_run(self.times[name], queue, self.info[name].speed)
        inbox.drain = max((end for _, end in runs.values()), default=0.0)
        if len(runs) == len(queue):  # ids unique in this inbox: a move may keep the projection
            inbox.by_start = sorted((runs[j.job_id][0], k, j) for k, j in enumerate(queue)
                                    if runs[j.job_id][0] != INF)
        else:
            inbox.by_start = []

    def _matching(self, need: GpuNeed) -> frozenset[str]:
        found = self.matching.get(need)
        if found is None:
            found = self.matching[need] = frozenset(
                name for name, h in self.info.items() if host_matches(need, h.gpu_models, h.gpu_mem_mib))
        return found

    def next_move(self, spare: Mapping[str, int], disk: Mapping[str, float | None],
                  moved: set[str]) -> tuple[J, str, str, int] | None:
        """The best single move now: (job, source, target, the job's place in the source's inbox), or None."""
        targets = [(name, free) for name, free in spare.items() if free > 0]
        if not targets:
            return None
        inboxes = self.inboxes
        for source in sorted(inboxes, key=lambda n: (-inboxes[n].drain, n)):
            inbox = inboxes[source]
            queue = inbox.queue
            for k in range(len(queue) - 1 - inbox.staying, -1, -1):
                job = queue[k]
                target = None if job.host_pin is not None or job.job_id in moved else \
                    self._target(job, source, inbox.runs[job.job_id], targets, disk)
                if target is not None:
                    return job, source, target, k
                inbox.staying += 1
        return None

    def _target(self, job: J, source: str, run: tuple[float, float], targets: Sequence[tuple[str, int]],
                disk: Mapping[str, float | None]) -> str | None:
        start, end = run
        if start <= 0:
            return None  # its agent starts it now
        need = max(1, job.gpus)
        best: tuple[float, int, str] | None = None
        for target, free in targets:
            left = disk[target]
            if target == source or free < need or (left is not None and left < job.disk_bytes):
                continue
            if job.need and target not in self._matching(job.need):
                continue
            finish = max(0.0, job.est_s) / self.info[target].speed
            if finish < end and (best is None or (finish, free, target) < best):
                best = (finish, free, target)
        return None if best is None else best[2]

    def remove(self, source: str, job: J, place: int) -> None:
        """``job`` (at ``place`` in ``source``'s inbox) moves away: keep or redo the source's projection."""
        inbox = self.inboxes[source]
        if len(inbox.runs) != len(inbox.queue):  # an id given twice: drop every copy, project again
            inbox.queue = [j for j in inbox.queue if j is not job]
            self._project(source, inbox)
            return
        del inbox.queue[place]
        start, end = inbox.runs.pop(job.job_id)
        if start != INF:
            if inbox.by_start[-1][2] is not job:  # another job starts after it: that may change
                self._project(source, inbox)
                return
            inbox.by_start.pop()
        if end >= inbox.drain:
            inbox.drain = max((e for _, e in inbox.runs.values()), default=0.0)
