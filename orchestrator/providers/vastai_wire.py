"""vast.ai's JSON, typed and bounded at the edge (docs/providers.md, "vast.ai").

Every response body the vast.ai adapter reads is parsed here first, into pydantic models that ignore
fields gpuq does not use but are strict about the types of those it does (a ``"1"`` where vast.ai sends
``1`` is a drift, not a value).  Text that a marketplace host controls (``status_msg``, the GPU name, the
addresses) is bounded and checked before it reaches an Instance: an address must be an IP address or a
plain host name, a port 1-65535, a message one printable line of at most 200 characters.

Then the mapping from vast.ai's three status fields to gpuq's (:func:`instance_of`):

========================================  ==================================================================
vast.ai (``intended_status``/``actual_status``)  gpuq
========================================  ==================================================================
running / running                         ``running`` (ready once an SSH endpoint is published)
running / null, created, loading,          ``pending`` (raw ``booting``; vast.ai's word in ``reason``)
scheduling, rebooting
running / stopped or exited, interruptible ``exited``, reason ``Outbid: ...`` → ``spot_preemption``
running / exited, on demand                ``exited``, reason ``Exited unexpectedly: ...`` → ``unknown``
running / stopped, on demand               ``pending`` (waiting for its GPU after a start: VAST3)
stopped / anything                         ``stopped`` → ``manual_stop`` (the disk keeps billing)
any / offline, unknown                     ``unhealthy`` → ``host_failure``
destroyed by gpuq, still listed            ``terminating``
========================================  ==================================================================
"""

from __future__ import annotations

import ipaddress
import re
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from orchestrator.core.errors import ProviderError
from orchestrator.providers.base import REASON_OUTBID
from orchestrator.providers.models import Instance, InstanceState, Offer, parse_money
from orchestrator.scheduling.gpumatch import MIB_PER_GB

PROVIDER = "vastai"
LABEL = "vast.ai"
SSH_USER = "root"
DIRECT_SSH_PORT = "22/tcp"
PROXY_SUFFIX = ".vast.ai"
MAX_TEXT = 200

_PRINTABLE = re.compile(r"[^\x20-\x7e]+")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")
_GPU_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.+/-]{0,63}$")


def _one_line(value: object) -> object:
    """Host-controlled text: one printable ASCII line, at most MAX_TEXT characters (never rejected)."""
    if not isinstance(value, str):
        return value
    clean = " ".join(_PRINTABLE.sub(" ", value).split())
    return clean if len(clean) <= MAX_TEXT else clean[: MAX_TEXT - 3] + "..."


HostText = Annotated[str, BeforeValidator(_one_line)]
Money = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=1024)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class WireOffer(_Wire):
    """One row of ``POST /api/v0/bundles/`` (``offers``): a machine's GPUs for rent."""

    id: Annotated[int, Field(ge=0)]
    num_gpus: Count
    gpu_name: Annotated[str, Field(pattern=_GPU_NAME.pattern)]
    gpu_ram: Annotated[float, Field(ge=0, le=10_000_000)]  # MB per GPU
    dph_total: Money
    min_bid: Money | None = None
    reliability: Annotated[float, Field(ge=0, le=1)] | None = None
    rentable: bool | None = None
    rented: bool | None = None
    direct_port_count: Annotated[int, Field(ge=0, le=65535)] | None = None
    geolocation: HostText | None = None


class WireOffers(_Wire):
    offers: Annotated[list[WireOffer], Field(max_length=1000)]


class PortBinding(_Wire):
    """Docker's form of a published port: ``{"HostIp": "0.0.0.0", "HostPort": "41022"}``."""

    HostPort: Annotated[str, Field(pattern=r"^[0-9]{1,5}$")] | Annotated[int, Field(ge=1, le=65535)]

    @property
    def port(self) -> int | None:
        value = int(self.HostPort)
        return value if 1 <= value <= 65535 else None


