"""Which machines to rent for a queue, from the providers' offers (``gpuq offers``, ``gpuq up --for``;
docs/providers.md, "Renting for a queue").  Pure: no I/O, no clock.

**Needs.**  Every line of the queue that is not pinned to a host (``host=``) needs machines of one shape:
``gpus=`` GPUs each, of the line's ``gpu=`` models and at least its ``gpu_mem=`` GB per GPU.  Lines that
ask the same (GPU count, models, memory) share one need; a need gets one machine, or ``nodes=`` machines
when a line of it is a multi-node job (the most any of its lines asks).  The jobs then queue on those
machines one after another: ``up --for`` rents the smallest set that lets every line be placed, not one
machine per job.

**Matching an offer.**  An offer serves a need when it has exactly the need's GPU count, its GPU type
matches one of the need's models by gpumatch's rule (the offer's ``gpu_type``: vast.ai's GPU name, a
RunPod GPU type id, a Lambda instance type; ``A100`` matches "A100 SXM4", ``gpu_1x_a100`` and "NVIDIA A100
80GB PCIe", not "A10"), and its memory per GPU is at least ``gpu_mem=``.  The memory is the provider's
figure in whole GB (RunPod's and Lambda's the size the card is sold as, vast.ai's the host's reported
MiB in whole GB of 10^9 bytes, rounded down: gpumatch's own rule).  ``gpu_mem=`` is that same GB as sold
(gpumatch), and a card reports at least as many bytes as its size in GB: a machine rented for ``gpu_mem=80``
is one the scheduler then places a ``gpu_mem=80`` job on.
An offer without a memory figure matches no ``gpu_mem=`` need (as a host whose GPUs are unknown matches no
constrained job), and an offer that is not available now matches nothing.

**Price.**  The machine's price per hour: its on-demand price, or for ``--spot`` its current minimum spot
price (RunPod's minimum bid times its GPUs, vast.ai's minimum bid for the machine).  An offer with no such
price is never chosen.  Each need takes the cheapest matching offer at or under ``max_price`` (ties: the
provider name, then the type, so a plan is the same for the same offers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from orchestrator.core.specs import JobSpec
from orchestrator.providers.models import Offer
from orchestrator.scheduling.gpumatch import GpuNeed, model_matches


@dataclass(frozen=True)
class MachineNeed:
    """Machines of one shape a queue needs: ``machines`` of ``gpus`` GPUs each matching ``need``;
    ``lines``: the queue lines that need it."""

    gpus: int
    need: GpuNeed
    machines: int = 1
    lines: tuple[int, ...] = ()

    def text(self) -> str:
        """``1x 2-GPU machine (gpu=H100 gpu_mem=80)``: the words a plan and a shortage use."""
        asks = self.need.text()
        return f"{self.machines}x {self.gpus}-GPU machine" + (f" ({asks})" if asks else " (any GPU)")


def needs_of(jobs: Iterable[JobSpec]) -> list[MachineNeed]:
    """The distinct machine shapes the jobs need, in the order of their first lines; pinned jobs need none."""
    found: dict[tuple[int, tuple[str, ...], float | None], MachineNeed] = {}
    for job in jobs:
        if job.host:
            continue
        key = (job.gpus, tuple(job.gpu), job.gpu_mem)
        old = found.get(key)
        if old is None:
            found[key] = MachineNeed(job.gpus, GpuNeed(tuple(job.gpu), job.gpu_mem), max(1, job.nodes), (job.line,))
        else:
            lines = old.lines if job.line in old.lines else (*old.lines, job.line)
            found[key] = MachineNeed(old.gpus, old.need, max(old.machines, job.nodes), lines)
    return list(found.values())


def over_cap(price_per_hour: Decimal | None, cap: Decimal | None) -> str | None:
    """Why a machine its provider priced at ``price_per_hour`` once created breaks ``cap`` (``--max-price``), in
    words; None when it does not, when there is no cap, or when the provider names no price (the offer it was
    rented from was checked against the cap before the create)."""
    if cap is None or price_per_hour is None or price_per_hour <= cap:
        return None
    return f"priced ${price_per_hour:.2f}/h once created, above --max-price ${cap:.2f}/h"


def price_of(offer: Offer, spot: bool) -> Decimal | None:
    """The machine's price per hour: on demand, or its current minimum spot price."""
    return offer.spot_price_per_hour if spot else offer.price_per_hour


