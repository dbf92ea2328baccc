"""``gpuq up --for QUEUE --max-price USD``: rent the machines a queue needs, from the cheapest offers
(docs/providers.md, "Renting for a queue").

The queue is read and expanded as ``submit`` reads it (api/submitting.read_queue), recording nothing.
Its lines' machine shapes (orchestrator/money/rentplan.py: one need per distinct GPU count, ``gpu=`` and
``gpu_mem=``) are matched against the offers of every configured provider (api/offers.py), and each need
takes the cheapest matching offer at or under ``--max-price`` per machine-hour.  When a need has none,
nothing is rented: without ``--retry-until`` that is an error naming what is missing (and the cheapest
offer refused for its price); with it the offers are polled again after ``offers_retry_s`` seconds,
doubling up to ``offers_retry_max_s``, until every need is met or the deadline passes.

The rentals themselves are ``gpuq up``'s (api/renting.up): one ``up`` per need, each machine in the ledger
before its create call, the GPU preflight, the replacement of a machine that fails it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from orchestrator.api.offers import OfferScan, scan_offers
from orchestrator.api.rented import UpResult
from orchestrator.api.renting import check_spot, up
from orchestrator.api.submitting import read_queue
from orchestrator.context import Context, known_hosts
from orchestrator.core.errors import GpuqError, UsageError
from orchestrator.money import rentplan
from orchestrator.providers import registry


@dataclass
class ForPlan:
    """What a queue needs and what would be rented for it."""

    queue: str
    needs: list[rentplan.MachineNeed]
    plan: rentplan.RentPlan
    scan: OfferScan
    spot: bool
    max_price: Decimal
    polls: int = 1
    waited_s: float = 0.0

    def lines(self) -> list[str]:
        """The plan in words: one line per need, then the hourly total."""
        out = []
        for choice in self.plan.choices:
            lines = ", ".join(str(n) for n in choice.need.lines)
            out.append(f"{choice.need.text()} for line(s) {lines}: {rentplan.describe(choice.offer, self.spot)}")
        for short in self.plan.short:
            lines = ", ".join(str(n) for n in short.need.lines)
            out.append(f"{short.need.text()} for line(s) {lines}: {short.why}")
        if self.plan.choices:
            out.append(f"total ${self.plan.hourly:.2f} per hour while all run"
                       + ("" if self.plan.complete else " (for the machines found; nothing is rented while one is "
                                                        "missing)"))
        return out

    def missing(self) -> str:
        """One line naming what is missing (empty when nothing is)."""
        return "; ".join(f"{s.need.text()}: {s.why}" for s in self.plan.short)


@dataclass
class ForResult:
    plan: ForPlan
    rentals: list[UpResult] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # need (in words) -> why its `up` failed, nothing rented

    @property
    def ok(self) -> bool:
        return not self.failed and bool(self.rentals) and all(r.ok for r in self.rentals)


def needs(ctx: Context, queue: Path) -> list[rentplan.MachineNeed]:
    """The machine shapes a queue's unpinned lines need (rentplan.needs_of)."""
    parsed, _run, _toml = read_queue(ctx, queue, known_hosts(ctx))
    found = rentplan.needs_of(parsed.jobs)
    if not found:
        raise UsageError(f"{queue}: every line is pinned to a host (host=): there is nothing to rent for")
    return found


def plan_for(ctx: Context, queue: Path, *, max_price: float, spot: bool = False, providers: Sequence[str] = (),
             retry_until_s: float | None = None, say: Callable[[str], None] | None = None,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> ForPlan:
    """The plan for ``queue``: each need's cheapest offer at or under ``max_price`` per machine-hour.  With
    ``retry_until_s``, offers are polled again (backoff) while a need is short, until that many seconds
    have passed; the last plan is returned either way (``plan.complete`` says whether it is whole)."""
    if max_price <= 0:
        raise UsageError("--max-price must be more than 0 (US dollars per machine-hour)")
    for name in providers if spot else ():
        check_spot(registry.entry(name))  # `--for --provider runpod --spot`: one line, not "no offer"
    cap = Decimal(str(max_price))
    wanted = needs(ctx, queue)
    counts = sorted({n.gpus for n in wanted})
    # search hints only where every need shares them (rentplan.choose filters each need exactly)
    mems = [n.need.mem_gb for n in wanted]
    mem = min(m for m in mems if m is not None) if all(m is not None for m in mems) else None
    models = tuple(sorted({m for n in wanted for m in n.need.models})) if all(n.need.models for n in wanted) else ()
    started = clock()
    wait = ctx.settings.offers_retry_s
    polls = 0
    while True:
        polls += 1
        scan = scan_offers(ctx, gpu_counts=counts, models=models, mem_gb=mem, spot=spot, providers=providers)
        out = ForPlan(str(queue), wanted, rentplan.choose(wanted, scan.offers, max_price=cap, spot=spot), scan,
                      spot, cap, polls=polls, waited_s=clock() - started)
        left = (retry_until_s or 0.0) - (clock() - started)
        if out.plan.complete or retry_until_s is None or left <= 0:
            return out
        pause = min(wait, left)
        if say is not None:
            say(f"gpuq: short of offers (poll {polls}): {out.missing()}; polling again in {pause:.3g} s "
                f"({left:.0f} s left of --retry-until)")
        sleep(pause)
        wait = min(wait * 2, ctx.settings.offers_retry_max_s)


def up_for(ctx: Context, plan: ForPlan, *, key: str = "", profile: str = "", prefix: str = "",
           down_when_done: bool | None = None, say: Callable[[str], None] | None = None) -> ForResult:
    """Rent a complete plan: one ``gpuq up`` per need (its provider, the offer's GPU type and count, the
    need's machines).  A need whose ``up`` fails outright is in ``failed`` and the next ones are still
    rented: what was rented bills, and the result says so.  Each ``up`` carries the plan's cap: an offer
    taken meanwhile is replaced by the provider's next one only at or under it."""
    if not plan.plan.complete:
        raise UsageError(f"not renting for {plan.queue}: {plan.missing()}")
    out = ForResult(plan)
    for choice in plan.plan.choices:
        offer = choice.offer
        try:
            out.rentals.append(up(ctx, provider=offer.provider, gpu_type=offer.gpu_type, count=choice.need.machines,
                                  gpus=choice.need.gpus, spot=plan.spot, key=key, profile=profile, prefix=prefix,
                                  say=say, down_when_done=down_when_done, max_price=float(plan.max_price)))
        except GpuqError as exc:
            out.failed[choice.need.text()] = f"{offer.provider} {offer.gpu_type}: {exc}"
    return out
