"""The vast.ai adapter: the provider contract (tests/unit/test_providers_contract.py) run over it, against the
fake and against its recordings, with vast.ai's own answers where the contract's are RunPod's; and a check
that it sends only the requests and fields vast.ai's official client sends
(tests/fixtures/providers/vastai/client_requests.json, read from vast-ai/vast-cli).

Re-record the replays after an intended change to what the adapter sends:

    GPUQ_RECORD_PROVIDER_FIXTURES=1 python -m pytest tests/unit/test_provider_vastai.py
"""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from orchestrator.core.errors import CreateUnknown, ProvisioningFailed
from orchestrator.providers import vastai
from orchestrator.providers.base import classify
from orchestrator.providers.credentials import VASTAI, ApiKey
from orchestrator.providers.models import OfferQuery, ProvisionRequest
from orchestrator.providers.polling import PollPolicy
from tests.support.fakecloud.server import FakeCloud
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import CREATE_KEYS, OFFER_FIELDS, SEARCH_KEYS
from tests.unit import test_providers_contract as contract

KIND = "vastai"
KEY = "vast_CONTRACT0TEST0KEY0do0not0leak0f7a8"
PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIVastAmbiguousCreateTestKey0000 t"
CLIENT = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "providers" / KIND / "client_requests.json")
                    .read_text(encoding="utf-8"))
_ID = re.compile(r"/\d+/")


def op_name(method: str, path: str) -> str:
    """``METHOD /path/`` with ids as ``{id}`` (the fixture's form)."""
    while _ID.search(path):
        path = _ID.sub("/{id}/", path)
    return f"{method} {path}"


class Counting(contract.Counting):
    def op(self, request: httpx.Request) -> str:
        return op_name(request.method, request.url.path)


class TestVastAIContract(contract.ProviderContract):
    """The shared contract with vast.ai's answers; the tests overridden here are those whose answer is its own."""

    kind = KIND
    key = KEY
    env_var = "VAST_API_KEY"
    gpu_type = "RTX 4090"
    ssh_user = "root"
    create_op = "PUT /api/v0/asks/{id}/"
    key_writes = ("POST /api/v0/ssh/",)
    real_url = VASTAI.default_url

    def fake(self, key: str) -> FakeCloud:
        return FakeVastAI(api_key=key)

    def adapter(self, api_key: ApiKey, **common: Any) -> Any:
        return vastai.VastAIProvider(api_key, policy=dataclasses.replace(vastai.RETRY, jitter=0.0), **common)

    def counting(self, inner: httpx.BaseTransport) -> contract.Counting:
        return Counting(inner, "")

    def test_stop_is_a_manual_stop_or_unsupported(self, cloud: contract.Cloud) -> None:
        instance = contract.ready_instance(cloud, "gpuq-stop")
        cloud.provider.stop(instance.id)
        stopped = cloud.provider.get(instance.id)
        assert stopped is not None and stopped.state == "stopped" and not stopped.ready
        assert classify(stopped) == "manual_stop"
        assert cloud.provider.capabilities.stop_bills_storage, "a stopped vast.ai instance still bills its disk"

    def test_resume_with_zero_gpus_is_a_host_failure(self, cloud: contract.Cloud) -> None:
        """vast.ai has no zero-GPU resume; its counterpart: a stopped instance waits for its own GPU (VAST3)."""
        instance = contract.ready_instance(cloud, "gpuq-zero")
        cloud.provider.stop(instance.id)
        cloud.inject("gpu_taken", instance.id)
        cloud.provider.resume(instance.id, gpu_count=1)
        waiting = cloud.provider.get(instance.id)
        assert waiting is not None and classify(waiting) == "pending" and "GPU" in waiting.reason
        with pytest.raises(ProvisioningFailed) as caught:
            cloud.provider.wait_ready(instance.id, timeout_s=30)
        assert caught.value.code == "stuck_provisioning"

    def test_ssh_key_registration_is_append_only_and_idempotent(self, cloud: contract.Cloud) -> None:
        first = cloud.provider.ensure_ssh_key(contract.PUBLIC_KEY)
        again = cloud.provider.ensure_ssh_key(contract.PUBLIC_KEY + "  ")
        assert first == again and first.startswith("gpuq-")
        assert cloud.ops("POST /api/v0/ssh/") == 1
        assert [k.ssh_key for k in cloud.provider.list_ssh_keys()] == [contract.PUBLIC_KEY]


# -- only what vast.ai's client sends -------------------------------------------------------------------------