def model_ok(offer: Offer, models: Sequence[str]) -> bool:
    """Whether the offer's GPU type is one of ``models`` (none: any)."""
    return not models or any(model_matches(m, offer.gpu_type) for m in models)


def memory_ok(offer: Offer, mem_gb: float | None) -> bool:
    """Whether the offer's GB per GPU, as the provider lists it, is at least ``mem_gb`` (None: any)."""
    return mem_gb is None or (offer.gpu_memory_gb is not None and offer.gpu_memory_gb >= mem_gb)


def serves(offer: Offer, gpus: int, need: GpuNeed) -> bool:
    """Whether an offer is a machine for ``gpus`` GPUs that ``need`` (see the module docstring)."""
    return (offer.available and offer.gpu_count == gpus and model_ok(offer, need.models)
            and memory_ok(offer, need.mem_gb))


def cheapest_first(offers: Iterable[Offer], spot: bool) -> list[Offer]:
    """Offers by machine price (unpriced last), then provider and type."""
    def key(offer: Offer) -> tuple[int, Decimal, str, str, str]:
        price = price_of(offer, spot)
        return (price is None, price or Decimal(0), offer.provider, offer.gpu_type, offer.display_name)
    return sorted(offers, key=key)


@dataclass(frozen=True)
class Choice:
    """One need and the offer rented for it (``need.machines`` machines of it)."""

    need: MachineNeed
    offer: Offer
    price: Decimal  # per machine-hour

    @property
    def hourly(self) -> Decimal:
        return self.price * self.need.machines


@dataclass(frozen=True)
class Shortage:
    """A need no offer fills: ``why`` in words; ``cheapest``: the cheapest matching offer, when its price
    was the only thing wrong with it."""

    need: MachineNeed
    why: str
    cheapest: Offer | None = None


@dataclass
class RentPlan:
    choices: list[Choice] = field(default_factory=list)
    short: list[Shortage] = field(default_factory=list)

    @property
    def hourly(self) -> Decimal:
        return sum((c.hourly for c in self.choices), Decimal(0))

    @property
    def complete(self) -> bool:
        return not self.short

    @property
    def too_dear(self) -> bool:
        """Short only because every matching offer costs more than the cap (waiting will not help as such)."""
        return bool(self.short) and all(s.cheapest is not None for s in self.short)


def choose(needs: Sequence[MachineNeed], offers: Sequence[Offer], *, max_price: Decimal, spot: bool) -> RentPlan:
    """The cheapest offer at or under ``max_price`` per machine-hour for each need (module docstring)."""
    plan = RentPlan()
    ranked = cheapest_first(offers, spot)
    for need in needs:
        matching = [o for o in ranked if serves(o, need.gpus, need.need) and price_of(o, spot) is not None]
        fitting = [o for o in matching if (price_of(o, spot) or Decimal(0)) <= max_price]
        if fitting:
            price = price_of(fitting[0], spot)
            assert price is not None
            plan.choices.append(Choice(need, fitting[0], price))
        elif matching:
            cheapest = matching[0]
            plan.short.append(Shortage(need, f"the cheapest matching offer, {describe(cheapest, spot)}, is over "
                                             f"--max-price ${max_price}/h", cheapest))
        else:
            kind = "spot " if spot else ""
            plan.short.append(Shortage(need, f"no {kind}offer available now matches it"))
    return plan


def per_gpu(offer: Offer, spot: bool) -> Decimal | None:
    price = price_of(offer, spot)
    return None if price is None or offer.gpu_count < 1 else price / offer.gpu_count


def describe(offer: Offer, spot: bool) -> str:
    """``vastai "A100 SXM4" 1x 80 GB at $1.20/h ($1.20/GPU-h)``."""
    price = price_of(offer, spot)
    each = per_gpu(offer, spot)
    memory = f" {offer.gpu_memory_gb} GB" if offer.gpu_memory_gb is not None else ""
    cost = "no price" if price is None else f"${price:.2f}/h (${each:.2f}/GPU-h)" if each is not None else \
        f"${price:.2f}/h"
    return f'{offer.provider} "{offer.gpu_type}" {offer.gpu_count}x{memory} at {cost}'
