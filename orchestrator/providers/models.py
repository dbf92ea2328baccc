"""The values every provider adapter speaks in (docs/providers.md): prices as the vendor sent them
(:func:`parse_money`), what ``list_offers`` is asked (:class:`OfferQuery`) and answers (:class:`Offer`), the
instances it reports (:class:`Instance`) and their SSH endpoints (:func:`ssh_address`), what to rent
(:class:`ProvisionRequest`, with each provider's own :class:`ProviderOptions` and the price cap it is held
to), and the names gpuq gives the instances it creates.  Data and pure rules only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import ClassVar, Literal, TypeVar

from orchestrator.core.errors import NoCapacity, ProviderError

InstanceState = Literal["pending", "running", "stopped", "exited", "terminating", "terminated", "unhealthy"]
"""Normalised instance state.  ``pending``: created, not yet running (RunPod PROVISIONING/STARTING
or an unknown status, Lambda ``booting``); ``running``: the provider says it runs (ready or not: see
:attr:`Instance.ready`); ``stopped``: stopped, its disk kept (RunPod EXITED: v2 says no more, vast.ai
stopped by request); ``exited``: ended with a reason to classify (vast.ai's outbid instances);
``terminating``: teardown sent, still billing until ``terminated``; ``unhealthy``: Lambda ``unhealthy``,
RunPod ERROR."""


def parse_money(value: object) -> Decimal | None:
    """A price as the provider sent it (number or string, docs/providers.md) → Decimal, or None.

    Floats go through ``str`` so 0.69 stays 0.69.  Negative, non-finite or unparsable values are None:
    a price gpuq cannot trust is no price.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Decimal)):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        return None
    try:
        amount = Decimal(text)
    except InvalidOperation:
        return None
    if not amount.is_finite() or amount < 0:
        return None
    return amount


def to_cents(dollars: Decimal | None) -> int | None:
    """Dollars per hour → whole cents per hour, rounded half-up (the ledger's unit)."""
    if dollars is None:
        return None
    return int((dollars * 100).quantize(Decimal(1), rounding="ROUND_HALF_UP"))


@dataclass(frozen=True)
class Offer:
    """One rentable machine shape with its price.

    ``gpu_type`` is what a :class:`ProvisionRequest` names: a RunPod GPU type id ("NVIDIA RTX A6000")
    or a Lambda instance type ("gpu_1x_a100").  Prices are US dollars per hour for the whole machine
    (``gpu_count`` GPUs).  ``min_bid_per_gpu`` is a spot market's current minimum bid per GPU-hour (vast.ai).
    ``regions`` lists regions (RunPod: data centres) with capacity now; empty when the provider does not say.
    """

    provider: str
    gpu_type: str
    display_name: str
    gpu_count: int
    price_per_hour: Decimal | None
    gpu_memory_gb: int | None = None
    spot_price_per_hour: Decimal | None = None
    min_bid_per_gpu: Decimal | None = None
    regions: tuple[str, ...] = ()
    available: bool = True

    @property
    def price_cents_per_hour(self) -> int | None:
        return to_cents(self.price_per_hour)


