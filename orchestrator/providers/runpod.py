"""RunPod over its GraphQL API (docs/providers.md): pods on demand and on spot (bids), lifecycle, prices.

Transport rules (docs/providers.md): ``POST <url>`` with ``{"query": "<document>"}``, no GraphQL
variables; every value is written into the document as a literal by :func:`gql_literal` (strings
JSON-escaped, enums checked against an allow-list).  Errors arrive **with HTTP 200** as an ``errors``
array and are raised as ProviderError (``NoCapacity`` when the message says no instances are available).

Readiness (docs/providers.md, API half): ``desiredStatus == RUNNING`` and ``runtime.ports`` holds a
public tcp mapping of port 22; the SSH endpoint is that mapping's ``ip``/``publicPort`` (it changes on
every start or resume).  Classification of EXITED pods uses ``lastStatusChange`` (:func:`base.classify`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import httpx

from orchestrator.errors import NoCapacity, ProviderError, ProviderUnsupported
from orchestrator.providers.base import (
    Instance,
    InstanceState,
    Offer,
    PollPolicy,
    Provider,
    ProvisionRequest,
    parse_money,
    poll_until_gone,
    poll_until_ready,
)
from orchestrator.providers.credentials import RUNPOD, ApiKey, load_key, load_url
from orchestrator.providers.transport import TERMINATE_TIMEOUT_S, ApiTransport, RetryPolicy, json_object

log = logging.getLogger("orchestrator.providers.runpod")

# RunPod (docs/providers.md): 1 s doubling to 60 s, at most 6 tries; 2 requests per second per account.
RETRY = RetryPolicy(tries=6, first_delay_s=1.0, max_delay_s=60.0)
MIN_INTERVAL_S = 0.5
READY = PollPolicy(timeout_s=1200.0, first_s=5.0, max_s=15.0)
GONE = PollPolicy(timeout_s=300.0, first_s=5.0, max_s=15.0)

CAPACITY_TEXT = "no longer any instances available"  # docs/providers.md [obs]
CLOUD_TYPES = frozenset({"ALL", "COMMUNITY", "SECURE"})
SPOT_POD_TYPES = frozenset({"INTERRUPTABLE", "BID"})
SSH_USER = "root"

_STATES: dict[str, InstanceState] = {
    "RUNNING": "running", "EXITED": "exited", "TERMINATED": "terminated",
    "CREATED": "pending", "RESTARTING": "pending", "PAUSED": "pending",
}

POD_FIELDS = ("id name desiredStatus lastStatusChange podType imageName gpuCount costPerHr machineId "
              "machine { gpuDisplayName podHostId } "
              "runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } gpus { id } }")
CREATE_FIELDS = "id desiredStatus imageName env machineId machine { podHostId }"


class Enum(str):
    """A GraphQL enum value: written unquoted, after an allow-list check by the caller."""


_NAME = re.compile(r"^[_A-Za-z][_0-9A-Za-z]*$")


def gql_literal(value: object) -> str:
    """``value`` as a GraphQL input literal.  Strings use JSON escaping (a valid GraphQL string);
    mapping keys and enum values must be GraphQL names."""
    if value is None:
        return "null"
    if isinstance(value, Enum):
        if not _NAME.match(value):
            raise ValueError(f"not a GraphQL enum value: {value!r}")
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError("non-finite number")
        return format(value, "f")
    if isinstance(value, float):
        return gql_literal(Decimal(repr(value)))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(gql_literal(item) for item in value) + "]"
    if isinstance(value, Mapping):
        parts = []
        for key, item in value.items():
            if not isinstance(key, str) or not _NAME.match(key):
                raise ValueError(f"not a GraphQL field name: {key!r}")
            parts.append(f"{key}: {gql_literal(item)}")
        return "{" + ", ".join(parts) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as a GraphQL literal")


def ssh_endpoint(runtime: object) -> tuple[str, int] | None:
    """The public tcp mapping of port 22 in ``runtime.ports``, or None (not ready)."""
    if not isinstance(runtime, dict):
        return None
    for port in runtime.get("ports") or []:
        if not isinstance(port, dict):
            continue
        if port.get("privatePort") == 22 and port.get("isIpPublic") is True and port.get("type") == "tcp":
            ip, public = port.get("ip"), port.get("publicPort")
            if isinstance(ip, str) and ip and isinstance(public, int) and public > 0:
                return ip, public
    return None


def pod_to_instance(pod: Mapping[str, Any]) -> Instance:
    """One pod object (the POD_FIELDS selection) → Instance.  Unknown statuses count as pending."""
    raw = str(pod.get("desiredStatus") or "")
    state = _STATES.get(raw)
    if state is None:
        log.warning("pod %s has an unknown desiredStatus %r; treating it as not ready", pod.get("id"), raw)
        state = "pending"
    endpoint = ssh_endpoint(pod.get("runtime")) if state == "running" else None
    machine = json_object(pod.get("machine"))
    uptime = json_object(pod.get("runtime")).get("uptimeInSeconds")
    gpu_count = pod.get("gpuCount")
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
        gpu_count=gpu_count if isinstance(gpu_count, int) and not isinstance(gpu_count, bool) else None,
        gpu_type=str(machine.get("gpuDisplayName")) if machine.get("gpuDisplayName") else None,
        spot=str(pod.get("podType") or "") in SPOT_POD_TYPES,
        region=None,
        reason=str(pod.get("lastStatusChange") or ""),
        uptime_s=float(uptime) if isinstance(uptime, int | float) and not isinstance(uptime, bool) else None,
    )


def key_body(public_key: str) -> str:
    """``type base64`` of an OpenSSH public key line (the comment does not identify a key)."""
    return " ".join(public_key.split()[:2])


def key_label(public_key: str) -> str:
    return "gpuq-" + hashlib.sha256(key_body(public_key).encode()).hexdigest()[:12]


class RunPodProvider:
    """:class:`orchestrator.providers.base.Provider` for RunPod (GraphQL)."""

    name = "runpod"
    supports_stop = True
    supports_spot = True

    def __init__(
        self,
        key: ApiKey,
        *,
        url: str = RUNPOD.default_url,
        transport: httpx.BaseTransport | None = None,
        policy: RetryPolicy = RETRY,
        min_interval_s: float = MIN_INTERVAL_S,
        ready: PollPolicy = READY,
        gone: PollPolicy = GONE,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.http = ApiTransport(RUNPOD, url, key, policy=policy, min_interval_s=min_interval_s,
                                 transport=transport, sleep=sleep, clock=clock, rng=rng)
        self.ready_policy = ready
        self.gone_policy = gone

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: Any) -> RunPodProvider:
        """Key and URL from the environment or the keys file (credentials.py)."""
        return cls(load_key(RUNPOD, env), url=load_url(RUNPOD, env), **options)

    def __repr__(self) -> str:
        return f"RunPodProvider({self.http.base_url}, key {self.http.key!r})"

    def close(self) -> None:
        self.http.close()

    # -- GraphQL --------------------------------------------------------------------------------

    def _send(self, document: str, what: str, *, once: bool = False, timeout_s: float | None = None) -> dict[str, Any]:
        """POST one document; returns ``data``.  Raises on HTTP errors and on ``errors`` with HTTP 200."""
        payload = {"query": document}
        if once:
            response = self.http.request_once("POST", "", json=payload, timeout_s=timeout_s, what=what)
        else:
            response = self.http.request("POST", "", json=payload, timeout_s=timeout_s, what=what)
        body = self.http.json_body(response)
        if response.status_code == 403:
            raise self.http.auth_error(403, self.http.scrub(response.text, 200))
        errors = body.get("errors") if isinstance(body, dict) else None
        if errors:
            first = errors[0] if isinstance(errors, list) and errors else errors
            message = first.get("message") if isinstance(first, dict) else first
            text = self.http.scrub(str(message or "unspecified error"))
            if CAPACITY_TEXT in text.lower():
                raise NoCapacity("RunPod", f"{what}: {text}", code="no-capacity", status=response.status_code)
            raise ProviderError("RunPod", f"{what}: {text}", code="graphql", status=response.status_code)
        if response.status_code != 200:
            text = self.http.scrub(response.text, 200)
            if CAPACITY_TEXT in text.lower():
                raise NoCapacity("RunPod", f"{what}: {text}", code="no-capacity", status=response.status_code)
            raise ProviderError("RunPod", f"{what}: HTTP {response.status_code}: {text}",
                                code=str(response.status_code), status=response.status_code)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise ProviderError("RunPod", f"{what}: the response has no data", code="no-data")
        return data

    # -- offers ----------------------------------------------------------------------------------

    def list_offers(self, gpu_count: int | None = None) -> list[Offer]:
        """Every GPU type with at least ``gpu_count`` GPUs per pod (default 1), priced for that many.

        Prices: ``lowestPrice.uninterruptablePrice`` (else ``securePrice``) and ``minimumBidPrice``, both
        taken as dollars per GPU-hour and multiplied by ``gpu_count``.
        """
        count = gpu_count or 1
        document = ("query { gpuTypes { id displayName memoryInGb maxGpuCount securePrice communityPrice "
                    "secureSpotPrice communitySpotPrice "
                    f"lowestPrice(input: {gql_literal({'gpuCount': count})}) "
                    "{ minimumBidPrice uninterruptablePrice } } }")
        types = self._send(document, "gpuTypes").get("gpuTypes") or []
        offers: list[Offer] = []
        for item in types:
            if not isinstance(item, dict) or not item.get("id"):
                continue
            max_count = item.get("maxGpuCount")
            if isinstance(max_count, int) and max_count < count:
                continue
            offers.append(self._offer(item, count))
        return offers

    @staticmethod
    def _offer(item: Mapping[str, Any], count: int) -> Offer:
        lowest = json_object(item.get("lowestPrice"))
        per_gpu = parse_money(lowest.get("uninterruptablePrice"))
        if per_gpu is None:
            per_gpu = parse_money(item.get("securePrice")) or parse_money(item.get("communityPrice"))
        bid = parse_money(lowest.get("minimumBidPrice"))
        memory = item.get("memoryInGb")
        return Offer(
            provider="runpod",
            gpu_type=str(item["id"]),
            display_name=str(item.get("displayName") or item["id"]),
            gpu_count=count,
            price_per_hour=per_gpu * count if per_gpu is not None else None,
            gpu_memory_gb=memory if isinstance(memory, int) else None,
            spot_price_per_hour=bid * count if bid is not None else None,
            min_bid_per_gpu=bid,
            available=parse_money(lowest.get("uninterruptablePrice")) is not None or bid is not None,
        )

    def _gpu_type(self, gpu_type: str, count: int) -> Offer:
        document = (f"query {{ gpuTypes(input: {gql_literal({'id': gpu_type})}) {{ id displayName memoryInGb "
                    f"maxGpuCount securePrice communityPrice lowestPrice(input: {gql_literal({'gpuCount': count})}) "
                    "{ minimumBidPrice uninterruptablePrice } } }")
        types = [t for t in self._send(document, "gpuTypes").get("gpuTypes") or []
                 if isinstance(t, dict) and t.get("id") == gpu_type]
        if not types:
            raise ProviderError("RunPod", f"unknown GPU type {gpu_type!r} (see the offers for valid ids)",
                                code="unknown-gpu-type")
        max_count = types[0].get("maxGpuCount")
        if isinstance(max_count, int) and max_count < count:
            raise ProviderError("RunPod", f"{gpu_type} pods have at most {max_count} GPUs, not {count}",
                                code="gpu-count")
        return self._offer(types[0], count)

    # -- instances ----------------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        pods = (self._send(f"query {{ myself {{ pods {{ {POD_FIELDS} }} }} }}", "myself.pods").get("myself")
                or {}).get("pods") or []
        return [pod_to_instance(pod) for pod in pods if isinstance(pod, dict) and pod.get("id")]

    def get(self, instance_id: str) -> Instance | None:
        document = f"query {{ pod(input: {gql_literal({'podId': instance_id})}) {{ {POD_FIELDS} }} }}"
        pod = self._send(document, "pod").get("pod")
        return pod_to_instance(pod) if isinstance(pod, dict) and pod.get("id") else None

    def _find_by_name(self, name: str) -> str | None:
        matches = [i for i in self.list_instances() if i.name == name and not i.gone]
        if len(matches) > 1:
            log.warning("%d RunPod pods are named %s; adopting %s", len(matches), name, matches[0].id)
        return matches[0].id if matches else None

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        cloud = request.cloud_type.upper()
        if cloud not in CLOUD_TYPES:
            raise ProviderError("RunPod", f"cloud type {request.cloud_type!r} is not one of {sorted(CLOUD_TYPES)}",
                                code="cloud-type")
        if request.ssh_public_key:
            self.ensure_ssh_key(request.ssh_public_key)
        offer = self._gpu_type(request.gpu_type, request.gpu_count)
        bid: Decimal | None = None
        if request.spot:
            bid = request.bid_per_gpu
            if bid is None:
                if offer.min_bid_per_gpu is None:
                    raise NoCapacity("RunPod", f"no spot price for {request.gpu_type} now", code="no-capacity")
                bid = offer.min_bid_per_gpu + request.bid_margin
        existing = {i.name: i.id for i in self.list_instances() if not i.gone}
        ids: list[str] = []
        for name in request.names():
            if name in existing:
                log.info("adopting RunPod pod %s already named %s", existing[name], name)
                pod_id = existing[name]
            else:
                document = self._create_document(request, name, Enum(cloud), bid)
                what = "podRentInterruptable" if request.spot else "podFindAndDeployOnDemand"
                pod_id = self._create(document, what, name)
            ids.append(pod_id)
            if on_created is not None:
                on_created(name, pod_id)
        return [self.get(pod_id) or self._placeholder(pod_id, name, request)
                for pod_id, name in zip(ids, request.names(), strict=True)]

    @staticmethod
    def _placeholder(pod_id: str, name: str, request: ProvisionRequest) -> Instance:
        return Instance("runpod", pod_id, name, "pending", "CREATED", gpu_count=request.gpu_count,
                        gpu_type=request.gpu_type, spot=request.spot)

    def _create_document(self, request: ProvisionRequest, name: str, cloud: Enum, bid: Decimal | None) -> str:
        fields: dict[str, object] = {
            "name": name, "imageName": request.image, "cloudType": cloud, "gpuTypeId": request.gpu_type,
            "gpuCount": request.gpu_count,
        }
        if bid is not None:
            fields["bidPerGpu"] = bid
        fields.update({
            "startSsh": True, "supportPublicIp": True, "ports": "22/tcp", "volumeInGb": request.volume_gb,
            "containerDiskInGb": request.container_disk_gb, "volumeMountPath": "/workspace",
            "minVcpuCount": 2, "minMemoryInGb": 15, "dataCenterId": request.region,
        })
        if request.network_volume_id:
            fields["networkVolumeId"] = request.network_volume_id
        fields["env"] = [{"key": key, "value": value} for key, value in sorted(request.env.items())]
        if bid is not None:
            return f"mutation {{ podRentInterruptable(input: {gql_literal(fields)}) {{ {CREATE_FIELDS} }} }}"
        return f"mutation {{ podFindAndDeployOnDemand(input: {gql_literal(fields)}) {{ {CREATE_FIELDS} }} }}"

    def _create(self, document: str, what: str, name: str) -> str:
        """One create call, retried only after checking that no pod got the name meanwhile (docs/providers.md)."""
        return self.http.retrying(lambda: self._create_once(document, what), adopt=lambda: self._find_by_name(name))

    def _create_once(self, document: str, what: str) -> str:
        pod = self._send(document, what, once=True).get(what)
        if not isinstance(pod, dict) or not pod.get("id"):
            raise ProviderError("RunPod", f"{what} returned no pod", code="no-pod")
        return str(pod["id"])

    def wait_ready(self, instance_id: str, *, timeout_s: float | None = None) -> Instance:
        policy = self.ready_policy if timeout_s is None else PollPolicy(timeout_s, self.ready_policy.first_s,
                                                                        self.ready_policy.max_s)
        return poll_until_ready("RunPod", instance_id, self.get, policy, sleep=self.http.sleep, clock=self.http.clock)

    def wait_gone(self, instance_id: str, *, timeout_s: float | None = None) -> None:
        policy = self.gone_policy if timeout_s is None else PollPolicy(timeout_s, self.gone_policy.first_s,
                                                                      self.gone_policy.max_s)
        poll_until_gone("RunPod", instance_id, self.get, policy, sleep=self.http.sleep, clock=self.http.clock)

    # -- lifecycle ---------------------------------------------------------------------------------

    def stop(self, instance_id: str) -> None:
        document = f"mutation {{ podStop(input: {gql_literal({'podId': instance_id})}) {{ id desiredStatus }} }}"
        self._send(document, "podStop")

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        """``podBidResume`` when ``bid_per_gpu`` is given (a spot pod needs one), else ``podResume``."""
        if bid_per_gpu is None:
            pod = self.get(instance_id)
            if pod is not None and pod.spot:
                raise ProviderUnsupported("RunPod", f"{instance_id} is a spot pod: resume it with a bid per GPU",
                                          code="needs-bid")
            args: dict[str, object] = {"podId": instance_id, "gpuCount": gpu_count}
            op = "podResume"
        else:
            args = {"podId": instance_id, "bidPerGpu": bid_per_gpu, "gpuCount": gpu_count}
            op = "podBidResume"
        self._send(f"mutation {{ {op}(input: {gql_literal(args)}) {{ {CREATE_FIELDS} }} }}", op)

    def terminate(self, instance_id: str) -> None:
        current = self.get(instance_id)
        if current is None or current.gone:
            return
        document = f"mutation {{ podTerminate(input: {gql_literal({'podId': instance_id})}) }}"
        self._send(document, "podTerminate", timeout_s=TERMINATE_TIMEOUT_S)

    # -- ssh keys ------------------------------------------------------------------------------------

    def ensure_ssh_key(self, public_key: str) -> str:
        """Append ``public_key`` to the account's ``pubKey`` list if missing (RunPod keeps one newline-joined
        string and gives keys no names); returns the key's gpuq label.  Keys reach only pods created later."""
        body = key_body(public_key)
        if len(body.split()) != 2:
            raise ProviderError("RunPod", "not an OpenSSH public key line", code="bad-key")
        me = self._send("query { myself { id pubKey } }", "myself.pubKey").get("myself") or {}
        current = str(me.get("pubKey") or "")
        lines = [line for line in current.splitlines() if line.strip()]
        if any(key_body(line) == body for line in lines):
            return key_label(public_key)
        joined = "\n".join([*lines, public_key.strip()])
        document = f"mutation {{ updateUserSettings(input: {gql_literal({'pubKey': joined})}) {{ id }} }}"
        self._send(document, "updateUserSettings")
        return key_label(public_key)


def _conforms(provider: RunPodProvider) -> Provider:
    """Checked by mypy: RunPodProvider satisfies the Provider protocol."""
    return provider
