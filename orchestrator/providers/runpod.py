"""RunPod over its REST API v2 (``https://api.runpod.io/v2``, docs/providers.md): pods on demand, their
lifecycle and their SSH endpoints, the GPU catalog with its list prices, the account's SSH keys.  No GraphQL
and no v1 (retired on 2026-11-15).  RunPod rents no spot pods now: v2 has no interruptible, bid or spot
field, so the adapter declares no ``spot`` and no ``rebid`` (vast.ai is gpuq's spot market).

v2 (RunPod's published OpenAPI document, tests/fixtures/providers/README.md): ``GET /catalog/gpus`` quotes
GPU types (``include=AVAILABILITY&product=POD`` with ``count`` and ``cloud``: stock per data centre);
``POST /pods`` creates, ``GET /pods`` and ``GET /pods/{id}`` read, ``POST /pods/{id}/action`` with
``{"action": "stop"|"start"}`` stops and starts, ``DELETE /pods/{id}`` terminates; ``GET`` and ``PUT
/account/ssh-keys`` read and replace the account's keys.  Errors are RFC 9457 problem objects whose
``detail`` is quoted; a 400 on a create or start is ``NoCapacity`` (v2 gives capacity exhaustion no code of
its own: "try your next candidate"); a 404 on a read means the pod is gone.  Bodies are parsed by
runpod_wire.py.

Readiness (docs/providers.md, API half): ``status == RUNNING`` with an ``ssh.direct`` IP address and port
(both change on every start; the pod is created with ``startSsh`` and ``22/tcp`` for it).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import urlencode

import httpx

from orchestrator.core.errors import NoCapacity, ProviderError, ProviderUnsupported
from orchestrator.providers import runpod_wire as wire
from orchestrator.providers.base import Capabilities, Provider
from orchestrator.providers.credentials import RUNPOD, ApiKey
from orchestrator.providers.http_adapter import HttpProvider
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

log = logging.getLogger("orchestrator.providers.runpod")

# RunPod (docs/providers.md): 1 s doubling to 60 s, at most 6 tries; 2 requests per second per account.
RETRY = RetryPolicy(tries=6, first_delay_s=1.0, max_delay_s=60.0)
MIN_INTERVAL_S = 0.5
READY = PollPolicy(timeout_s=1200.0, first_s=5.0, max_s=15.0)
GONE = PollPolicy(timeout_s=300.0, first_s=5.0, max_s=15.0)

CLOUD_TYPES = wire.CLOUDS
SSH_USER = wire.SSH_USER
NO_SPOT = ("RunPod rents no spot pods (its v2 API has no interruptible or bid field); vast.ai is gpuq's "
           "spot market: --provider vastai --spot")
KEY_TYPES = ("ssh-", "ecdsa-", "sk-")  # UpdateSshKeysRequest's pattern: ^(ssh|ecdsa|sk)-


@dataclass(frozen=True)
class RunPodOptions(ProviderOptions):
    """RunPod's extras of a ProvisionRequest: the container image, Secure or Community cloud, the disks
    (container disk and the pod volume mounted at /workspace) and a network volume to mount there instead."""

    provider: ClassVar[str] = "runpod"
    image: str = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
    cloud_type: str = wire.RENTED_CLOUD
    container_disk_gb: int = 40
    volume_gb: int = 40
    network_volume_id: str | None = None


def key_body(public_key: str) -> str:
    """``type base64`` of an OpenSSH public key line (the comment does not identify a key)."""
    return " ".join(public_key.split()[:2])


def key_label(public_key: str) -> str:
    return "gpuq-" + hashlib.sha256(key_body(public_key).encode()).hexdigest()[:12]


def _segment(pod_id: str) -> str:
    """A pod id as one URL path segment (ids never contain slashes; refuse rather than escape)."""
    if not pod_id or "/" in pod_id or "?" in pod_id or "#" in pod_id or pod_id in (".", ".."):
        raise ProviderError("RunPod", f"not a pod id: {pod_id!r}", code="bad-id")
    return pod_id


class RunPodProvider(HttpProvider):
    """:class:`orchestrator.providers.base.Provider` for RunPod (REST API v2)."""

    name = "runpod"
    spec = RUNPOD
    # an EXITED pod bills no compute (its ``cost`` is 0.0) but keeps its container disk and pod volume, which
    # bill on (v2's pod billing has a ``diskAmount`` of its own) until DELETE: stop_bills_storage
    capabilities = Capabilities(spot=False, stop=True, rebid=False, regions=True, offers=True,
                                stop_bills_storage=True)
    default_retry = RETRY
    default_min_interval_s = MIN_INTERVAL_S
    default_ready = READY
    default_gone = GONE

    def __init__(self, key: ApiKey, *, url: str | None = None, wall: Callable[[], float] = time.time,
                 **options: Any) -> None:
        """``url``: the v2 base (``https://api.runpod.io/v2``); ``wall``: wall-clock time, for uptimes."""
        super().__init__(key, url=url, **options)
        self.wall = wall

    # -- calls -----------------------------------------------------------------------------------

    def _check(self, response: httpx.Response, what: str, *, capacity: bool = False) -> Any:
        """The JSON body of a 2xx answer (None when empty); a gpuq error for anything else (``capacity``: a
        400 is NoCapacity, as v2 documents for a create)."""
        body = self.http.json_body(response)
        status = response.status_code
        if 200 <= status < 300:
            return body
        if status == 403:
            raise self.http.auth_error(403, self.http.scrub(response.text, 200))
        detail = wire.problem_detail(body)
        text = self.http.scrub(str(wire.one_line(detail or response.text[:200] or "no message")))
        if capacity and status == 400:
            raise NoCapacity("RunPod", f"{what}: {text}", code="no-capacity", status=status)
        raise ProviderError("RunPod", f"{what}: HTTP {status}: {text}", code=str(status), status=status)

    def _call(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None,
              capacity: bool = False) -> Any:
        what = f"{method} {path.split('?')[0]}"
        response = self.http.request(method, path, json=json, timeout_s=timeout_s, what=what)
        return self._check(response, what, capacity=capacity)

    def _instance(self, pod: wire.WirePod) -> Instance:
        return wire.instance_of(pod, self.wall())

    # -- offers ----------------------------------------------------------------------------------------

    def _catalog(self, count: int, cloud: str = wire.RENTED_CLOUD) -> list[wire.WireGpuType]:
        query = urlencode({"include": "AVAILABILITY", "product": "POD", "count": count, "cloud": cloud})
        body = self._call("GET", f"/catalog/gpus?{query}")
        return list(wire.parse(wire.WireGpuTypes, body, "GET /catalog/gpus").gpus)

    def list_offers(self, query: OfferQuery) -> list[Offer]:
        """Every GPU type of the Secure cloud with at least ``query.gpu_count`` GPUs per pod (default 1), priced for
        that many at its list price (v2 quotes no spot price).  The catalog takes the count; the GPU type, memory
        floor, region (a data centre with stock) and price cap are filtered here (``OfferQuery.admits``); a spot
        query is refused (RunPod rents no spot pods)."""
        if query.spot:
            raise ProviderUnsupported("RunPod", NO_SPOT, code="no-spot")
        count = query.gpu_count or 1
        cloud = wire.RENTED_CLOUD
        offers = [wire.offer_of(item, count, cloud) for item in self._catalog(count, cloud)
                  if (wire.max_count(item, cloud) or count) >= count]
        return [offer for offer in offers if query.admits(offer)]

    def _gpu_item(self, gpu_type: str, count: int, cloud: str) -> wire.WireGpuType:
        """The catalog entry of ``gpu_type`` (ProviderError: unknown, or too many GPUs for one pod)."""
        found = [item for item in self._catalog(count, cloud) if item.id == gpu_type]
        if not found:
            raise ProviderError("RunPod", f"unknown GPU type {gpu_type!r} (see the offers for valid ids)",
                                code="unknown-gpu-type")
        ceiling = wire.max_count(found[0], cloud)
        if ceiling is not None and ceiling < count:
            raise ProviderError("RunPod", f"{gpu_type} pods have at most {ceiling} GPUs, not {count}",
                                code="gpu-count")
        return found[0]

    # -- instances -----------------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        pods = wire.parse(wire.WirePods, self._call("GET", "/pods"), "GET /pods").pods
        return [self._instance(pod) for pod in pods]

    def get(self, instance_id: str) -> Instance | None:
        path = f"/pods/{_segment(instance_id)}"
        response = self.http.request("GET", path, what=f"GET {path}")
        if response.status_code == 404:
            return None
        body = self._check(response, f"GET {path}")
        return self._instance(wire.parse(wire.WirePod, body, f"GET {path}"))

    def _find_by_name(self, name: str) -> str | None:
        matches = [i for i in self.list_instances() if i.name == name and not i.gone]
        if len(matches) > 1:
            log.warning("%d RunPod pods are named %s; adopting %s", len(matches), name, matches[0].id)
        return matches[0].id if matches else None

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        if request.spot:
            raise ProviderUnsupported("RunPod", NO_SPOT, code="no-spot")
        extras = request.options_for(RunPodOptions)
        cloud = extras.cloud_type.upper()
        if cloud not in CLOUD_TYPES:
            raise ProviderError("RunPod", f"cloud type {extras.cloud_type!r} is not one of {sorted(CLOUD_TYPES)}",
                                code="cloud-type")
        if request.ssh_public_key:
            self.ensure_ssh_key(request.ssh_public_key)
        item = self._gpu_item(request.gpu_type, request.gpu_count, cloud)
        check_price_cap("RunPod", request, wire.cloud_price(item, cloud, request.gpu_count))
        existing = {i.name: i.id for i in self.list_instances() if not i.gone}
        ids: list[str] = []
        for name in request.names():
            if name in existing:
                log.info("adopting RunPod pod %s already named %s", existing[name], name)
                pod_id = existing[name]
            else:
                pod_id = self._create(self._create_body(request, extras, name, cloud), name)
            ids.append(pod_id)
            if on_created is not None:
                on_created(name, pod_id)
        return [self.get(pod_id) or self._placeholder(pod_id, name, request)
                for pod_id, name in zip(ids, request.names(), strict=True)]

    @staticmethod
    def _placeholder(pod_id: str, name: str, request: ProvisionRequest) -> Instance:
        return Instance("runpod", pod_id, name, "pending", "PROVISIONING", gpu_count=request.gpu_count,
                        gpu_type=request.gpu_type)

    @staticmethod
    def _create_body(request: ProvisionRequest, extras: RunPodOptions, name: str, cloud: str) -> dict[str, Any]:
        """A ``CreatePodRequest``: sshd from ``startSsh`` (the account's keys as PUBLIC_KEY) on ``22/tcp``."""
        mounts: dict[str, Any] = {"persistent": {"size": extras.volume_gb, "path": "/workspace"}}
        if extras.network_volume_id:
            mounts = {"network": [{"volumeId": extras.network_volume_id, "path": "/workspace"}]}
        body: dict[str, Any] = {
            "name": name, "image": extras.image, "cloud": cloud,
            "gpu": {"id": request.gpu_type, "count": request.gpu_count},
            "disk": extras.container_disk_gb, "mounts": mounts, "ports": ["22/tcp"], "startSsh": True,
            "env": dict(sorted(request.env.items())),
        }
        if request.region:
            body["dataCenterIds"] = [request.region]
        return body

    def _create(self, body: Mapping[str, Any], name: str) -> str:
        """One create call, retried only after checking that no pod got the name meanwhile (docs/providers.md)."""
        return self.http.retrying(lambda: self._create_once(body), adopt=lambda: self._find_by_name(name),
                                  repeat_applied=False)

    def _create_once(self, body: Mapping[str, Any]) -> str:
        what = "POST /pods"
        answer = self._check(self.http.request_once("POST", "/pods", json=dict(body), what=what), what,
                             capacity=True)
        return wire.parse(wire.WirePod, answer, what).id

    # -- lifecycle ---------------------------------------------------------------------------------

    def _action(self, instance_id: str, action: str) -> None:
        self._call("POST", f"/pods/{_segment(instance_id)}/action", json={"action": action},
                   capacity=action == "start")

    def stop(self, instance_id: str) -> None:
        self._action(instance_id, "stop")

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        """``POST /pods/{id}/action`` ``start``: the pod comes back on its host with the GPUs it was created
        with (``gpu_count`` is not sent: v2 has no such field).  A bid is refused: RunPod has no spot pods."""
        if bid_per_gpu is not None:
            raise ProviderUnsupported("RunPod", f"{instance_id}: {NO_SPOT}; `gpuq resume` starts it on demand",
                                      code="no-rebid")
        self._action(instance_id, "start")

    def terminate(self, instance_id: str) -> None:
        current = self.get(instance_id)
        if current is None or current.gone:
            return
        path = f"/pods/{_segment(instance_id)}"
        response = self.http.request("DELETE", path, timeout_s=TERMINATE_TIMEOUT_S, what=f"DELETE {path}")
        if response.status_code != 404:
            self._check(response, f"DELETE {path}")

    # -- ssh keys ------------------------------------------------------------------------------------

    def ensure_ssh_key(self, public_key: str) -> str:
        """Add ``public_key`` to the account's SSH keys if missing (``PUT /account/ssh-keys`` replaces the whole
        set, so the current set is read first and kept); returns the key's gpuq label.  RunPod gives keys no
        names; they reach only pods created later (``startSsh``)."""
        body = key_body(public_key)
        if len(body.split()) != 2 or not body.startswith(KEY_TYPES):
            raise ProviderError("RunPod", "not an OpenSSH public key line", code="bad-key")
        keys = list(wire.parse(wire.WireSshKeys, self._call("GET", "/account/ssh-keys"),
                               "GET /account/ssh-keys").keys)
        if not any(key_body(line) == body for line in keys):
            self._call("PUT", "/account/ssh-keys", json={"keys": [*keys, " ".join(public_key.split())]})
        return key_label(public_key)


def _conforms(provider: RunPodProvider) -> Provider:
    """Checked by mypy: RunPodProvider satisfies the Provider protocol."""
    return provider
