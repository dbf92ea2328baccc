"""The RunPod GraphQL calls gpuq still makes, for what RunPod's REST API has no equivalent of
(docs/providers.md, "RunPod: REST, and what stays on GraphQL"):

- ``gpuTypes`` (with ``lowestPrice``): GPU types, their on-demand prices and the current minimum spot
  bid: the offers, and the check of a GPU type and a spot ceiling before a create;
- ``myself { pubKey }`` and ``updateUserSettings``: the account's SSH public keys (REST has no user
  settings);
- ``podBidResume``: resuming a preempted spot pod with a new bid (REST ``/start`` takes no bid).

Transport rules (docs/providers.md): ``POST <url>`` with ``{"query": "<document>"}``, no GraphQL
variables; every value is written into the document as a literal by :func:`gql_literal` (strings
JSON-escaped, enums checked against an allow-list).  Errors arrive **with HTTP 200** as an ``errors``
array and are raised as ProviderError (``NoCapacity`` when the message says no instances are available).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from orchestrator.core.errors import NoCapacity, ProviderError
from orchestrator.providers.base import Offer, parse_money
from orchestrator.providers.transport import ApiTransport, json_object

CAPACITY_TEXT = "no longer any instances available"  # docs/providers.md [obs]
RENTED_CLOUD = "SECURE"  # the cloud a pod is created in unless RunPodOptions.cloud_type says otherwise
RESUME_FIELDS = "id desiredStatus"
_GPU_FIELDS = "id displayName memoryInGb maxGpuCount securePrice communityPrice secureSpotPrice communitySpotPrice"


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


def offer_from(item: Mapping[str, Any], count: int, cloud: str = RENTED_CLOUD) -> Offer:
    """One ``gpuTypes`` item priced for ``count`` GPUs in ``cloud``, the one gpuq rents in (``cloud_price``:
    on demand and spot).  Not ``lowestPrice.uninterruptablePrice``: that is the lowest across RunPod's clouds
    (often the community cloud's), not what a pod gpuq creates costs.  ``lowestPrice`` still says whether
    any are in stock, and its ``minimumBidPrice`` is the market a spot rental is checked against."""
    lowest = json_object(item.get("lowestPrice"))
    bid = parse_money(lowest.get("minimumBidPrice"))
    memory = item.get("memoryInGb")
    return Offer(
        provider="runpod",
        gpu_type=str(item["id"]),
        display_name=str(item.get("displayName") or item["id"]),
        gpu_count=count,
        price_per_hour=cloud_price(item, cloud, False, count),
        gpu_memory_gb=memory if isinstance(memory, int) else None,
        spot_price_per_hour=cloud_price(item, cloud, True, count),
        min_bid_per_gpu=bid,
        available=parse_money(lowest.get("uninterruptablePrice")) is not None or bid is not None,
    )


def cloud_price(item: Mapping[str, Any], cloud: str, spot: bool, count: int) -> Decimal | None:
    """What a pod of ``count`` GPUs of one ``gpuTypes`` item costs per hour in ``cloud`` (SECURE or
    COMMUNITY): its ``securePrice``/``communityPrice``, or for spot its ``secureSpotPrice``/
    ``communitySpotPrice`` (else the minimum bid), per GPU-hour times ``count``; None when not quoted."""
    prefix = cloud.lower()
    per_gpu = parse_money(item.get(f"{prefix}SpotPrice" if spot else f"{prefix}Price"))
    if per_gpu is None and spot:
        per_gpu = parse_money(json_object(item.get("lowestPrice")).get("minimumBidPrice"))
    return per_gpu * count if per_gpu is not None else None


class RunPodGraphQL:
    """The GraphQL half of a RunPod account (the calls listed in the module docstring)."""

    def __init__(self, http: ApiTransport) -> None:
        self.http = http

    def send(self, document: str, what: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """POST one document; returns ``data``.  Raises on HTTP errors and on ``errors`` with HTTP 200."""
        response = self.http.request("POST", "", json={"query": document}, timeout_s=timeout_s, what=what)
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

    def gpu_types(self, count: int, gpu_type: str | None = None) -> list[dict[str, Any]]:
        """``gpuTypes`` (all, or the one with id ``gpu_type``) with ``lowestPrice`` for ``count`` GPUs."""
        where = f"(input: {gql_literal({'id': gpu_type})}) " if gpu_type is not None else " "
        document = (f"query {{ gpuTypes{where}{{ {_GPU_FIELDS} "
                    f"lowestPrice(input: {gql_literal({'gpuCount': count})}) "
                    "{ minimumBidPrice uninterruptablePrice } } }")
        found = self.send(document, "gpuTypes").get("gpuTypes") or []
        return [item for item in found if isinstance(item, dict) and item.get("id")
                and (gpu_type is None or item.get("id") == gpu_type)]

    def pub_key(self) -> str:
        """The account's ``pubKey`` setting: its public keys, one newline-joined string."""
        me = self.send("query { myself { id pubKey } }", "myself.pubKey").get("myself") or {}
        return str(me.get("pubKey") or "")

    def set_pub_key(self, joined: str) -> None:
        document = f"mutation {{ updateUserSettings(input: {gql_literal({'pubKey': joined})}) {{ id }} }}"
        self.send(document, "updateUserSettings")

    def bid_resume(self, pod_id: str, bid_per_gpu: Decimal, gpu_count: int) -> None:
        """``podBidResume``: a stopped or preempted spot pod back on its host at ``bid_per_gpu``."""
        args = {"podId": pod_id, "bidPerGpu": bid_per_gpu, "gpuCount": gpu_count}
        self.send(f"mutation {{ podBidResume(input: {gql_literal(args)}) {{ {RESUME_FIELDS} }} }}", "podBidResume")
