"""A sweep's budget: what it spent, what its live attempts still commit, and what may start.  Pure.

``spent`` is the money the sweep's attempts cost so far (``cost.money_spent``: the one cost policy, at the
price each attempt fixed when it started).  ``committed`` is what its live attempts (placed or running)
will still cost if each runs to its estimate: the estimate (``est_min=``, else the run history:
``estimates.estimate_s``) less the time it has run, at its own fixed price share; one running past its
estimate commits nothing more (it counts in ``spent`` as it goes).  A job with neither ``est_min=`` nor
history is counted at the scheduler's placeholder (``DEFAULT_EST_S_PER_EPOCH`` per epoch), and said so.

Against a cap: ``ok`` below ``WARN_AT``, ``warn`` from it, ``stop`` from 100 %.  A job of a capped sweep
is dispatched only while it fits: ``spent + committed + its projected cost <= cap`` (its estimate at the
price share of the host the plan gives it), in the plan's order; the first that does not fit stops the
sweep's dispatch for that tick, it and every later one stay QUEUED with a reason naming the budget, and
running jobs finish.  So the projection never passes the cap; only attempts that run past their
estimates can.  A job on a host without a price costs nothing and always fits.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from orchestrator.core.states import AttemptState
from orchestrator.money.cost import Billed, money_spent
from orchestrator.scheduling.estimates import run_groups

if TYPE_CHECKING:
    from orchestrator.scheduling.estimates import RunRecord

RULE_MONTH = "budget_month"  # escalate: the user's monthly cap (budget_usd_month) stopped dispatch
RULE = "budget"  # the findings: warn at WARN_AT, escalate when dispatch stops, info when the cap changes
WARN_AT = 0.8
LIVE = (AttemptState.STARTING.value, AttemptState.RUNNING.value)
Level = Literal["none", "ok", "warn", "stop"]
K = TypeVar("K")
Price = tuple[float, float]  # (the host's price per hour, the attempt's share of it): ledger.pricing.attempt_price


class Spending(Billed, Protocol):
    """An attempt as a budget reads it: a ledger ``Attempt`` or ``ledger.PricedAttempt``."""

    @property
    def job_id(self) -> str: ...

    @property
    def state(self) -> str: ...


def usd(value: float) -> str:
    return f"${value:,.2f}"


@dataclass(frozen=True)
class Standing:
    """One sweep against its cap, now."""

    cap: float | None  # None: no cap
    spent: float = 0.0
    committed: float = 0.0
    placeholders: int = 0  # live attempts committed at the scheduler's placeholder (no est_min=, no history)
    idle: float = 0.0  # its share of the idle billed hours of the rented machines its attempts ran on (idle_split)

    @property
    def total(self) -> float:
        return self.spent + self.idle + self.committed

    @property
    def fraction(self) -> float | None:
        return None if self.cap is None else self.total / self.cap

    @property
    def level(self) -> Level:
        if self.cap is None:
            return "none"
        if self.total >= self.cap - EPSILON:
            return "stop"
        return "warn" if self.total >= WARN_AT * self.cap - EPSILON else "ok"

    def line(self) -> str:
        """``$3.10 spent + $1.20 committed of $5.00 (86%)``; without a cap, what it spent and commits."""
        idle = f" + {usd(self.idle)} idle machine time" if self.idle else ""
        head = f"{usd(self.spent)} spent{idle} + {usd(self.committed)} committed"
        guess = (f" ({self.placeholders} running job(s) without an estimate counted at the scheduler's "
                 "placeholder)") if self.placeholders else ""
        if self.cap is None:
            return f"{head}, no cap{guess}"
        return f"{head} of {usd(self.cap)} ({self.total / self.cap:.0%}){guess}"


EPSILON = 1e-9  # dollars: a projection that lands on the cap fits it


def remaining_cost(att: Spending, est_s: float, now: float) -> float:
    """What a live attempt will still cost if it runs to ``est_s`` seconds: nothing past its estimate,
    nothing on a host without a price; the whole estimate before it started."""
    if att.state not in LIVE or att.price_per_hour is None:
        return 0.0
    ran = max(0.0, now - att.started_at) if att.started_at is not None else 0.0
    return max(0.0, est_s - ran) / 3600 * att.price_per_hour * att.gpu_share


def standing(cap: float | None, attempts: Sequence[Spending], estimates: Mapping[str, float], now: float,
             placeholders: Collection[str] = ()) -> Standing:
    """``attempts``: the sweep's attempts (those without a price add nothing); ``estimates``: seconds, by job
    id, of the jobs with a live attempt; ``placeholders``: those jobs whose estimate is the scheduler's
    placeholder."""
    committed = 0.0
    guessed = 0
    for att in attempts:
        if att.state in LIVE and att.price_per_hour is not None and att.job_id in estimates:
            committed += remaining_cost(att, estimates[att.job_id], now)
            guessed += att.job_id in placeholders
    return Standing(cap, money_spent(attempts, now) or 0.0, committed, guessed)


def projected_cost(est_s: float, price: Price | None) -> float:
    """A job's cost if it runs ``est_s`` seconds at ``price`` (0 on a host without a price)."""
    return 0.0 if price is None else est_s / 3600 * price[0] * price[1]


