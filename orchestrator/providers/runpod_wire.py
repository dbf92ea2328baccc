"""RunPod's REST API v2 JSON, typed and bounded at the edge (docs/providers.md, "RunPod").

Every response body the RunPod adapter reads is parsed here first, into pydantic models that ignore fields
gpuq does not use and are strict about the types of those it does (RunPod's v2 OpenAPI document,
tests/fixtures/providers/runpod/published/openapi-v2.json).  What reaches an Instance is checked: the SSH
address must be an IP address (v2 says "hostname or IP"; gpuq connects to the pod's public IP, never to a
name from the API), its port 1-65535, its user a plain account name, text one printable line.

Pod ``status`` → gpuq (v2 gives no reason text; v1's ``lastStatusChange`` is gone):

=================================  ===========================================================
v2 ``status``                      gpuq
=================================  ===========================================================
``PROVISIONING``, ``STARTING``     ``pending``
``RUNNING``                        ``running`` (ready once ``ssh.direct`` names an IP and port)
``EXITED``                         ``stopped`` → ``manual_stop`` (its disk stays, and bills)
``ERROR``                          ``unhealthy`` → ``host_failure``
``TERMINATED``                     ``terminated``
=================================  ===========================================================
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from orchestrator.core.errors import ProviderError
from orchestrator.providers.models import Instance, InstanceState, Offer, parse_money

PROVIDER = "runpod"
LABEL = "RunPod"
SSH_USER = "root"
MAX_TEXT = 200
RENTED_CLOUD = "SECURE"  # the cloud a pod is created in unless RunPodOptions.cloud_type says otherwise
CLOUDS = frozenset({"SECURE", "COMMUNITY"})  # the document's Cloud enum

_PRINTABLE = re.compile(r"[^\x20-\x7e]+")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_ID = r"^[A-Za-z0-9][A-Za-z0-9 _.:+/()-]{0,99}$"

STATES: dict[str, InstanceState] = {
    "PROVISIONING": "pending", "STARTING": "pending", "RUNNING": "running", "EXITED": "stopped",
    "ERROR": "unhealthy", "TERMINATED": "terminated",
}
REASONS = {
    "EXITED": "EXITED (RunPod's v2 API says no more: stopped by a user, by gpuq or by RunPod; its disk still bills)",
    "ERROR": "ERROR (RunPod: the container is in an unrecoverable error state)",
}


def one_line(value: object) -> object:
    """API text: one printable ASCII line, at most MAX_TEXT characters (never rejected)."""
    if not isinstance(value, str):
        return value
    return _PRINTABLE.sub(" ", value).strip()[:MAX_TEXT]


Text = Annotated[str, BeforeValidator(one_line)]
Money = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=1024)]
GpuId = Annotated[str, Field(pattern=_ID)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class WireSshEndpoint(_Wire):
    """``PodSshEndpoint``: one way to reach the pod (gpuq uses ``direct``: scp and rsync need it)."""

    host: Annotated[str, Field(max_length=253)]
    port: Annotated[int, Field(ge=0, le=65535)]
    username: Annotated[str, Field(max_length=64)]


class WireSsh(_Wire):
    proxy: WireSshEndpoint | None = None
    direct: WireSshEndpoint | None = None


class WireGpu(_Wire):
    id: GpuId
    count: Count = 1


class WireRuntime(_Wire):
    uptime: Annotated[int, Field(ge=0)] | None = None
    gpus: Annotated[list[dict[str, Any]], Field(max_length=1024)] | None = None


class WirePod(_Wire):
    """One ``Pod`` of ``GET /v2/pods``, ``GET /v2/pods/{id}``, ``POST /v2/pods`` and ``.../action``."""

    id: Annotated[str, Field(min_length=1, max_length=100)]
    name: Text = ""
    status: Text = ""
    gpu: WireGpu | None = None
    cloud: Text | None = None
    dataCenterId: Text | None = None
    cost: Money | None = None
    ssh: WireSsh | None = None
    runtime: WireRuntime | None = None
    startedAt: Text | None = None


class WirePods(_Wire):
    pods: Annotated[list[WirePod], Field(max_length=1000)]


class WirePrices(_Wire):
    secure: Money | None = None
    community: Money | None = None


class WireMaxCount(_Wire):
    secure: Count | None = None
    community: Count | None = None


class WireDataCenter(_Wire):
    id: Text
    availability: Text | None = None


class WireGpuType(_Wire):
    """One ``GpuType`` of ``GET /v2/catalog/gpus`` (list prices per GPU-hour, per cloud)."""

    id: GpuId
    name: Text = ""
    memory: Count | None = None
    secure: bool = False
    community: bool = False
    price: WirePrices = WirePrices()
    maxCount: WireMaxCount = WireMaxCount()
    availability: Text | None = None
    dataCenters: Annotated[list[WireDataCenter], Field(max_length=200)] | None = None


class WireGpuTypes(_Wire):
    gpus: Annotated[list[WireGpuType], Field(max_length=1000)]


class WireSshKeys(_Wire):
    keys: Annotated[list[Annotated[str, Field(max_length=16_384)]], Field(max_length=500)]


class WireProblem(_Wire):
    """An RFC 9457 problem object (``ErrorResponse``): gpuq quotes its ``detail``."""

    title: Text | None = None
    detail: Text | None = None


def problem_detail(body: object) -> str | None:
    """The ``detail`` of an error answer, or None when it is not a problem object with one."""
    try:
        return WireProblem.model_validate(body).detail or None
    except ValidationError:
        return None


_M = TypeVar("_M", bound=_Wire)


def parse(model: type[_M], body: object, what: str) -> _M:
    """``body`` as ``model``; ProviderError (no raw text) when RunPod's answer does not fit it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})[:5]
        raise ProviderError(LABEL, f"{what}: unexpected answer (fields: {', '.join(fields) or 'the body'})",
                            code="bad-answer") from None


