"""Lambda Cloud over its v1 REST API (docs/providers.md): instance types, launch, list, terminate, SSH keys.

Every success body is ``{"data": ...}``; every error ``{"error": {code, message, suggestion}}``, and
errors are classified by ``error.code``, never by HTTP status alone (docs/providers.md).  One instance
per launch call (``quantity`` is never sent), launches at least 12 s apart, other calls at most one per
second; HTTP 429 waits 10 s doubling to 120 s, at most 6 tries, honouring ``Retry-After``
(docs/providers.md).  After a launch that failed client-side (429, timeout, 5xx) the instance list is
searched for the requested name before launching again: a launch can succeed and still answer an error.

Lambda has no spot and no stop: those raise ProviderUnsupported.  Readiness (API half): ``active`` with an
``ip``; SSH as ``ubuntu`` on port 22.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

import httpx

from orchestrator.core.errors import NoCapacity, ProviderError, ProviderUnsupported
from orchestrator.providers.base import Capabilities, Provider
from orchestrator.providers.credentials import LAMBDA, ApiKey
from orchestrator.providers.http_adapter import HttpProvider, key_name
from orchestrator.providers.models import (
    Instance,
    InstanceState,
    Offer,
    OfferQuery,
    ProviderOptions,
    ProvisionRequest,
    check_price_cap,
    parse_money,
)
from orchestrator.providers.polling import PollPolicy
from orchestrator.providers.transport import TERMINATE_TIMEOUT_S, RetryPolicy, json_object

log = logging.getLogger("orchestrator.providers.lambda")

RETRY = RetryPolicy(tries=6, first_delay_s=10.0, max_delay_s=120.0)
MIN_INTERVAL_S = 1.0
LAUNCH_INTERVAL_S = 12.0
READY = PollPolicy(timeout_s=900.0, first_s=10.0, max_s=10.0)
GONE = PollPolicy(timeout_s=600.0, first_s=10.0, max_s=10.0)
SSH_USER = "ubuntu"
SSH_PORT = 22

NOT_FOUND = "global/object-does-not-exist"
AUTH_CODES = frozenset({"global/invalid-api-key", "global/account-inactive"})
CAPACITY_CODE = "instance-operations/launch/insufficient-capacity"

_STATES: dict[str, InstanceState] = {
    "booting": "pending", "active": "running", "unhealthy": "unhealthy",
    "terminating": "terminating", "terminated": "terminated",
}
_GPUS_IN_NAME = re.compile(r"^gpu_(\d+)x_")
_GPU_MEMORY = re.compile(r"\((\d{1,4}) GB\b")  # "A100 (40 GB SXM4)": the memory per GPU it is sold with


def gpus_of(type_name: str, specs: object) -> int | None:
    """GPUs of an instance type: ``specs.gpus`` when present, else the ``gpu_<n>x_`` name prefix."""
    if isinstance(specs, dict) and isinstance(specs.get("gpus"), int):
        return int(specs["gpus"])
    match = _GPUS_IN_NAME.match(type_name)
    return int(match.group(1)) if match else None


def memory_of(itype: Mapping[str, Any]) -> int | None:
    """GB per GPU from ``gpu_description`` (else ``description``): "A100 (40 GB SXM4)" → 40; None when absent."""
    for text in (itype.get("gpu_description"), itype.get("description")):
        match = _GPU_MEMORY.search(text) if isinstance(text, str) else None
        if match:
            return int(match.group(1))
    return None


def cents_to_dollars(value: object) -> Decimal | None:
    cents = parse_money(value)
    return cents / 100 if cents is not None else None


def instance_from_json(item: Mapping[str, Any]) -> Instance:
    """One Lambda instance object → Instance.  Unknown statuses count as pending (logged)."""
    raw = str(item.get("status") or "")
    state = _STATES.get(raw)
    if state is None:
        log.warning("Lambda instance %s has an unknown status %r; treating it as not ready", item.get("id"), raw)
        state = "pending"
    ip = item.get("ip") if isinstance(item.get("ip"), str) and item.get("ip") else None
    itype = json_object(item.get("instance_type"))
    region = json_object(item.get("region"))
    type_name = str(itype.get("name") or "")
    return Instance(
        provider="lambda",
        id=str(item.get("id")),
        name=str(item.get("name") or ""),
        state=state,
        raw_status=raw,
        ssh_host=ip,
        ssh_port=SSH_PORT if ip else None,
        ssh_user=SSH_USER if ip else None,
        price_per_hour=cents_to_dollars(itype.get("price_cents_per_hour")),
        gpu_count=gpus_of(type_name, itype.get("specs")),
        gpu_type=type_name or None,
        spot=False,
        region=str(region.get("name")) if region.get("name") else None,
        reason="",
    )


@dataclass(frozen=True)
class LambdaOptions(ProviderOptions):
    """Lambda Cloud's extras of a ProvisionRequest: a persistent file system to attach (same region)."""

    provider: ClassVar[str] = "lambda"
    file_system_name: str | None = None