@dataclass(frozen=True)
class OfferQuery:
    """What one ``list_offers`` call asks for, in gpuq's units; each adapter translates it into its vendor's
    (docs/providers.md, "Offers").  ``gpu_count``: GPUs per machine (None: the adapter's default, every size
    it lists or 1).  ``gpu_name``: one provider GPU type id exactly as an :attr:`Offer.gpu_type` names it.
    ``min_gpu_memory_gb``: GB (10^9 bytes) per GPU as :attr:`Offer.gpu_memory_gb` counts them.  ``spot``:
    priced for interruptible machines (``Capabilities.spot``; an adapter without it refuses).
    ``max_price_per_hour``: the most one machine may cost (on demand its price, spot its minimum bid).
    ``region``: a region or data centre id.  Whatever a vendor cannot filter by, the adapter filters with
    :meth:`admits`."""

    gpu_count: int | None = None
    gpu_name: str | None = None
    min_gpu_memory_gb: float | None = None
    spot: bool = False
    max_price_per_hour: Decimal | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        if self.gpu_count is not None and (isinstance(self.gpu_count, bool) or self.gpu_count < 1):
            raise ValueError(f"an offer query's gpu_count is at least 1, not {self.gpu_count!r}")
        if self.min_gpu_memory_gb is not None and not self.min_gpu_memory_gb >= 0:
            raise ValueError(f"an offer query's min_gpu_memory_gb is not negative: {self.min_gpu_memory_gb!r}")
        if self.max_price_per_hour is not None and not self.max_price_per_hour >= 0:
            raise ValueError(f"an offer query's max_price_per_hour is not negative: {self.max_price_per_hour!r}")

    def admits(self, offer: Offer) -> bool:
        """Whether ``offer`` answers this query: its GPU count (when asked), type, memory per GPU (an offer
        that does not say is not enough), region (one with capacity now; an offer naming none is not
        refused by region) and price (an unpriced offer is above any cap)."""
        price = offer.spot_price_per_hour if self.spot else offer.price_per_hour
        return ((self.gpu_count is None or offer.gpu_count == self.gpu_count)
                and (self.gpu_name is None or offer.gpu_type == self.gpu_name)
                and (self.min_gpu_memory_gb is None
                     or (offer.gpu_memory_gb is not None and offer.gpu_memory_gb >= self.min_gpu_memory_gb))
                and (self.region is None or not offer.regions or self.region in offer.regions)
                and (self.max_price_per_hour is None or (price is not None and price <= self.max_price_per_hour)))


@dataclass(frozen=True)
class Instance:
    """One pod (RunPod) or instance (Lambda) as the provider reports it now.

    ``ssh_host``/``ssh_port``/``ssh_user`` are set only when the provider publishes a public SSH
    endpoint (RunPod: ``ssh.direct``; Lambda: an ``ip``).  ``reason`` is the provider's word on why it
    stopped, where it gives one.  ``gpu_count`` is what the provider says the machine has now (a resumed
    RunPod pod can come back with zero).
    """

    provider: str
    id: str
    name: str
    state: InstanceState
    raw_status: str
    ssh_host: str | None = None
    ssh_port: int | None = None
    ssh_user: str | None = None
    price_per_hour: Decimal | None = None
    gpu_count: int | None = None
    gpu_type: str | None = None
    spot: bool = False
    region: str | None = None
    reason: str = ""
    uptime_s: float | None = None  # how long it has run since its last start, where the provider says (RunPod)

    @property
    def ready(self) -> bool:
        """The API half of the readiness gate: running with a public SSH endpoint."""
        return self.state == "running" and bool(self.ssh_host) and self.ssh_port is not None

    @property
    def gone(self) -> bool:
        return self.state == "terminated"


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})+$")


def ssh_address(host: str | None, port: int | None, names: tuple[str, ...] = ()) -> tuple[str, int] | None:
    """The SSH endpoint a provider reported, as gpuq may connect to it, or None.  ``host`` must be an IP address
    (returned normalised); a DNS name only where the adapter declares its gateways' domain (``names``: vast.ai's
    ``.vast.ai`` proxies) and only a plain one.  ``port``: 1-65535.  An address from an API reaches ``ssh`` as
    ``%h`` of the user's ssh config (``ProxyCommand``...): nothing else may pass (docs/security.md)."""
    if not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return None
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        pass
    lowered = host.lower()
    if _HOST_NAME.match(host) and any(lowered.endswith(suffix) for suffix in names):
        return lowered, port
    return None

# The names gpuq gives the instances it creates (docs/providers.md): ``gpuq-<ledger id>-<lease>`` and, for more
# than one machine, ``-<i>``; an older gpuq named them ``gpuq-<lease>[-<i>]``, with nothing saying which ledger.
LEDGER_ID = re.compile(r"^[0-9a-f]{8}$")
_OURS = re.compile(r"^gpuq-(?P<ledger>[0-9a-f]{8})-[0-9a-f]{6}(-\d+)?$")
_OLDER = re.compile(r"^gpuq-[0-9a-f]{6}(-\d+)?$")


