"""What a job cost: GPU-hours (CPU-hours for attempts on CPU slots), money, and the GPU-hours
preemptions threw away.  Pure.

The one cost policy of gpuq (``gpuq status``, the dashboard, ``results`` and ``report`` all call it):
each attempt carries the price of its host when it started (the whole machine, dollars per hour;
fixed by the ledger when the attempt is created, ``ledger/store._price``) and its share of the
machine (its GPUs / the machine's).  A host's price that changes later never changes what an
attempt that already started costs: prices change, bills do not.  Work lost to a preemption or a vanished
attempt is the time from the newest checkpoint it could resume from to the attempt's last sign of
life (its last heartbeat), times its GPUs: what the resumed attempt had to train again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from orchestrator.core.states import AttemptState

if TYPE_CHECKING:  # the ledger (sqlalchemy) only for the types: views.text must stay cheap to import
    from orchestrator.ledger import Attempt, Checkpoint

LOST_STATES = (AttemptState.PREEMPTED.value, AttemptState.LOST.value)


@dataclass(frozen=True, slots=True)  # one per job of a sweep: no dict each
class JobCost:
    gpu_hours: float
    cost: float | None  # None when no attempt ran on a priced host
    lost_gpu_hours: float  # trained again after preemptions and losses
    preemptions: int
    cpu_hours: float = 0.0  # slot-hours of attempts that ran on CPU slots (never counted as GPU-hours)


class Billed(Protocol):
    """What the money of an attempt is reckoned from: a ledger ``Attempt``, or the few columns of one that a
    budget reads over a whole sweep (``ledger.PricedAttempt``)."""

    @property
    def started_at(self) -> float | None: ...

    @property
    def ended_at(self) -> float | None: ...

    @property
    def price_per_hour(self) -> float | None: ...

    @property
    def gpu_share(self) -> float: ...


CLAIM_SLACK_S = 30.0  # a host's clock this far outside what gpuq saw is skew, not a claim worth a finding


@dataclass(frozen=True)
class Seen:
    """What gpuq itself saw of an attempt, on its own clock: when it dispatched the spec, the first and the
    latest probe that saw it running, the first that saw it ended (None: not seen)."""

    dispatched: float
    running: float | None = None
    alive: float | None = None
    ended: float | None = None


@dataclass(frozen=True)
class Interval:
    """An attempt's billed interval (what cost and budgets count) and whether a host claim fell outside it."""

    started: float | None
    ended: float | None
    start_outside: bool = False
    end_outside: bool = False


def billed_interval(claim_start: float | None, claim_end: float | None, seen: Seen, now: float) -> Interval:
    """Clamp a host's claimed start and end to what gpuq saw (docs/cost.md, "The billed interval"): the start
    no earlier than the dispatch, no later than the first sight of it running (or ended, or now); the end no
    later than the first sight of it ended (now while none), no earlier than the start or the latest sight of
    it running.  A host that says nothing of its start but was seen running is billed from that sight."""
    late = [t for t in (seen.running, seen.ended, now) if t is not None]
    start = seen.running if claim_start is None else min(max(claim_start, seen.dispatched), min(late))
    if claim_end is None:
        end = seen.ended
    else:
        highest = seen.ended if seen.ended is not None else now
        lowest = max([t for t in (start, seen.alive) if t is not None], default=seen.dispatched)
        end = min(max(claim_end, lowest), highest)
    return Interval(start, end,
                  claim_start is not None and start is not None and abs(claim_start - start) > CLAIM_SLACK_S,
                  claim_end is not None and end is not None and abs(claim_end - end) > CLAIM_SLACK_S)


def attempt_hours(att: Billed, now: float) -> float:
    """Hours an attempt ran: from its start to its end (``now`` while it runs); 0 before it started."""
    if att.started_at is None:
        return 0.0
    end = att.ended_at if att.ended_at is not None else now
    return max(0.0, end - att.started_at) / 3600


def money_spent(attempts: Sequence[Billed], now: float) -> float | None:
    """Dollars the attempts cost at the price each fixed when it started; None when none ran on a priced host."""
    money: float | None = None
    for att in attempts:
        if att.started_at is not None and att.price_per_hour is not None:
            money = (money or 0.0) + attempt_hours(att, now) * att.price_per_hour * att.gpu_share
    return money


def job_cost(gpus: int, attempts: Sequence[Attempt], checkpoints: Sequence[Checkpoint], now: float,
             on_cpu: Callable[[Attempt], bool] | None = None) -> JobCost:
    """``gpus``: the slots each attempt held; ``on_cpu(attempt)``: whether those slots were CPUs (their
    hours are CPU-hours then)."""
    gpu_hours = 0.0
    cpu_hours = 0.0
    lost = 0.0
    for att in attempts:
        if att.started_at is None:
            continue
        end = att.ended_at if att.ended_at is not None else now
        if on_cpu is not None and on_cpu(att):
            cpu_hours += attempt_hours(att, now) * gpus
        else:
            gpu_hours += attempt_hours(att, now) * gpus
        if att.state in LOST_STATES:
            alive = att.heartbeat_at if att.heartbeat_at is not None else end
            saved = [c.written_at for c in checkpoints if c.attempt <= att.number and c.written_at <= alive]
            since = max([att.started_at, *saved])
            lost += max(0.0, alive - since) / 3600 * gpus
    preemptions = sum(a.state == AttemptState.PREEMPTED.value for a in attempts)
    return JobCost(gpu_hours, money_spent(attempts, now), lost, preemptions, cpu_hours)