@dataclass(frozen=True)
class Admission:
    admitted: tuple[str, ...]
    held: Mapping[str, str]  # job id -> why it stays QUEUED (names the budget)
    added: float = 0.0  # what the admitted jobs commit
    needs: float | None = None  # the projected cost of the first job held (None: none held)

    @property
    def stopped(self) -> bool:
        return bool(self.held)


def admit(sweep_id: str, now: Standing, costs: Sequence[tuple[str, float]]) -> Admission:
    """Which of ``costs`` ((job id, projected cost), in the plan's order) start: each while the sweep's
    spent + committed + its cost stays within the cap; the first that does not fit, and every later one,
    stay QUEUED."""
    if now.cap is None:
        return Admission(tuple(job for job, _ in costs), {})
    added = 0.0
    needs: float | None = None
    admitted: list[str] = []
    held: dict[str, str] = {}
    for job, dollars in costs:
        if not held and now.total + added + dollars <= now.cap + EPSILON:
            admitted.append(job)
            added += dollars
            continue
        needs = dollars if needs is None else needs
        after = Standing(now.cap, now.spent, now.committed + added, now.placeholders, now.idle)
        held[job] = hold_reason(sweep_id, after, dollars, behind=bool(held))
    return Admission(tuple(admitted), held, added, needs)


def hold_reason(sweep_id: str, now: Standing, needs: float | None = None, *, behind: bool = False) -> str:
    """Why a capped sweep's job stays QUEUED (dispatch records it as ``still queued: <this>``): the cap is
    reached (``needs`` None), it does not fit (its projected cost ``needs``), or it waits ``behind`` one
    that does not fit (jobs start in the plan's order)."""
    assert now.cap is not None
    where = f"{usd(now.spent)} spent + {usd(now.committed)} committed"
    if behind:
        why = f"waits behind a job the sweep's budget of {usd(now.cap)} does not fit ({where})"
    elif needs is not None and needs > now.cap + EPSILON:
        why = f"it alone would cost about {usd(needs)}, more than the sweep's budget of {usd(now.cap)}"
    elif needs is not None:
        why = f"the sweep's budget of {usd(now.cap)} does not fit it ({where}; it needs about {usd(needs)})"
    else:
        why = f"the sweep's budget of {usd(now.cap)} is reached ({where})"
    return f"budget: {why}; `gpuq budget {sweep_id} USD` raises it"