class LambdaProvider(HttpProvider):
    """:class:`orchestrator.providers.base.Provider` for Lambda Cloud (REST v1)."""

    name = "lambda"
    spec = LAMBDA
    capabilities = Capabilities(spot=False, stop=False, rebid=False, regions=True, offers=True)
    default_retry = RETRY
    default_min_interval_s = MIN_INTERVAL_S
    default_ready = READY
    default_gone = GONE

    def __init__(self, key: ApiKey, *, launch_interval_s: float = LAUNCH_INTERVAL_S, **options: Any) -> None:
        super().__init__(key, **options)
        self.launch_interval_s = launch_interval_s

    @classmethod
    def quick_options(cls, poll_s: float, ready_timeout_s: float) -> dict[str, Any]:
        return {**super().quick_options(poll_s, ready_timeout_s), "launch_interval_s": 0.0}

    # -- REST ------------------------------------------------------------------------------------

    def _check(self, response: httpx.Response, what: str) -> Any:
        """``data`` of a 2xx response; a gpuq error for anything else, by ``error.code``."""
        body = self.http.json_body(response)
        if 200 <= response.status_code < 300:
            if not isinstance(body, dict) or "data" not in body:
                raise ProviderError("Lambda Cloud", f"{what}: the response has no data", code="no-data",
                                    status=response.status_code)
            return body["data"]
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        code = str(err.get("code") or "")
        message = self.http.scrub(str(err.get("message") or response.text[:200] or "no message"))
        suggestion = self.http.scrub(str(err.get("suggestion") or ""))
        detail = f"{message} ({suggestion})" if suggestion else message
        if code in AUTH_CODES:
            raise self.http.auth_error(response.status_code, detail, code=code)
        if code == CAPACITY_CODE:
            raise NoCapacity("Lambda Cloud", f"{what}: {detail}", code=code, status=response.status_code)
        raise ProviderError("Lambda Cloud", f"{what}: {code or 'HTTP ' + str(response.status_code)}: {detail}",
                            code=code or str(response.status_code), status=response.status_code)

    def _call(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None) -> Any:
        what = f"{method} {path}"
        return self._check(self.http.request(method, path, json=json, timeout_s=timeout_s, what=what), what)

    # -- offers ----------------------------------------------------------------------------------

    def _types(self) -> dict[str, Any]:
        data = self._call("GET", "/instance-types")
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _offer(name: str, entry: Mapping[str, Any]) -> Offer:
        itype = json_object(entry.get("instance_type"))
        specs = itype.get("specs")
        regions = tuple(str(r["name"]) for r in entry.get("regions_with_capacity_available") or []
                        if isinstance(r, dict) and r.get("name"))
        gpus = gpus_of(name, specs)
        return Offer(
            provider="lambda",
            gpu_type=name,
            display_name=str(itype.get("description") or name),
            gpu_count=gpus if gpus is not None else 0,
            price_per_hour=cents_to_dollars(itype.get("price_cents_per_hour")),
            gpu_memory_gb=memory_of(itype),
            regions=regions,
            available=bool(regions),
        )

    def list_offers(self, query: OfferQuery) -> list[Offer]:
        """Every instance type (or those with exactly ``query.gpu_count`` GPUs) with its price and the regions
        that have capacity now; ``available`` is False when none has.  ``/instance-types`` takes no filter: the
        count, type, memory floor, region and price cap are filtered here (``OfferQuery.admits``); a spot query
        is refused (Lambda has no spot)."""
        if query.spot:
            raise ProviderUnsupported("Lambda Cloud", "Lambda Cloud has no spot instances; rent on demand",
                                      code="no-spot")
        offers = [self._offer(name, entry) for name, entry in self._types().items() if isinstance(entry, dict)]
        return [offer for offer in offers if query.admits(offer)]

    # -- instances ----------------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        data = self._call("GET", "/instances")
        return [instance_from_json(item) for item in data or [] if isinstance(item, dict) and item.get("id")]

    def get(self, instance_id: str) -> Instance | None:
        try:
            data = self._call("GET", f"/instances/{_segment(instance_id)}")
        except ProviderError as exc:
            if exc.code == NOT_FOUND:
                return None
            raise
        return instance_from_json(data) if isinstance(data, dict) else None

    def _find_by_name(self, name: str) -> str | None:
        matches = [i for i in self.list_instances() if i.name == name and i.state not in ("terminating", "terminated")]
        if len(matches) > 1:
            log.warning("%d Lambda instances are named %s; adopting %s", len(matches), name, matches[0].id)
        return matches[0].id if matches else None

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        if request.spot:
            raise ProviderUnsupported("Lambda Cloud", "Lambda Cloud has no spot instances; rent on demand",
                                      code="no-spot")
        if not request.ssh_public_key:
            raise ProviderError("Lambda Cloud", "a launch needs exactly one SSH key: pass ssh_public_key",
                                code="no-ssh-key")
        extras = request.options_for(LambdaOptions)
        types = self._types()
        entry = types.get(request.gpu_type)
        if not isinstance(entry, dict):
            known = ", ".join(sorted(types)) or "none"
            raise ProviderError("Lambda Cloud", f"unknown instance type {request.gpu_type!r} (known: {known})",
                                code="unknown-instance-type")
        offer = self._offer(request.gpu_type, entry)
        check_price_cap("Lambda Cloud", request, offer.price_per_hour)
        region = self._region(request, offer)
        ssh_key = self.ensure_ssh_key(request.ssh_public_key)
        existing = {i.name: i.id for i in self.list_instances() if i.state not in ("terminating", "terminated")}
        ids: list[str] = []
        for name in request.names():
            if name in existing:
                log.info("adopting Lambda instance %s already named %s", existing[name], name)
                instance_id = existing[name]
            else:
                body: dict[str, Any] = {"region_name": region, "instance_type_name": request.gpu_type,
                                        "ssh_key_names": [ssh_key], "name": name}
                if extras.file_system_name:
                    body["file_system_names"] = [extras.file_system_name]
                instance_id = self._launch(body, name)
            ids.append(instance_id)
            if on_created is not None:
                on_created(name, instance_id)
        return [self.get(i) or Instance("lambda", i, n, "pending", "booting", gpu_type=request.gpu_type,
                                        region=region) for i, n in zip(ids, request.names(), strict=True)]

    @staticmethod
    def _region(request: ProvisionRequest, offer: Offer) -> str:
        if request.region:
            if request.region not in offer.regions:
                raise NoCapacity("Lambda Cloud", f"no capacity for {request.gpu_type} in {request.region} now "
                                 f"(regions with capacity: {', '.join(offer.regions) or 'none'})",
                                 code=CAPACITY_CODE)
            return request.region
        if not offer.regions:
            raise NoCapacity("Lambda Cloud", f"no region has capacity for {request.gpu_type} now", code=CAPACITY_CODE)
        return offer.regions[0]

    def _launch(self, body: Mapping[str, Any], name: str) -> str:
        """One launch, retried only after checking that no instance got the name meanwhile."""
        return self.http.retrying(lambda: self._launch_once(body), adopt=lambda: self._find_by_name(name))

    def _launch_once(self, body: Mapping[str, Any]) -> str:
        self.http.throttle("launch", self.launch_interval_s)
        what = "POST /instance-operations/launch"
        data = self._check(self.http.request_once("POST", "/instance-operations/launch", json=dict(body),
                                                  what=what), what)
        ids = data.get("instance_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not ids:
            raise ProviderError("Lambda Cloud", f"{what} returned no instance id", code="no-instance")
        return str(ids[0])

    # -- lifecycle -----------------------------------------------------------------------------------

    def stop(self, instance_id: str) -> None:
        raise ProviderUnsupported("Lambda Cloud", "Lambda Cloud has no stop (an in-OS shutdown keeps billing); "
                                  "terminate the instance instead", code="no-stop")

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        raise ProviderUnsupported("Lambda Cloud", "Lambda Cloud cannot resume an instance; launch a new one",
                                  code="no-resume")

    def terminate(self, instance_id: str) -> None:
        """Idempotent: an instance Lambda no longer knows is already gone.  The response may omit the
        instance; only :meth:`wait_gone` proves it is gone."""
        try:
            self._call("POST", "/instance-operations/terminate", json={"instance_ids": [instance_id]},
                       timeout_s=TERMINATE_TIMEOUT_S)
        except ProviderError as exc:
            if exc.code != NOT_FOUND:
                raise

    # -- ssh keys ------------------------------------------------------------------------------------

    def list_ssh_keys(self) -> list[dict[str, str]]:
        data = self._call("GET", "/ssh-keys")
        return [{"id": str(k.get("id")), "name": str(k.get("name")), "public_key": str(k.get("public_key") or "")}
                for k in data or [] if isinstance(k, dict)]

    def ensure_ssh_key(self, public_key: str) -> str:
        """Register ``public_key`` as ``gpuq-<sha12>`` unless the account already has it (under any name);
        never asks Lambda to generate a pair (the private key would travel over the API)."""
        body = " ".join(public_key.split()[:2])
        if len(body.split()) != 2:
            raise ProviderError("Lambda Cloud", "not an OpenSSH public key line", code="bad-key")
        name = key_name(public_key)
        found = self._registered(body, name)
        if found is not None:
            return found
        what = "POST /ssh-keys"

        def add() -> str:
            payload = {"name": name, "public_key": public_key.strip()}
            self._check(self.http.request_once("POST", "/ssh-keys", json=payload, what=what), what)
            return name

        return self.http.retrying(add, adopt=lambda: self._registered(body, name))

    def _registered(self, body: str, name: str) -> str | None:
        """The name under which the account holds the key ``body``, or None."""
        for key in self.list_ssh_keys():
            if " ".join(key["public_key"].split()[:2]) == body:
                return key["name"]
            if key["name"] == name:
                raise ProviderError("Lambda Cloud", f"an SSH key named {name} exists with a different public key",
                                    code="key-name-taken")
        return None


def _segment(value: str) -> str:
    """An id as one URL path segment (ids never contain slashes; refuse rather than escape)."""
    if not value or "/" in value or value in (".", ".."):
        raise ProviderError("Lambda Cloud", f"not an instance id: {value!r}", code="bad-id")
    return value


def _conforms(provider: LambdaProvider) -> Provider:
    """Checked by mypy: LambdaProvider satisfies the Provider protocol."""
    return provider
