"""Lambda Cloud's REST API v1 JSON, typed and bounded at the edge (docs/providers.md, "Lambda Cloud").

Every body the Lambda adapter reads is parsed here first, into pydantic models that ignore fields gpuq does
not use and are strict about the types of those it does (Lambda's published OpenAPI document,
tests/fixtures/providers/lambda/published/openapi-1.8.3.json, which the fake's recorded exchanges are
checked against).  Only what gpuq needs is required (an instance's ``id``, a launch's ``instance_ids``);
text is one printable line, numbers are bounded.

Instance ``status`` → gpuq:

===============================  ====================================================
v1 ``status``                    gpuq
===============================  ====================================================
``booting``                      ``pending``
``active``                       ``running`` (ready once it has an ``ip``)
``unhealthy``                    ``unhealthy`` → ``host_failure``
``terminating``, ``terminated``  ``terminating``, ``terminated``
anything else                    ``pending`` (logged: not understood, never ready)
===============================  ====================================================
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from orchestrator.core.errors import ProviderError
from orchestrator.providers.models import Instance, InstanceState, Offer, parse_money

log = logging.getLogger("orchestrator.providers.lambda")

PROVIDER = "lambda"
LABEL = "Lambda Cloud"
SSH_USER = "ubuntu"
SSH_PORT = 22
MAX_TEXT = 200
MAX_ITEMS = 10_000

STATES: dict[str, InstanceState] = {
    "booting": "pending", "active": "running", "unhealthy": "unhealthy",
    "terminating": "terminating", "terminated": "terminated",
}
_PRINTABLE = re.compile(r"[^\x20-\x7e]+")
_GPUS_IN_NAME = re.compile(r"^gpu_(\d+)x_")
_GPU_MEMORY = re.compile(r"\((\d{1,4}) GB\b")  # "A100 (40 GB SXM4)": the memory per GPU it is sold with


def one_line(value: object) -> object:
    """API text: one printable ASCII line, at most MAX_TEXT characters (never rejected)."""
    if not isinstance(value, str):
        return value
    return _PRINTABLE.sub(" ", value).strip()[:MAX_TEXT]


Text = Annotated[str, BeforeValidator(one_line)]
Id = Annotated[str, Field(min_length=1, max_length=100)]
Cents = Annotated[int, Field(ge=0, le=10_000_000)]
Count = Annotated[int, Field(ge=0, le=1024)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class WireSpecs(_Wire):
    """``InstanceTypeSpecs`` (gpuq reads the GPU count)."""

    gpus: Count | None = None


class WireInstanceType(_Wire):
    """``InstanceType``: a machine shape and its price in US cents per hour."""

    name: Text = ""
    description: Text = ""
    gpu_description: Text = ""
    price_cents_per_hour: Cents | None = None
    specs: WireSpecs | None = None

    def gpus(self) -> int | None:
        """``specs.gpus`` when present, else the ``gpu_<n>x_`` name prefix."""
        if self.specs is not None and self.specs.gpus is not None:
            return self.specs.gpus
        match = _GPUS_IN_NAME.match(self.name)
        return int(match.group(1)) if match else None

    def memory_gb(self) -> int | None:
        """GB per GPU from ``gpu_description`` (else ``description``): "A100 (40 GB SXM4)" → 40."""
        for text in (self.gpu_description, self.description):
            match = _GPU_MEMORY.search(text)
            if match:
                return int(match.group(1))
        return None

    def price(self) -> Decimal | None:
        cents = parse_money(self.price_cents_per_hour)
        return cents / 100 if cents is not None else None


class WireRegion(_Wire):
    name: Text = ""
    description: Text = ""


class WireTypeEntry(_Wire):
    """``InstanceTypesItem``: one shape with the regions that have capacity for it now."""

    instance_type: WireInstanceType = WireInstanceType()
    regions_with_capacity_available: Annotated[list[WireRegion], Field(max_length=1000)] = []


class WireInstance(_Wire):
    """``Instance`` of ``GET /instances`` and ``GET /instances/{id}``."""

    id: Id
    name: Text | None = None  # "if set": an instance launched without a name has none
    status: Text = ""
    ip: Annotated[str, Field(max_length=253)] | None = None  # checked as an address at registration (ssh_address)
    instance_type: WireInstanceType | None = None
    region: WireRegion | None = None


class WireLaunch(_Wire):
    """``InstanceLaunchResponse``."""

    instance_ids: Annotated[list[Id], Field(max_length=MAX_ITEMS)] = []


class WireSshKey(_Wire):
    """``SSHKey`` (the account's stored public keys)."""

    id: Text = ""
    name: Text = ""
    public_key: Annotated[str, Field(max_length=4096)] = ""


class WireError(_Wire):
    """``error`` of every error body: classified by ``code``, never by HTTP status alone."""

    code: Text = ""
    message: Text = ""
    suggestion: Text = ""


class WireErrorBody(_Wire):
    error: WireError = WireError()


InstanceTypes = TypeAdapter(Annotated[dict[str, WireTypeEntry], Field(max_length=MAX_ITEMS)])
Instances = TypeAdapter(Annotated[list[WireInstance], Field(max_length=MAX_ITEMS)])
SshKeys = TypeAdapter(Annotated[list[WireSshKey], Field(max_length=MAX_ITEMS)])

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


def _where(exc: ValidationError) -> str:
    fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})[:5]
    return ", ".join(fields) or "the body"


