"""The Provider seam: "a thing that hands out hosts" (RunPod, Lambda Cloud, ...).

An adapter turns one vendor API into plain values (providers/models.py: :class:`Offer`, :class:`Instance`)
and gpuq errors (``orchestrator.core.errors.ProviderError`` and subclasses).  Here: what an adapter class
declares it can do (:class:`Capabilities`), the :class:`Provider` protocol every adapter satisfies, and the
stop classification (:func:`classify`); the polling loops are providers/polling.py's.  The readiness gate's
API half is :attr:`Instance.ready`; the SSH half (``echo``, host key, ``nvidia-smi``; docs/providers.md)
belongs to the layer above, which may import ``hosts``; this package may not.

Status is a claim (docs/providers.md): "running" does not make a host usable and "stopped" does not
mean it stopped billing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal, Protocol, runtime_checkable

from orchestrator.providers.models import Instance, Offer, OfferQuery, ProvisionRequest

StopClass = Literal["spot_preemption", "manual_stop", "host_failure", "running", "pending", "unknown"]
"""What :func:`classify` says about an instance (docs/providers.md)."""

# Reason prefixes (docs/providers.md): vast.ai's outbid instances; RunPod v1's lastStatusChange texts ([obs]).
REASON_OUTBID = "Outbid"
REASON_USER = "Exited by user"
REASON_PLATFORM = "Exited by Runpod"


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


@dataclass(frozen=True)
class Capabilities:
    """What an adapter class can do, declared on the class (``capabilities = Capabilities(...)``); what it
    lacks is refused before any vendor call (docs/providers.md, "Capabilities")."""

    spot: bool = False  # rents interruptible machines (ProvisionRequest.spot, OfferQuery.spot)
    stop: bool = False  # stop keeps the disk; resume starts the same machine again
    rebid: bool = False  # a preempted spot machine comes back on the same host with a new bid (resume(bid_per_gpu=))
    regions: bool = False  # ProvisionRequest.region chooses where
    offers: bool = True  # list_offers quotes machine shapes with prices
    # its offers are a market that is searched, not listed: the vendor's search takes OfferQuery's spot, GPU
    # name and memory floor, and finds offers a plain search's first page leaves out
    market_search: bool = False
    # a stopped (or outbid) machine still bills its disk: only terminate stops the meter (RunPod: the container
    # disk and the pod volume of an exited pod; vast.ai: the instance's disk, and its bandwidth in every state)
    stop_bills_storage: bool = False

    def words(self) -> list[str]:
        """The capabilities it has, as the words the docs use."""
        names = ("spot", "stop", "rebid", "regions", "offers", "market_search", "stop_bills_storage")
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

    def list_offers(self, query: OfferQuery) -> list[Offer]:
        """Machine shapes with on-demand (and spot) prices that answer ``query`` (:meth:`OfferQuery.admits`),
        translated into the vendor's filters and units inside the adapter.  Read-only.  ``query.gpu_count``
        None: RunPod and vast.ai quote machines of 1 GPU, Lambda every instance type.  ProviderUnsupported
        for a spot query to an adapter without ``Capabilities.spot``."""
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
