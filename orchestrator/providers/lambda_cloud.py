"""Lambda Cloud over its v1 REST API (docs/providers.md): instance types, launch, list, terminate, SSH keys.

Every success body is ``{"data": ...}``; every error ``{"error": {code, message, suggestion}}``, and
errors are classified by ``error.code``, never by HTTP status alone (docs/providers.md).  One instance
per launch call (``quantity`` is never sent), launches at least 12 s apart, other calls at most one per
second; HTTP 429 waits 10 s doubling to 120 s, at most 6 tries, honouring ``Retry-After``
(docs/providers.md).  After a launch that failed client-side (429, timeout, 5xx) the instance list is
searched for the requested name before launching again: a launch can succeed and still answer an error.

Lambda has no spot and no stop: those raise ProviderUnsupported.  Readiness (API half): ``active`` with an
``ip``; SSH as ``ubuntu`` on port 22.  Bodies are parsed by lambda_wire.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

import httpx

from orchestrator.core.errors import NoCapacity, ProviderError, ProviderUnsupported
from orchestrator.providers import lambda_wire as wire
from orchestrator.providers.base import Capabilities, Provider
from orchestrator.providers.credentials import LAMBDA, ApiKey
from orchestrator.providers.http_adapter import HttpProvider, key_name
from orchestrator.providers.models import (
    Instance,
    Offer,
    OfferQuery,
    ProviderOptions,
    ProvisionRequest,
    check_price_cap,
)
from orchestrator.providers.polling import PollPolicy
from orchestrator.providers.transport import TERMINATE_TIMEOUT_S, RetryPolicy

log = logging.getLogger("orchestrator.providers.lambda")

RETRY = RetryPolicy(tries=6, first_delay_s=10.0, max_delay_s=120.0)
MIN_INTERVAL_S = 1.0
LAUNCH_INTERVAL_S = 12.0
READY = PollPolicy(timeout_s=900.0, first_s=10.0, max_s=10.0)
GONE = PollPolicy(timeout_s=600.0, first_s=10.0, max_s=10.0)
SSH_USER = wire.SSH_USER
SSH_PORT = wire.SSH_PORT

NOT_FOUND = "global/object-does-not-exist"
AUTH_CODES = frozenset({"global/invalid-api-key", "global/account-inactive"})
CAPACITY_CODE = "instance-operations/launch/insufficient-capacity"

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
                raise ProviderError(wire.LABEL, f"{what}: the response has no data", code="no-data",
                                    status=response.status_code)
            return body["data"]
        err = wire.parse_error(body)
        code = err.code
        message = self.http.scrub(err.message or response.text[:200] or "no message")
        suggestion = self.http.scrub(err.suggestion)
        detail = f"{message} ({suggestion})" if suggestion else message
        if code in AUTH_CODES:
            raise self.http.auth_error(response.status_code, detail, code=code)
        if code == CAPACITY_CODE:
            raise NoCapacity(wire.LABEL, f"{what}: {detail}", code=code, status=response.status_code)
        raise ProviderError(wire.LABEL, f"{what}: {code or 'HTTP ' + str(response.status_code)}: {detail}",
                            code=code or str(response.status_code), status=response.status_code)

    def _call(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None) -> Any:
        what = f"{method} {path}"
        return self._check(self.http.request(method, path, json=json, timeout_s=timeout_s, what=what), what)

    # -- offers ----------------------------------------------------------------------------------

    def _types(self) -> dict[str, wire.WireTypeEntry]:
        return wire.parse_as(wire.InstanceTypes, self._call("GET", "/instance-types"), "GET /instance-types")

    def list_offers(self, query: OfferQuery) -> list[Offer]:
        """Every instance type (or those with exactly ``query.gpu_count`` GPUs) with its price and the regions
        that have capacity now; ``available`` is False when none has.  ``/instance-types`` takes no filter: the
        count, type, memory floor, region and price cap are filtered here (``OfferQuery.admits``); a spot query
        is refused (Lambda has no spot)."""
        if query.spot:
            raise ProviderUnsupported(wire.LABEL, "Lambda Cloud has no spot instances; rent on demand",
                                      code="no-spot")
        offers = [wire.offer_of(name, entry) for name, entry in self._types().items()]
        return [offer for offer in offers if query.admits(offer)]

    # -- instances ----------------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        items = wire.parse_as(wire.Instances, self._call("GET", "/instances"), "GET /instances")
        return [wire.instance_of(item) for item in items]

    def get(self, instance_id: str) -> Instance | None:
        path = f"/instances/{_segment(instance_id)}"
        try:
            data = self._call("GET", path)
        except ProviderError as exc:
            if exc.code == NOT_FOUND:
                return None
            raise
        return wire.instance_of(wire.parse(wire.WireInstance, data, "GET /instances/{id}"))

    def _find_by_name(self, name: str) -> str | None:
        matches = [i for i in self.list_instances() if i.name == name and i.state not in ("terminating", "terminated")]
        if len(matches) > 1:
            log.warning("%d Lambda instances are named %s; adopting %s", len(matches), name, matches[0].id)
        return matches[0].id if matches else None

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        if request.spot:
            raise ProviderUnsupported(wire.LABEL, "Lambda Cloud has no spot instances; rent on demand",
                                      code="no-spot")
        if not request.ssh_public_key:
            raise ProviderError(wire.LABEL, "a launch needs exactly one SSH key: pass ssh_public_key",
                                code="no-ssh-key")
        extras = request.options_for(LambdaOptions)
        types = self._types()
        entry = types.get(request.gpu_type)
        if entry is None:
            known = ", ".join(sorted(types)) or "none"
            raise ProviderError(wire.LABEL, f"unknown instance type {request.gpu_type!r} (known: {known})",
                                code="unknown-instance-type")
        offer = wire.offer_of(request.gpu_type, entry)
        check_price_cap(wire.LABEL, request, offer.price_per_hour)
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
                raise NoCapacity(wire.LABEL, f"no capacity for {request.gpu_type} in {request.region} now "
                                 f"(regions with capacity: {', '.join(offer.regions) or 'none'})",
                                 code=CAPACITY_CODE)
            return request.region
        if not offer.regions:
            raise NoCapacity(wire.LABEL, f"no region has capacity for {request.gpu_type} now", code=CAPACITY_CODE)
        return offer.regions[0]

    def _launch(self, body: Mapping[str, Any], name: str) -> str:
        """One launch, retried only after checking that no instance got the name meanwhile."""
        return self.http.retrying(lambda: self._launch_once(body), adopt=lambda: self._find_by_name(name),
                                  repeat_applied=False)

    def _launch_once(self, body: Mapping[str, Any]) -> str:
        self.http.throttle("launch", self.launch_interval_s)
        what = "POST /instance-operations/launch"
        data = self._check(self.http.request_once("POST", "/instance-operations/launch", json=dict(body),
                                                  what=what), what)
        ids = wire.parse(wire.WireLaunch, data, what).instance_ids
        if not ids:
            raise ProviderError(wire.LABEL, f"{what} returned no instance id", code="no-instance")
        return ids[0]

    # -- lifecycle -----------------------------------------------------------------------------------

    def stop(self, instance_id: str) -> None:
        raise ProviderUnsupported(wire.LABEL, "Lambda Cloud has no stop (an in-OS shutdown keeps billing); "
                                  "terminate the instance instead", code="no-stop")

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        raise ProviderUnsupported(wire.LABEL, "Lambda Cloud cannot resume an instance; launch a new one",
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

    def list_ssh_keys(self) -> list[wire.WireSshKey]:
        return wire.parse_as(wire.SshKeys, self._call("GET", "/ssh-keys"), "GET /ssh-keys")

    def ensure_ssh_key(self, public_key: str) -> str:
        """Register ``public_key`` as ``gpuq-<sha12>`` unless the account already has it (under any name);
        never asks Lambda to generate a pair (the private key would travel over the API)."""
        body = " ".join(public_key.split()[:2])
        if len(body.split()) != 2:
            raise ProviderError(wire.LABEL, "not an OpenSSH public key line", code="bad-key")
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
            if " ".join(key.public_key.split()[:2]) == body:
                return key.name
            if key.name == name:
                raise ProviderError(wire.LABEL, f"an SSH key named {name} exists with a different public key",
                                    code="key-name-taken")
        return None


def _segment(value: str) -> str:
    """An id as one URL path segment (ids never contain slashes; refuse rather than escape)."""
    if not value or "/" in value or value in (".", ".."):
        raise ProviderError(wire.LABEL, f"not an instance id: {value!r}", code="bad-id")
    return value


def _conforms(provider: LambdaProvider) -> Provider:
    """Checked by mypy: LambdaProvider satisfies the Provider protocol."""
    return provider