def ip_address(host: str) -> str | None:
    """``host`` when it is an IP address (normalised), else None."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def ssh_endpoint(pod: WirePod) -> tuple[str, int, str] | None:
    """``ssh.direct``'s IP address, port and user, or None (not ready, or not an address gpuq connects to)."""
    direct = pod.ssh.direct if pod.ssh is not None else None
    if direct is None or not 1 <= direct.port <= 65535:
        return None
    host = ip_address(direct.host)
    if host is None:
        return None
    return host, direct.port, direct.username if _USER.match(direct.username) else SSH_USER


def _uptime(pod: WirePod, now: float | None) -> float | None:
    if pod.runtime is not None and pod.runtime.uptime is not None:
        return float(pod.runtime.uptime)
    if now is None or not pod.startedAt:
        return None
    try:
        when = datetime.fromisoformat(pod.startedAt.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return now - when if now >= when else None


def gpu_count(pod: WirePod) -> int | None:
    """The GPUs the pod has now: a running pod's ``runtime.gpus`` (a pod started again on a host without free
    GPUs lists none: a host failure), else what it was created with."""
    if pod.status == "RUNNING" and pod.runtime is not None and pod.runtime.gpus is not None:
        return len(pod.runtime.gpus)
    return pod.gpu.count if pod.gpu is not None else None


def instance_of(pod: WirePod, now: float | None = None) -> Instance:
    """One v2 Pod → Instance (``now``: wall-clock seconds, for the uptime).  Unknown statuses count as pending."""
    state = STATES.get(pod.status, "pending")
    endpoint = ssh_endpoint(pod) if state == "running" else None
    return Instance(
        provider=PROVIDER, id=pod.id, name=pod.name, state=state, raw_status=pod.status,
        ssh_host=endpoint[0] if endpoint else None, ssh_port=endpoint[1] if endpoint else None,
        ssh_user=endpoint[2] if endpoint else None, price_per_hour=parse_money(pod.cost),
        gpu_count=gpu_count(pod), gpu_type=pod.gpu.id if pod.gpu is not None else None, spot=False,
        region=pod.dataCenterId or None, reason=REASONS.get(pod.status, ""),
        uptime_s=_uptime(pod, now) if state == "running" else None,
    )


def cloud_price(item: WireGpuType, cloud: str, count: int) -> Decimal | None:
    """What a pod of ``count`` GPUs of ``item`` costs per hour in ``cloud``: its list price per GPU-hour there
    times ``count``; None where the catalog quotes none or the cloud does not offer the type."""
    offered = item.secure if cloud == "SECURE" else item.community
    per_gpu = parse_money(item.price.secure if cloud == "SECURE" else item.price.community)
    return per_gpu * count if offered and per_gpu is not None else None


def max_count(item: WireGpuType, cloud: str) -> int | None:
    return item.maxCount.secure if cloud == "SECURE" else item.maxCount.community


def offer_of(item: WireGpuType, count: int, cloud: str = RENTED_CLOUD) -> Offer:
    """One catalog GPU type priced for ``count`` GPUs in ``cloud`` (the one gpuq rents in).  v2 quotes no spot
    price (RunPod rents no spot pods now); ``available`` and ``regions`` come from its pod availability."""
    regions = tuple(dc.id for dc in item.dataCenters or () if dc.availability not in (None, "NONE"))
    ceiling = max_count(item, cloud)
    return Offer(
        provider=PROVIDER, gpu_type=item.id, display_name=item.name or item.id, gpu_count=count,
        price_per_hour=cloud_price(item, cloud, count), gpu_memory_gb=item.memory,
        regions=regions,
        available=item.availability not in (None, "NONE") and (ceiling is None or ceiling >= count),
    )