class Capture(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport(verify=False)
        self.seen: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        return self.inner.handle_request(request)


def lifecycle(provider: vastai.VastAIProvider, cloud: FakeVastAI) -> None:
    """Every operation gpuq uses, on demand and interruptible."""
    assert provider.list_offers(OfferQuery()) and provider.list_offers(
        OfferQuery(gpu_count=2, gpu_name="H100 SXM", min_gpu_memory_gb=80, spot=True))
    key = contract.PUBLIC_KEY
    [demand] = provider.provision(ProvisionRequest("gpuq-demand", "RTX A6000", ssh_public_key=key))
    [spot] = provider.provision(ProvisionRequest("gpuq-spot", "RTX 4090", spot=True, region="US", ssh_public_key=key,
                                                 options=vastai.VastOptions(disk_gb=80)))
    for made in (demand, spot):
        provider.wait_ready(made.id)
    provider.stop(demand.id)
    provider.resume(demand.id)
    cloud.preempt(spot.id)
    provider.resume(spot.id, gpu_count=1, bid_per_gpu=Decimal("0.5"))
    provider.wait_ready(spot.id)
    assert len(provider.list_instances()) == 2
    for made in (demand, spot):
        provider.terminate(made.id)
        provider.wait_gone(made.id)


def test_the_adapter_sends_only_what_the_vast_cli_client_sends() -> None:
    allowed = {f"{r['method']} {r['path']}": r for r in CLIENT["requests"]}
    search = CLIENT["search"]
    capture = Capture()
    with FakeVastAI(api_key=KEY) as cloud:
        provider = vastai.VastAIProvider(ApiKey(KEY, "VAST_API_KEY"), url=cloud.url, transport=capture,
                                         min_interval_s=0.0, sleep=lambda s: None,
                                         ready=PollPolicy(10, 0.0, 0.0), gone=PollPolicy(10, 0.0, 0.0))
        try:
            lifecycle(provider, cloud)
        finally:
            provider.close()
    used = set()
    for request in capture.seen:
        name = op_name(request.method, request.url.path)
        assert name in allowed, f"{name}: a request vast-cli never sends"
        spec = allowed[name]
        used.add(name)
        assert request.headers["authorization"] == f"Bearer {KEY}"
        query = parse_qs(request.url.query.decode())
        assert "api_key" not in query and set(query) <= set(spec["query"]), (name, sorted(query))
        for param, values in spec.get("fixed_query", {}).items():
            assert query.get(param) and query[param][0] in values, (name, param)
        body = json.loads(request.content) if request.content else None
        if spec["body"] is None or body is None:
            assert body is None and not spec["body"], f"{name}: a body where the client sends none, or none"
        elif spec["body"] == "search":
            assert isinstance(body, dict) and body["type"] in search["type"]
            fields = set(body) - set(search["keys"])
            assert fields <= set(search["fields"]), sorted(fields - set(search["fields"]))
            assert all(set(cond) <= set(search["operators"]) for f, cond in body.items() if f in fields)
        else:
            assert isinstance(body, dict), f"{name} carries no JSON object"
            assert set(body) <= set(spec["body"]), (name, sorted(set(body) - set(spec["body"])))
            for key, values in spec.get("fixed", {}).items():
                assert key not in body or body[key] in values, (name, key, body[key])
    assert used == set(allowed), f"never exercised: {sorted(set(allowed) - used)}"


def test_the_fake_refuses_what_the_client_does_not_send() -> None:
    """The fake's idea of the client is the fixture's (one source of truth for both sides)."""
    search = CLIENT["search"]
    create = next(r for r in CLIENT["requests"] if r["path"] == "/api/v0/asks/{id}/")
    assert set(search["fields"]) == OFFER_FIELDS and set(search["keys"]) == SEARCH_KEYS
    assert set(create["body"]) == CREATE_KEYS
    with FakeVastAI(api_key=KEY) as cloud, httpx.Client(base_url=cloud.url,
                                                        headers={"Authorization": f"Bearer {KEY}"}) as http:
        bad = http.post("/api/v0/bundles/", json={"type": "on-demand", "gpu_model": {"eq": "RTX 4090"}})
        assert bad.status_code == 400 and "gpu_model" in bad.json()["msg"]
        bad = http.put("/api/v0/asks/5001/", json={"client_id": "me", "image": "x", "ssh_keys": []})
        assert bad.status_code == 400 and bad.json()["success"] is False
        assert http.get("/api/v0/ssh/", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_an_ambiguous_create_is_never_repeated_on_the_next_offer() -> None:
    """A rent that made the machine but answered 500, while the listing lags: no second machine (issue 38)."""
    with FakeVastAI(api_key=KEY) as cloud:
        provider = vastai.VastAIProvider(ApiKey(KEY, "VAST_API_KEY"), url=cloud.url, min_interval_s=0.0,
                                         sleep=lambda s: None)
        cloud.fail_after_create(1, status=500, listing_lag_s=3600.0)
        try:
            with pytest.raises(CreateUnknown, match="no instance carries its name yet"):
                provider.provision(ProvisionRequest("gpuq-0000beef-cafe01", "RTX 4090", ssh_public_key=PUBLIC))
        finally:
            provider.close()
        assert len(cloud.instances) == 1 and [i.label for i in cloud.instances.values()] == ["gpuq-0000beef-cafe01"]
