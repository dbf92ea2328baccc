"""RunPod over its REST API (``https://rest.runpod.io/v1``, docs/providers.md): pods on demand and
interruptible (spot), their lifecycle and their SSH endpoints.  What REST lacks (prices and spot bids, the
account's SSH keys, a re-bid resume) goes over GraphQL: runpod_graphql.py names each call.

REST (RunPod's published OpenAPI document, tests/fixtures/providers/README.md): ``POST /pods`` creates
(``interruptible: true`` for spot), ``GET /pods`` and ``GET /pods/{id}`` read, ``POST /pods/{id}/stop`` and
``/start`` stop and start, ``DELETE /pods/{id}`` terminates.  Errors are non-2xx answers whose JSON
``error`` text is quoted (``NoCapacity`` when it says no instances are available); a 404 on a read means
the pod is gone.  Pods created over GraphQL by an older gpuq are the same pods with the same ids.

Readiness (docs/providers.md, API half): ``desiredStatus == RUNNING`` with a ``publicIp`` and a
``portMappings`` entry for port 22 (both change on every start).  Classification of EXITED pods uses
``lastStatusChange`` (:func:`base.classify`), as before.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar

import httpx

from orchestrator.core.errors import NoCapacity, ProviderError, ProviderUnsupported
from orchestrator.providers.base import (
    Capabilities,
    Instance,
    InstanceState,
    Offer,
    PollPolicy,
    Provider,
    ProviderOptions,
    ProvisionRequest,
    check_price_cap,
    parse_money,
)
from orchestrator.providers.credentials import RUNPOD, ApiKey, follow
from orchestrator.providers.http_adapter import HttpProvider
from orchestrator.providers.runpod_graphql import CAPACITY_TEXT, RENTED_CLOUD, RunPodGraphQL, cloud_price, offer_from
from orchestrator.providers.transport import TERMINATE_TIMEOUT_S, ApiTransport, RetryPolicy, json_object

log = logging.getLogger("orchestrator.providers.runpod")

# RunPod (docs/providers.md): 1 s doubling to 60 s, at most 6 tries; 2 requests per second per account.
RETRY = RetryPolicy(tries=6, first_delay_s=1.0, max_delay_s=60.0)
MIN_INTERVAL_S = 0.5
READY = PollPolicy(timeout_s=1200.0, first_s=5.0, max_s=15.0)
GONE = PollPolicy(timeout_s=300.0, first_s=5.0, max_s=15.0)

CLOUD_TYPES = frozenset({"COMMUNITY", "SECURE"})  # REST's PodCreateInput.cloudType
SSH_USER = "root"

_STATES: dict[str, InstanceState] = {
    "RUNNING": "running", "EXITED": "exited", "TERMINATED": "terminated",
    "CREATED": "pending", "RESTARTING": "pending", "PAUSED": "pending",
}


@dataclass(frozen=True)
class RunPodOptions(ProviderOptions):
    """RunPod's extras of a ProvisionRequest: the container image, Secure or Community cloud, the disks
    (container disk and the pod volume mounted at /workspace) and a network volume to attach."""

    provider: ClassVar[str] = "runpod"
    image: str = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
    cloud_type: str = RENTED_CLOUD
    container_disk_gb: int = 40
    volume_gb: int = 40
    network_volume_id: str | None = None


def ssh_endpoint(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """``publicIp`` and the public port ``portMappings`` maps port 22 to, or None (not ready)."""
    ip, mappings = pod.get("publicIp"), pod.get("portMappings")
    if not isinstance(ip, str) or not ip or not isinstance(mappings, dict):
        return None
    public = mappings.get("22")
    if isinstance(public, int) and not isinstance(public, bool) and public > 0:
        return ip, public
    return None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _uptime(pod: Mapping[str, Any], now: float) -> float | None:
    started = pod.get("lastStartedAt")
    if not isinstance(started, str) or not started:
        return None
    try:
        when = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return now - when if now >= when else None


def pod_to_instance(pod: Mapping[str, Any], now: float | None = None) -> Instance:
    """One REST Pod object → Instance (``now``: wall-clock seconds, for the uptime).  Unknown statuses
    count as pending."""
    raw = str(pod.get("desiredStatus") or "")
    state = _STATES.get(raw)
    if state is None:
        log.warning("pod %s has an unknown desiredStatus %r; treating it as not ready", pod.get("id"), raw)
        state = "pending"
    endpoint = ssh_endpoint(pod) if state == "running" else None
    gpu, machine = json_object(pod.get("gpu")), json_object(pod.get("machine"))
    gpu_name = gpu.get("displayName") or machine.get("gpuDisplayName")
    return Instance(
        provider="runpod",
        id=str(pod.get("id")),
        name=str(pod.get("name") or ""),
        state=state,
        raw_status=raw,
        ssh_host=endpoint[0] if endpoint else None,
        ssh_port=endpoint[1] if endpoint else None,
        ssh_user=SSH_USER if endpoint else None,
        price_per_hour=parse_money(pod.get("costPerHr")),
        gpu_count=_count(gpu.get("count")),
        gpu_type=str(gpu_name) if gpu_name else None,
        spot=pod.get("interruptible") is True,
        region=None,
        reason=str(pod.get("lastStatusChange") or ""),
        uptime_s=_uptime(pod, now) if now is not None and state == "running" else None,
    )


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
    """:class:`orchestrator.providers.base.Provider` for RunPod (REST, GraphQL where REST has no call)."""

    name = "runpod"
    spec = RUNPOD
    capabilities = Capabilities(spot=True, stop=True, rebid=True, regions=True, offers=True)
    default_retry = RETRY
    default_min_interval_s = MIN_INTERVAL_S
    default_ready = READY
    default_gone = GONE

    def __init__(self, key: ApiKey, *, url: str | None = None, graphql_url: str | None = None,
                 wall: Callable[[], float] = time.time, **options: Any) -> None:
        """``url``: the REST base; ``graphql_url``: the GraphQL endpoint (default: RunPod's, or beside a
        ``url`` that is not RunPod's, as credentials.load_url does).  ``wall``: wall-clock time, for uptimes."""
        super().__init__(key, url=url, **options)
        if graphql_url is None:
            default = RUNPOD.more_urls[0].default_url
            graphql_url = default if self.http.base_url == RUNPOD.default_url else follow(self.http.base_url, default)
        http = self.http
        self.graphql = RunPodGraphQL(ApiTransport(
            RUNPOD, graphql_url, key, policy=http.policy, min_interval_s=http.min_interval_s,
            transport=options.get("transport"), sleep=http.sleep, clock=http.clock, rng=http.rng))
        self.wall = wall

    def __repr__(self) -> str:
        return f"RunPodProvider({self.http.base_url} + {self.graphql.http.base_url}, key {self.http.key!r})"

    def close(self) -> None:
        self.http.close()
        self.graphql.http.close()

    # -- REST ------------------------------------------------------------------------------------

    def _check(self, response: httpx.Response, what: str) -> Any:
        """The JSON body of a 2xx answer (None when empty); a gpuq error for anything else."""
        body = self.http.json_body(response)
        if 200 <= response.status_code < 300:
            return body
        if response.status_code == 403:
            raise self.http.auth_error(403, self.http.scrub(response.text, 200))
        err = body.get("error") if isinstance(body, dict) else None
        text = self.http.scrub(str(err if err else response.text[:200] or "no message"))
        if CAPACITY_TEXT in text.lower():
            raise NoCapacity("RunPod", f"{what}: {text}", code="no-capacity", status=response.status_code)
        raise ProviderError("RunPod", f"{what}: HTTP {response.status_code}: {text}",
                            code=str(response.status_code), status=response.status_code)

    def _call(self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None) -> Any:
        what = f"{method} {path}"
        return self._check(self.http.request(method, path, json=json, timeout_s=timeout_s, what=what), what)

    def _instance(self, pod: Mapping[str, Any]) -> Instance:
        return pod_to_instance(pod, self.wall())

    # -- offers (GraphQL) --------------------------------------------------------------------------

    def list_offers(self, gpu_count: int | None = None) -> list[Offer]:
        """Every GPU type with at least ``gpu_count`` GPUs per pod (default 1), priced for that many."""
        count = gpu_count or 1
        return [offer_from(item, count) for item in self.graphql.gpu_types(count)
                if not (isinstance(item.get("maxGpuCount"), int) and item["maxGpuCount"] < count)]

    def _gpu_type(self, gpu_type: str, count: int) -> Offer:
        return offer_from(self._gpu_item(gpu_type, count), count)

    def _gpu_item(self, gpu_type: str, count: int) -> Mapping[str, Any]:
        """The ``gpuTypes`` item of ``gpu_type`` priced for ``count`` GPUs (ProviderError: unknown, too many)."""
        found = self.graphql.gpu_types(count, gpu_type)
        if not found:
            raise ProviderError("RunPod", f"unknown GPU type {gpu_type!r} (see the offers for valid ids)",
                                code="unknown-gpu-type")
        max_count = found[0].get("maxGpuCount")
        if isinstance(max_count, int) and max_count < count:
            raise ProviderError("RunPod", f"{gpu_type} pods have at most {max_count} GPUs, not {count}",
                                code="gpu-count")
        return found[0]

    # -- instances -----------------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        pods = self._call("GET", "/pods")
        return [self._instance(pod) for pod in pods or [] if isinstance(pod, dict) and pod.get("id")]

    def get(self, instance_id: str) -> Instance | None:
        path = f"/pods/{_segment(instance_id)}"
        response = self.http.request("GET", path, what=f"GET {path}")
        if response.status_code == 404:
            return None
        pod = self._check(response, f"GET {path}")
        return self._instance(pod) if isinstance(pod, dict) and pod.get("id") else None

    def _find_by_name(self, name: str) -> str | None:
        matches = [i for i in self.list_instances() if i.name == name and not i.gone]
        if len(matches) > 1:
            log.warning("%d RunPod pods are named %s; adopting %s", len(matches), name, matches[0].id)
        return matches[0].id if matches else None

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        extras = request.options_for(RunPodOptions)
        cloud = extras.cloud_type.upper()
        if cloud not in CLOUD_TYPES:
            raise ProviderError("RunPod", f"cloud type {extras.cloud_type!r} is not one of {sorted(CLOUD_TYPES)}",
                                code="cloud-type")
        if request.ssh_public_key:
            self.ensure_ssh_key(request.ssh_public_key)
        item = self._gpu_item(request.gpu_type, request.gpu_count)
        offer = offer_from(item, request.gpu_count)
        if request.spot:
            self._check_spot_price(request, offer)
        check_price_cap("RunPod", request, cloud_price(item, cloud, request.spot, request.gpu_count))
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
    def _check_spot_price(request: ProvisionRequest, offer: Offer) -> None:
        """REST rents interruptibly at the market's spot price and takes no bid: a user's bid is the ceiling,
        checked against RunPod's current minimum bid before anything is created."""
        market = offer.min_bid_per_gpu
        if market is None:
            raise NoCapacity("RunPod", f"no spot price for {request.gpu_type} now", code="no-capacity")
        if request.bid_per_gpu is not None and request.bid_per_gpu < market:
            raise NoCapacity("RunPod", f"the spot price of {request.gpu_type} is ${market}/GPU-hour now, above the "
                             f"bid of ${request.bid_per_gpu}", code="outbid")

    @staticmethod
    def _placeholder(pod_id: str, name: str, request: ProvisionRequest) -> Instance:
        return Instance("runpod", pod_id, name, "pending", "CREATED", gpu_count=request.gpu_count,
                        gpu_type=request.gpu_type, spot=request.spot)

    @staticmethod
    def _create_body(request: ProvisionRequest, extras: RunPodOptions, name: str, cloud: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name, "imageName": extras.image, "cloudType": cloud, "computeType": "GPU",
            "gpuTypeIds": [request.gpu_type], "gpuCount": request.gpu_count, "interruptible": request.spot,
            "supportPublicIp": True, "ports": ["22/tcp"], "volumeInGb": extras.volume_gb,
            "containerDiskInGb": extras.container_disk_gb, "volumeMountPath": "/workspace",
            "minVCPUPerGPU": 2, "minRAMPerGPU": 15, "env": dict(sorted(request.env.items())),
        }
        if request.region:
            body["dataCenterIds"] = [request.region]
        if extras.network_volume_id:
            body["networkVolumeId"] = extras.network_volume_id
        return body

    def _create(self, body: Mapping[str, Any], name: str) -> str:
        """One create call, retried only after checking that no pod got the name meanwhile (docs/providers.md)."""
        return self.http.retrying(lambda: self._create_once(body), adopt=lambda: self._find_by_name(name))

    def _create_once(self, body: Mapping[str, Any]) -> str:
        what = "POST /pods"
        pod = self._check(self.http.request_once("POST", "/pods", json=dict(body), what=what), what)
        if not isinstance(pod, dict) or not pod.get("id"):
            raise ProviderError("RunPod", f"{what} returned no pod", code="no-pod")
        return str(pod["id"])

    # -- lifecycle ---------------------------------------------------------------------------------

    def stop(self, instance_id: str) -> None:
        self._call("POST", f"/pods/{_segment(instance_id)}/stop")

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        """GraphQL ``podBidResume`` when ``bid_per_gpu`` is given (a spot pod needs one), else REST
        ``POST /pods/{id}/start`` (the pod comes back with the GPU count it was created with)."""
        if bid_per_gpu is not None:
            self.graphql.bid_resume(_segment(instance_id), bid_per_gpu, gpu_count)
            return
        pod = self.get(instance_id)
        if pod is not None and pod.spot:
            raise ProviderUnsupported("RunPod", f"{instance_id} is a spot pod: resume it with a bid per GPU",
                                      code="needs-bid")
        self._call("POST", f"/pods/{_segment(instance_id)}/start")

    def terminate(self, instance_id: str) -> None:
        current = self.get(instance_id)
        if current is None or current.gone:
            return
        path = f"/pods/{_segment(instance_id)}"
        response = self.http.request("DELETE", path, timeout_s=TERMINATE_TIMEOUT_S, what=f"DELETE {path}")
        if response.status_code != 404:
            self._check(response, f"DELETE {path}")

    # -- ssh keys (GraphQL) ------------------------------------------------------------------------------

    def ensure_ssh_key(self, public_key: str) -> str:
        """Append ``public_key`` to the account's ``pubKey`` list if missing (RunPod keeps one newline-joined
        string and gives keys no names); returns the key's gpuq label.  Keys reach only pods created later."""
        body = key_body(public_key)
        if len(body.split()) != 2:
            raise ProviderError("RunPod", "not an OpenSSH public key line", code="bad-key")
        lines = [line for line in self.graphql.pub_key().splitlines() if line.strip()]
        if not any(key_body(line) == body for line in lines):
            self.graphql.set_pub_key("\n".join([*lines, public_key.strip()]))
        return key_label(public_key)


def _conforms(provider: RunPodProvider) -> Provider:
    """Checked by mypy: RunPodProvider satisfies the Provider protocol."""
    return provider