class WireInstance(_Wire):
    """One instance of ``GET /api/v0/instances/{id}/`` or ``GET /api/v1/instances/``."""

    id: Annotated[int, Field(ge=0)]
    label: HostText | None = None
    actual_status: HostText | None = None
    intended_status: HostText | None = None
    cur_state: HostText | None = None
    status_msg: HostText | None = None
    num_gpus: Count | None = None
    gpu_name: HostText | None = None
    dph_total: Money | None = None
    is_bid: bool | None = None
    public_ipaddr: HostText | None = None
    ssh_host: HostText | None = None
    ssh_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    # Docker's port map, as the client reads it; vast.ai's OpenAPI document says a list of port numbers,
    # which names no host port: that form (or any other) gives no direct endpoint, never an error.
    ports: Annotated[dict[str, Annotated[list[PortBinding], Field(max_length=8)] | None],
                     Field(max_length=64)] | Annotated[list[Any], Field(max_length=64)] | None = None
    geolocation: HostText | None = None


class WireOneInstance(_Wire):
    instances: WireInstance | None


class WireInstancePage(_Wire):
    instances: Annotated[list[WireInstance], Field(max_length=1000)]
    next_token: Annotated[str, Field(max_length=512)] | None = None


class WireCreated(_Wire):
    success: bool
    new_contract: Annotated[int, Field(ge=0)]


class WireSshKey(_Wire):
    id: int
    ssh_key: Annotated[str, Field(max_length=16_384)]


class WireSshKeys(_Wire):
    ssh_keys: Annotated[list[WireSshKey], Field(max_length=1000)]


class WireError(_Wire):
    """vast.ai's error body: ``{"success": false, "error": "<code>", "msg": "<text>"}`` (any may be absent)."""

    error: HostText | None = None
    msg: HostText | None = None


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: Any, what: str) -> M:
    """``body`` as ``model``, or a ProviderError naming the first field that does not fit (never its value)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        kind = errors[0]["type"] if errors else "?"
        raise ProviderError(LABEL, f"{what}: unexpected response shape at {where or 'body'} ({kind})",
                            code="bad-response") from None


def parse_error(body: Any) -> WireError:
    try:
        return WireError.model_validate(body if isinstance(body, dict) else {})
    except ValidationError:
        return WireError()


# -- offers -----------------------------------------------------------------------------------------------

def offer_of(row: WireOffer) -> Offer:
    """A vast.ai offer as a gpuq Offer.  ``gpu_type`` is vast.ai's ``gpu_name`` (what a request names);
    ``min_bid_per_gpu`` is the machine's minimum interruptible bid over its GPUs."""
    price = parse_money(row.dph_total)
    min_bid = parse_money(row.min_bid)
    # gpu_ram is memory.total in MiB, as nvidia-smi reports it on the machine; in whole GB (10^9 bytes,
    # rounded down) it answers `gpu_mem=N` as the rented host's own figure will (gpumatch.host_matches):
    # an A10's 23,028 MiB is 24 GB, not 22
    memory_gb = int(row.gpu_ram / MIB_PER_GB) if row.gpu_ram else None
    reliability = f", reliability {row.reliability:.3f}" if row.reliability is not None else ""
    return Offer(
        provider=PROVIDER,
        gpu_type=row.gpu_name,
        display_name=f"{row.num_gpus}x {row.gpu_name} {memory_gb or '?'} GB{reliability} (offer {row.id})",
        gpu_count=row.num_gpus,
        price_per_hour=price,
        gpu_memory_gb=memory_gb,
        spot_price_per_hour=min_bid,
        min_bid_per_gpu=(min_bid / row.num_gpus) if min_bid is not None and row.num_gpus else None,
        regions=(row.geolocation,) if row.geolocation else (),
        available=bool(row.rentable is not False and not row.rented),
    )


# -- instances --------------------------------------------------------------------------------------------