def instance_name(ledger_id: str, lease: str) -> str:
    """The :attr:`ProvisionRequest.name` of one ``gpuq up``: gpuq, the ledger that rents, the lease."""
    if not LEDGER_ID.match(ledger_id):
        raise ValueError(f"not a ledger id: {ledger_id!r}")
    return f"gpuq-{ledger_id}-{lease}"


def ledger_of(name: str) -> str | None:
    """Which ledger an instance name says rented it: its ledger id; ``""`` for a name an older gpuq gave
    (gpuq's, ledger unknown); None for a name gpuq does not give."""
    ours = _OURS.match(name)
    if ours:
        return ours.group("ledger")
    return "" if _OLDER.match(name) else None


@dataclass(frozen=True)
class ProviderOptions:
    """Base of the per-provider extras of a :class:`ProvisionRequest` (RunPod's image and disks, Lambda's file
    system, ...): each adapter module defines one subclass and accepts only that one (docs/providers.md)."""

    provider: ClassVar[str] = ""


_Options = TypeVar("_Options", bound=ProviderOptions)


def check_price_cap(provider: str, request: ProvisionRequest, price_per_hour: Decimal | None) -> None:
    """Refuse (``NoCapacity``, before anything is created) a machine whose price per hour is unknown or above
    the request's ``max_price_per_hour``; nothing when the request names no cap."""
    cap = request.max_price_per_hour
    if cap is None:
        return
    kind = "spot" if request.spot else "on-demand"
    if price_per_hour is None:
        raise NoCapacity(provider, f"no {kind} price for {request.gpu_type} now: not renting above a cap of "
                         f"${cap}/h blind", code="over-price")
    if price_per_hour > cap:
        raise NoCapacity(provider, f"{request.gpu_type} costs ${price_per_hour}/h {kind} now, above the cap of "
                         f"${cap}/h", code="over-price")


@dataclass(frozen=True)
class ProvisionRequest:
    """What to rent, in words every provider understands.  ``name``: ``gpuq-<ledger id>-<lease>``
    (:func:`instance_name`); creation is idempotent by name (docs/providers.md).  ``count`` machines, one
    call each, named ``name`` (one) or ``name-0``, ``name-1``, ...; ``gpu_count`` GPUs each (where the type
    does not fix it).  ``spot``: interruptible (:attr:`Capabilities.spot`); ``bid_per_gpu``: the most the
    user pays per GPU-hour for it.  ``max_price_per_hour``: the most one machine may cost per hour (on
    demand its price, spot its price or bid, :func:`check_price_cap`): an adapter refuses with
    ``NoCapacity``, creating nothing, when no offer fits.  ``region``: a region or data centre id.
    ``ssh_public_key``: registered with the account first (append-only).  ``env``: set in the machine's
    container where it runs one.
    ``options``: the provider's own extras (its :class:`ProviderOptions` subclass; None: its defaults)."""

    name: str
    gpu_type: str
    gpu_count: int = 1
    count: int = 1
    spot: bool = False
    bid_per_gpu: Decimal | None = None
    max_price_per_hour: Decimal | None = None
    region: str | None = None
    ssh_public_key: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    options: ProviderOptions | None = None

    def names(self) -> list[str]:
        if self.count == 1:
            return [self.name]
        return [f"{self.name}-{index}" for index in range(self.count)]

    def options_for(self, kind: type[_Options]) -> _Options:
        """``options`` when they are ``kind``'s, ``kind()`` when none were given; ProviderError for options
        meant for another provider (they would be ignored silently otherwise)."""
        if self.options is None:
            return kind()
        if not isinstance(self.options, kind):
            raise ProviderError(kind.provider or "provider", f"{type(self.options).__name__} are not "
                                f"{kind.provider or kind.__name__} options", code="wrong-options")
        return self.options