def alert(now: Standing, held: bool, alerted: str | None) -> Literal["warn", "escalate"] | None:
    """The budget finding to record now, once per threshold per cap: "warn" when spent + committed reaches
    ``WARN_AT`` of the cap, "escalate" when dispatch stops: the cap ``held`` a job back (none is held when
    no job waits, even at 100 %).  ``alerted``: the severity of the sweep's newest budget finding ("info"
    or None: none since the cap was set)."""
    if now.cap is None:
        return None
    if held and alerted != "escalate":
        return "escalate"
    if now.level in ("warn", "stop") and alerted not in ("warn", "escalate"):
        return "warn"
    return None


# --- projections (submit --dry-run, gpuq budget) ---------------------------------------------------


@dataclass(frozen=True)
class Spreads:
    """The fastest and slowest of the run history, in the scheduler's order of sources: seconds per epoch
    by (config, task) and by task, and whole runs of jobs without epochs by (config, task)."""

    by_config_task: Mapping[tuple[str, str], tuple[float, float]]
    by_task: Mapping[str, tuple[float, float]]
    whole: Mapping[tuple[str, str], tuple[float, float]]


def spreads(history: Iterable[RunRecord]) -> Spreads:
    pair, task, whole = run_groups(history)  # as the scheduler's estimates read the history
    return Spreads(_span(pair), _span(task), _span(whole))


def _span(values: Mapping[K, list[float]]) -> dict[K, tuple[float, float]]:
    return {key: (min(v), max(v)) for key, v in values.items()}


def duration_range(*, config: str, task: str, epochs: int | None, est_min: float | None,
                   history: Spreads) -> tuple[float, float] | None:
    """(fastest, slowest) seconds the job may take: ``est_min=`` exactly, else the spread of the history
    ``estimates.estimate_s`` would use; None without either (no estimate)."""
    if est_min is not None and est_min > 0:
        return est_min * 60.0, est_min * 60.0
    if not epochs:
        return history.whole.get((config, task))
    rate = history.by_config_task.get((config, task)) or history.by_task.get(task)
    return None if rate is None else (rate[0] * epochs, rate[1] * epochs)


@dataclass(frozen=True)
class JobCostInput:
    name: str
    prices: Sequence[Price | None]  # its price share on each host it may run on (one: where it is placed;
    # none: no host may take it now, its gpu=/gpu_mem= matching none of them)
    seconds: tuple[float, float] | None  # duration range; None: no estimate