def parse(model: type[_M], body: object, what: str) -> _M:
    """``body`` as ``model``; ProviderError (no raw text) when Lambda's answer does not fit it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProviderError(LABEL, f"{what}: unexpected answer (fields: {_where(exc)})", code="bad-answer") from None


def parse_as(adapter: TypeAdapter[_T], body: object, what: str) -> _T:
    """``body`` through ``adapter`` (a list or table of models); ProviderError as :func:`parse`."""
    try:
        return adapter.validate_python(body)
    except ValidationError as exc:
        raise ProviderError(LABEL, f"{what}: unexpected answer (fields: {_where(exc)})", code="bad-answer") from None


def parse_error(body: Any) -> WireError:
    """The ``error`` of an error body; an empty one when the body is not Lambda's error shape."""
    try:
        return WireErrorBody.model_validate(body if isinstance(body, dict) else {}).error
    except ValidationError:
        return WireError()


def offer_of(name: str, entry: WireTypeEntry) -> Offer:
    """One instance type with its price and the regions with capacity now (``available``: any has)."""
    itype = entry.instance_type
    regions = tuple(r.name for r in entry.regions_with_capacity_available if r.name)
    gpus = itype.gpus()
    return Offer(provider=PROVIDER, gpu_type=name, display_name=itype.description or name,
                 gpu_count=gpus if gpus is not None else 0, price_per_hour=itype.price(),
                 gpu_memory_gb=itype.memory_gb(), regions=regions, available=bool(regions))


def instance_of(item: WireInstance) -> Instance:
    """One Lambda instance → Instance.  Unknown statuses count as pending (logged)."""
    state = STATES.get(item.status)
    if state is None:
        log.warning("Lambda instance %s has an unknown status %r; treating it as not ready", item.id, item.status)
        state = "pending"
    ip = item.ip or None
    itype = item.instance_type or WireInstanceType()
    return Instance(
        provider=PROVIDER, id=item.id, name=item.name or "", state=state, raw_status=item.status,
        ssh_host=ip, ssh_port=SSH_PORT if ip else None, ssh_user=SSH_USER if ip else None,
        price_per_hour=itype.price(), gpu_count=itype.gpus(), gpu_type=itype.name or None, spot=False,
        region=item.region.name if item.region is not None and item.region.name else None, reason="")
