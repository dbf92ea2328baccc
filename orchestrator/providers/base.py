"""The Provider seam: "a thing that hands out hosts" (RunPod, Lambda Cloud, ...).

An adapter turns one vendor API into plain values (:class:`Offer`, :class:`Instance`) and gpuq errors
(``orchestrator.core.errors.ProviderError`` and subclasses).  Everything here is data and pure rules: the
readiness gate's API half (:attr:`Instance.ready`), the stop classification (:func:`classify`) and the
polling loops shared by every adapter.  The SSH half of readiness (``echo``, host key, ``nvidia-smi``;
docs/providers.md) belongs to the layer above, which may import ``hosts``; this package may not.

Status is a claim (docs/providers.md): "running" does not make a host usable and "stopped" does not
mean it stopped billing.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from orchestrator.core.errors import NoCapacity, ProviderError, ProvisioningFailed

InstanceState = Literal["pending", "running", "stopped", "exited", "terminating", "terminated", "unhealthy"]
"""Normalised instance state.  ``pending``: created, not yet running (RunPod PROVISIONING/STARTING
or an unknown status, Lambda ``booting``); ``running``: the provider says it runs (ready or not: see
:attr:`Instance.ready`); ``stopped``: stopped, its disk kept (RunPod EXITED: v2 says no more, vast.ai
stopped by request); ``exited``: ended with a reason to classify (vast.ai's outbid instances);
``terminating``: teardown sent, still billing until ``terminated``; ``unhealthy``: Lambda ``unhealthy``,
RunPod ERROR."""

StopClass = Literal["spot_preemption", "manual_stop", "host_failure", "running", "pending", "unknown"]
"""What :func:`classify` says about an instance (docs/providers.md)."""

# Reason prefixes (docs/providers.md): vast.ai's outbid instances; RunPod v1's lastStatusChange texts ([obs]).
REASON_OUTBID = "Outbid"
REASON_USER = "Exited by user"
REASON_PLATFORM = "Exited by Runpod"


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


def classify(instance: Instance | None) -> StopClass:
    """What happened to an instance, from the API alone (docs/providers.md).  Pure.

    - ``None`` (the provider no longer knows it), ``terminating``/``terminated`` or ``unhealthy``:
      ``host_failure`` (resume elsewhere; the caller knows whether gpuq itself terminated it);
    - running but zero GPUs (a restarted RunPod pod): ``host_failure``;
    - running with an SSH endpoint: ``running``; running without one, or booting: ``pending``;
    - ``exited``: ``Outbid:`` → ``spot_preemption``; ``Exited by user:`` → ``manual_stop``;
      ``Exited by Runpod:`` → ``host_failure``; any other text → ``unknown`` (treat as a platform stop
      and escalate with :attr:`Instance.reason`);
    - ``stopped`` → ``manual_stop``; an unrecognised raw status → ``unknown``.
    """
    if instance is None:
        return "host_failure"
    state = instance.state
    if state in ("terminating", "terminated", "unhealthy"):
        return "host_failure"
    if state == "running":
        if instance.gpu_count == 0:
            return "host_failure"
        return "running" if instance.ready else "pending"
    if state == "pending":
        return "unknown" if instance.raw_status not in _KNOWN_PENDING else "pending"
    if state == "stopped":
        return "manual_stop"
    reason = instance.reason.strip()
    if reason.startswith(REASON_OUTBID):
        return "spot_preemption"
    if reason.startswith(REASON_USER):
        return "manual_stop"
    if reason.startswith(REASON_PLATFORM):
        return "host_failure"
    return "unknown"


# Raw statuses that mean "not ready yet" rather than "not understood".
_KNOWN_PENDING = frozenset({"PROVISIONING", "STARTING", "CREATED", "RESTARTING", "PAUSED", "booting"})


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


@dataclass(frozen=True)
class Capabilities:
    """What an adapter class can do, declared on the class (``capabilities = Capabilities(...)``)."""

    spot: bool = False  # rents interruptible machines (ProvisionRequest.spot)
    stop: bool = False  # stop keeps the disk; resume starts the same machine again
    rebid: bool = False  # a preempted spot machine comes back on the same host with a new bid (resume(bid_per_gpu=))
    regions: bool = False  # ProvisionRequest.region chooses where
    offers: bool = True  # list_offers quotes machine shapes with prices
    # its offers are a market that is searched, not listed: list_offers takes ``spot=`` (the bid market) and
    # ``min_gpu_memory_gb=`` (a floor in the provider's GB), which find offers a plain search's first page leaves out
    market_search: bool = False

    def words(self) -> list[str]:
        """The capabilities it has, as the words the docs use."""
        names = ("spot", "stop", "rebid", "regions", "offers", "market_search")
        return [name.replace("_", " ") for name in names if getattr(self, name)]


@runtime_checkable
class Provider(Protocol):
    """A cloud that rents GPU machines.  Every method may raise ProviderError (or a subclass);
    transient failures (network, 429, 5xx) are retried inside with bounded backoff first.

    Nothing here destroys anything on its own initiative (docs/providers.md): callers decide.
    """

    name: str
    supports_stop: bool
    supports_spot: bool

    def list_offers(self, gpu_count: int | None = None) -> list[Offer]:
        """Machine shapes with on-demand (and spot) prices.  Read-only.  ``gpu_count``: RunPod quotes pods of
        that many GPUs (default 1); Lambda lists only instance types with exactly that many (default all)."""
        ...

    def list_instances(self) -> list[Instance]:
        """Every instance of the account that the provider still lists (not only gpuq's).  Read-only."""
        ...

    def get(self, instance_id: str) -> Instance | None:
        """One instance, or None once the provider no longer knows it.  Read-only."""
        ...

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        """Create ``request.count`` machines, one call each, and return them (not yet ready).  Idempotent
        by name: an instance that already carries a requested name is adopted, never duplicated, including
        after a create call that failed client-side (timeout, 429) but succeeded server-side.
        ``on_created(name, instance_id)`` is called as each create answers (or a named instance is
        adopted), before the next create: a caller records what bills at once, also when a later create
        fails.  Raises NoCapacity (nothing was created by the failing call), ProviderUnsupported."""
        ...

    def wait_ready(self, instance_id: str, *, timeout_s: float | None = None) -> Instance:
        """Poll until :attr:`Instance.ready`; raises ProvisioningFailed when the instance dies first
        or the deadline passes ("stuck provisioning": reported, never terminated here)."""
        ...

    def stop(self, instance_id: str) -> None:
        """Stop the machine, keeping its disk (RunPod).  Raises ProviderUnsupported where there is no
        stop (Lambda).  Stopped is not free: the disk keeps billing."""
        ...

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        """Restart a stopped or preempted machine on the same host (RunPod: the ``start`` action; vast.ai:
        a start, or for spot a new bid).  The SSH endpoint changes: call :meth:`wait_ready` again.  May raise
        NoCapacity."""
        ...

    def terminate(self, instance_id: str) -> None:
        """Destroy the machine and its local disk.  Idempotent: an unknown id is already gone.
        The acknowledgement is not proof: use :meth:`wait_gone`."""
        ...

    def wait_gone(self, instance_id: str, *, timeout_s: float | None = None) -> None:
        """Poll until the provider reports the instance terminated or no longer knows it."""
        ...

    def ensure_ssh_key(self, public_key: str) -> str:
        """Register ``public_key`` with the account if missing (append-only; others are never removed)
        and return the name the provider knows it by."""
        ...

    def close(self) -> None:
        """Release the HTTP connection pool."""
        ...


@dataclass(frozen=True)
class PollPolicy:
    """How long and how often to poll: ``first_s`` growing by ``factor`` to ``max_s``."""

    timeout_s: float
    first_s: float
    max_s: float
    factor: float = 1.5

    def intervals(self) -> Callable[[], float]:
        current = [self.first_s]

        def nxt() -> float:
            value = current[0]
            current[0] = min(self.max_s, value * self.factor)
            return value

        return nxt


def poll_until_ready(
    provider: str,
    instance_id: str,
    fetch: Callable[[str], Instance | None],
    policy: PollPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Instance:
    """The polling loop behind every ``wait_ready``: stops at ready, raises ProvisioningFailed when the
    instance dies (exited, terminated, unhealthy, gone) or when ``policy.timeout_s`` passes."""
    deadline = clock() + policy.timeout_s
    interval = policy.intervals()
    while True:
        instance = fetch(instance_id)
        if instance is None:
            raise ProvisioningFailed(provider, f"{instance_id} is gone while waiting for it to become ready",
                                     code="host_failure")
        verdict = classify(instance)
        if verdict == "running":
            return instance
        if instance.state != "pending" and verdict != "pending":
            what = f"is {instance.raw_status}" + (" with 0 GPUs" if instance.gpu_count == 0 else "")
            reason = f" ({instance.reason})" if instance.reason else ""
            raise ProvisioningFailed(provider, f"{instance_id} {what}{reason} while waiting for it to become ready",
                                     code=verdict)
        if clock() >= deadline:
            raise ProvisioningFailed(
                provider,
                f"{instance_id} is still {instance.raw_status} without a public SSH endpoint after "
                f"{policy.timeout_s:.0f} s (stuck provisioning; it may still bill: terminate it or wait longer)",
                code="stuck_provisioning")
        sleep(interval())


def poll_until_gone(
    provider: str,
    instance_id: str,
    fetch: Callable[[str], Instance | None],
    policy: PollPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll until the instance is terminated or unknown (docs/providers.md: an acknowledgement is not proof)."""
    deadline = clock() + policy.timeout_s
    interval = policy.intervals()
    while True:
        instance = fetch(instance_id)
        if instance is None or instance.gone:
            return
        if clock() >= deadline:
            raise ProviderError(
                provider, f"{instance_id} is still {instance.raw_status} {policy.timeout_s:.0f} s after terminate; "
                "it may still bill: check the provider's console", code="not_gone")
        sleep(interval())