_PENDING = frozenset({"", "created", "loading", "scheduling", "rebooting"})
_HOST_GONE = frozenset({"offline", "unknown"})


def safe_host(value: str | None) -> str | None:
    """An address from the API, used only if it is an IP address or a plain host name."""
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value if _HOSTNAME.match(value) else None


def direct_endpoint(item: WireInstance) -> tuple[str, int] | None:
    """Direct SSH: the host's public IP and the port mapped to the container's 22/tcp."""
    host = safe_host(item.public_ipaddr)
    bindings = (item.ports.get(DIRECT_SSH_PORT) if isinstance(item.ports, dict) else None) or []
    port = next((b.port for b in bindings if b.port is not None), None)
    return (host, port) if host and port else None


def proxy_endpoint(item: WireInstance) -> tuple[str, int] | None:
    """Proxy SSH through vast.ai's ``ssh<N>.vast.ai`` gateways (slower; the fallback)."""
    host = safe_host(item.ssh_host)
    return (host, item.ssh_port) if host and item.ssh_port else None


def state_of(item: WireInstance, *, destroyed: bool) -> tuple[InstanceState, str, str]:
    """(state, raw_status, reason) by the table in the module docstring."""
    actual = (item.actual_status or "").lower()
    intended = (item.intended_status or "").lower()
    said = f" ({item.status_msg})" if item.status_msg else ""
    if destroyed:
        return "terminating", actual or "destroyed", f"destroyed by gpuq{said}"
    if actual in _HOST_GONE:
        return "unhealthy", actual, f"host {actual}{said}"
    if intended == "stopped":
        return "stopped", actual or "stopped", f"stopped by request{said}"
    if actual == "running":
        return "running", actual, ""
    if actual in _PENDING:
        return "pending", "booting", f"vast.ai: {actual or 'provisioning'}{said}"
    if actual in ("stopped", "exited", "frozen") and item.is_bid:
        return "exited", actual, f"{REASON_OUTBID}: the interruptible instance was paused by a higher bid{said}"
    if actual == "exited":
        return "exited", actual, f"Exited unexpectedly: the container stopped{said}"
    if actual in ("stopped", "frozen"):
        return "pending", "booting", f"vast.ai: {actual}, waiting for its GPU{said}"
    return "pending", actual, f"vast.ai: {actual}{said}"  # not understood: classify says unknown


def instance_of(item: WireInstance, *, destroyed: bool = False, allow_proxy: bool = True) -> Instance:
    """A vast.ai instance as a gpuq Instance.  The SSH endpoint is the direct one when published, else the
    proxy one when ``allow_proxy``; only a running instance gets one."""
    state, raw, reason = state_of(item, destroyed=destroyed)
    endpoint = None
    if state == "running":
        endpoint = direct_endpoint(item) or (proxy_endpoint(item) if allow_proxy else None)
    return Instance(
        provider=PROVIDER,
        id=str(item.id),
        name=item.label or "",
        state=state,
        raw_status=raw,
        ssh_host=endpoint[0] if endpoint else None,
        ssh_port=endpoint[1] if endpoint else None,
        ssh_user=SSH_USER if endpoint else None,
        price_per_hour=parse_money(item.dph_total),
        gpu_count=item.num_gpus,
        gpu_type=item.gpu_name,
        spot=bool(item.is_bid),
        region=item.geolocation,
        reason=reason,
    )


def via_proxy(instance: Instance) -> bool:
    """Whether an Instance's endpoint is vast.ai's SSH proxy (slow for bulk copies: VAST8)."""
    return bool(instance.ssh_host and instance.ssh_host.endswith(PROXY_SUFFIX))


def machine_bid(bid_per_gpu: Decimal, gpu_count: int) -> float:
    """vast.ai takes an interruptible bid per machine (``price``), in dollars per hour."""
    return float((bid_per_gpu * max(gpu_count, 1)).quantize(Decimal("0.0001")))