@dataclass(frozen=True)
class Projection:
    """What jobs will cost: ``low`` .. ``high`` dollars (``high`` None: open, some job on a priced host has no
    estimate); ``why_not``: why there is no projection at all ("" when there is one)."""

    low: float
    high: float | None
    unestimated: tuple[str, ...] = ()  # jobs that may run on a priced host, without an estimate
    unpriced: tuple[str, ...] = ()  # jobs whose every host has no price (they cost nothing here)
    why_not: str = ""
    unplaceable: tuple[str, ...] = ()  # jobs no host may take now (gpu=/gpu_mem=): not counted

    def fits(self, cap: float) -> bool | None:
        """True: even the high end fits ``cap``; False: even the low end does not; None: it may."""
        if self.why_not:
            return None
        if self.low > cap + EPSILON:
            return False
        return True if self.high is not None and self.high <= cap + EPSILON else None

    def line(self) -> str:
        if self.why_not:
            return f"projected cost unknown: {self.why_not}"
        span = usd(self.low) if self.high is not None and abs(self.high - self.low) < 0.005 else \
            f"{usd(self.low)} .. {usd(self.high) if self.high is not None else 'open'}"
        notes = []
        if self.unestimated:
            notes.append(f"{len(self.unestimated)} job(s) without est_min= or history ({_names(self.unestimated)}) "
                         "leave the high end open")
        if self.unpriced:
            notes.append(f"{len(self.unpriced)} job(s) on hosts without a price count nothing")
        if self.unplaceable:
            notes.append(f"{len(self.unplaceable)} job(s) no host can take now ({_names(self.unplaceable)}: "
                         "their gpu=/gpu_mem=) are not counted")
        return f"projected cost {span}" + (f" ({'; '.join(notes)})" if notes else "")


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def project(jobs: Sequence[JobCostInput]) -> Projection:
    """The range of what ``jobs`` cost: each job's duration range times the cheapest and dearest of its
    price shares; a job without an estimate on a priced host opens the high end."""
    if not jobs:
        return Projection(0.0, 0.0, why_not="no job to price")
    unplaceable = tuple(j.name for j in jobs if not j.prices)
    jobs = [j for j in jobs if j.prices]
    if not jobs:
        return Projection(0.0, None, unplaceable=unplaceable,
                          why_not="no host of the sweep can take these jobs now (their gpu=/gpu_mem=; `gpuq hosts "
                                  "list` shows each host's GPUs)")
    priced = [j for j in jobs if any(p is not None for p in j.prices)]
    if not priced:
        return Projection(0.0, None, unpriced=tuple(j.name for j in jobs), unplaceable=unplaceable,
                          why_not="no host these jobs may run on has a price (gpuq knows the prices of the machines "
                                  "it rents: `gpuq up`)")
    if all(j.seconds is None for j in priced):
        return Projection(0.0, None, unestimated=tuple(j.name for j in priced), unplaceable=unplaceable,
                          why_not="no job has an estimate (give est_min= on the queue lines, or let one job of each "
                                  "config run first)")
    low = high = 0.0
    open_ = []
    for job in priced:
        shares = [p[0] * p[1] for p in job.prices if p is not None]
        cheapest = 0.0 if len(shares) < len(job.prices) else min(shares)  # an unpriced host may take it
        if job.seconds is None:
            open_.append(job.name)
            continue
        low += job.seconds[0] / 3600 * cheapest
        high += job.seconds[1] / 3600 * max(shares)
    unpriced = tuple(j.name for j in jobs if not any(p is not None for p in j.prices))
    return Projection(low, None if open_ else high, tuple(open_), unpriced, unplaceable=unplaceable)


def month_start(now: float) -> float:
    """The start (UTC) of the calendar month ``now`` falls in: what a monthly cap counts from."""
    day = time.gmtime(now)
    return float(calendar.timegm((day.tm_year, day.tm_mon, 1, 0, 0, 0, 0, 0, 0)))


def spent_between(attempts: Iterable[Billed], since: float, now: float) -> float:
    """What ``attempts`` cost from ``since`` to ``now``: each one's billed time inside that window, at the price
    share it fixed when it started (``cost.money_spent``'s policy, clipped to the window)."""
    total = 0.0
    for att in attempts:
        if att.started_at is None or att.price_per_hour is None:
            continue
        start = max(att.started_at, since)
        end = min(att.ended_at if att.ended_at is not None else now, now)
        if end > start:
            total += (end - start) / 3600 * att.price_per_hour * att.gpu_share
    return total


def month_stop(cap: float | None, spent: float) -> str | None:
    """Why nothing new starts under the monthly cap ``cap`` with ``spent`` this month (None: it may)."""
    if cap is None or spent < cap - EPSILON:
        return None
    return (f"budget_usd_month: {usd(spent)} spent this month of the {usd(cap)} monthly cap; nothing new starts "
            "until next month or a higher budget_usd_month")


def idle_split(billed_usd: float, used_usd: Mapping[str, float]) -> dict[str, float]:
    """A rented machine's idle money (``billed_usd``, what it billed, less what the attempts there cost) split over
    the sweeps whose attempts ran there in proportion to what those cost (``used_usd``: sweep id -> dollars; the
    key "" for attempts of sweeps not counted now: they take their part, charged to nobody here).  A machine no
    priced attempt used charges no sweep."""
    used = sum(used_usd.values())
    if used <= 0:
        return {}
    idle = max(0.0, billed_usd - used)
    return {sweep: idle * part / used for sweep, part in used_usd.items() if sweep}
