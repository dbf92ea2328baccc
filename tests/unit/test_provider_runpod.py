"""RunPod's REST API v2 adapter piece by piece (orchestrator/providers/runpod.py, runpod_wire.py): what a pod's
answer says (its SSH address an IP address only), the catalog's prices, the create body, the errors, spot
refused everywhere.  httpx MockTransports speaking the v2 document's shapes; the fake's exchanges are checked
against the document itself in test_providers_published_schema.py."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.core.errors import NoCapacity, ProviderError, ProviderUnsupported
from orchestrator.ledger import Ledger
from orchestrator.providers import runpod
from orchestrator.providers import runpod_wire as wire
from orchestrator.providers.base import classify
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.models import OfferQuery, ProvisionRequest
from tests.conftest import run_gpuq

KEY = "rpa_V2UNIT0TEST0KEY0never0shown0q1w2"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRunPodV2UnitTestKeyOnly00000000000000000 gpuq@test"
DIRECT = {"host": "195.26.233.3", "port": 34446, "username": "root", "command": "ssh root@195.26.233.3 -p 34446"}
POD: dict[str, Any] = {
    "id": "7h9k2m4n6p", "name": "gpuq-x", "status": "RUNNING", "actions": ["stop"], "gpu": {"id": "NVIDIA RTX A6000",
    "count": 2}, "cloud": "SECURE", "dataCenterId": "US-KS-2", "cost": 1.58, "ssh": {"proxy": None, "direct": DIRECT},
    "runtime": {"uptime": 90, "gpus": [{"id": "g0"}, {"id": "g1"}]}, "startedAt": "2026-06-01T12:02:00Z"}
GPU = {"id": "NVIDIA RTX A6000", "name": "RTX A6000", "memory": 48, "secure": True, "community": True,
       "price": {"secure": 0.79, "community": 0.49}, "maxCount": {"secure": 8, "community": 4}, "availability": "HIGH",
       "dataCenters": [{"id": "US-KS-2", "name": "US Kansas 2", "availability": "HIGH"},
                       {"id": "EU-RO-1", "name": "EU Romania 1", "availability": "NONE"}]}


def pod(**changes: Any) -> wire.WirePod:
    return wire.WirePod.model_validate({**POD, **changes})


def runpod_with(answer: Any) -> runpod.RunPodProvider:
    return runpod.RunPodProvider(ApiKey(KEY, "RUNPOD_API_KEY"), transport=httpx.MockTransport(answer),
                                 min_interval_s=0, sleep=lambda _s: None, clock=lambda: 0.0)


def test_a_running_pod_is_ready_at_its_direct_ssh_ip_and_port() -> None:
    made = wire.instance_of(pod())
    assert made.ready and (made.ssh_host, made.ssh_port, made.ssh_user) == ("195.26.233.3", 34446, "root")
    assert made.gpu_count == 2 and made.price_per_hour == Decimal("1.58") and not made.spot
    assert made.region == "US-KS-2" and made.uptime_s == 90.0 and classify(made) == "running"
    assert not wire.instance_of(pod(ssh={"proxy": None, "direct": None})).ready  # no 22/tcp mapping yet


@pytest.mark.parametrize("host", [
    "h:1 -oProxyCommand=touch${IFS}X x",  # issue 43: with `Host * ProxyCommand ssh -W %h:%p bastion` it ran
    "-oProxyCommand=touch /tmp/x", "ssh.runpod.io", "evil.example", "1.2.3.4 -p 22", "1.2.3.4\n", "",
])
def test_an_ssh_host_that_is_not_an_ip_address_is_never_an_endpoint(host: str) -> None:
    made = wire.instance_of(pod(ssh={"proxy": None, "direct": {**DIRECT, "host": host}}))
    assert not made.ready and made.ssh_host is None and classify(made) == "pending"


def test_the_ssh_port_and_user_are_bounded() -> None:
    assert not wire.instance_of(pod(ssh={"proxy": None, "direct": {**DIRECT, "port": 0}})).ready
    with pytest.raises(ProviderError, match="unexpected answer"):
        wire.parse(wire.WirePod, {**POD, "ssh": {"direct": {**DIRECT, "port": 70000}}}, "GET /pods/p")
    odd_user = wire.instance_of(pod(ssh={"proxy": None, "direct": {**DIRECT, "username": "-oX root"}}))
    assert odd_user.ssh_user == "root"  # not the API's word: the default user


@pytest.mark.parametrize(("status", "state", "verdict"), [
    ("PROVISIONING", "pending", "pending"), ("STARTING", "pending", "pending"),
    ("EXITED", "stopped", "manual_stop"), ("ERROR", "unhealthy", "host_failure"),
    ("TERMINATED", "terminated", "host_failure"), ("SOMETHING_NEW", "pending", "unknown"),
])
def test_statuses(status: str, state: str, verdict: str) -> None:
    made = wire.instance_of(pod(status=status))
    assert made.state == state and classify(made) == verdict and not made.ready


def test_a_pod_started_without_its_gpus_is_a_host_failure() -> None:
    back = wire.instance_of(pod(runtime={"uptime": 3, "gpus": []}))
    assert back.gpu_count == 0 and classify(back) == "host_failure"
    assert wire.instance_of(pod(runtime=None)).gpu_count == 2  # not running yet: what it was created with


def test_text_from_the_api_is_one_printable_line() -> None:
    made = wire.instance_of(pod(name="gpuq-x\x1b[2J\nrm -rf /", status="RUNNING"))
    assert "\x1b" not in made.name and "\n" not in made.name


def test_offers_quote_the_secure_list_price_times_the_gpus_and_the_data_centres_with_stock() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"gpus": [GPU, {**GPU, "id": "NVIDIA B200", "maxCount": {"secure": 1,
                                                                                                "community": 1}}]})

    [offer] = runpod_with(answer).list_offers(OfferQuery(gpu_count=2))
    assert offer.price_per_hour == Decimal("1.58") and offer.spot_price_per_hour is None
    assert offer.min_bid_per_gpu is None and offer.regions == ("US-KS-2",) and offer.available
    assert offer.gpu_memory_gb == 48
    assert seen[0].url.path == "/v2/catalog/gpus"
    assert dict(seen[0].url.params) == {"include": "AVAILABILITY", "product": "POD", "count": "2", "cloud": "SECURE"}
    gone = wire.offer_of(wire.WireGpuType.model_validate({**GPU, "availability": "NONE", "dataCenters": None}), 1)
    assert not gone.available and gone.regions == ()
    unpriced = wire.WireGpuType.model_validate({**GPU, "secure": False})
    assert wire.cloud_price(unpriced, "SECURE", 1) is None  # not offered in the Secure cloud: no price


def test_the_create_body_is_a_v2_create_pod_request() -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v2/account/ssh-keys":
            if request.method == "PUT":
                sent.append({"keys": json.loads(request.content)})
            return httpx.Response(200, json={"keys": ["ssh-rsa AAAAold me"]})
        if path == "/v2/catalog/gpus":
            return httpx.Response(200, json={"gpus": [GPU]})
        if path == "/v2/pods" and request.method == "GET":
            return httpx.Response(200, json={"pods": []})
        if path == "/v2/pods":
            sent.append(json.loads(request.content))
            return httpx.Response(201, json={**POD, "status": "PROVISIONING", "ssh": {"proxy": None, "direct": None}})
        return httpx.Response(200, json={**POD, "status": "PROVISIONING"})

    runpod_with(answer).provision(ProvisionRequest("gpuq-c", "NVIDIA RTX A6000", gpu_count=2, region="US-KS-2",
                                                   ssh_public_key=PUBLIC_KEY, env={"B": "2", "A": "1"}))
    keys, body = sent
    assert keys == {"keys": {"keys": ["ssh-rsa AAAAold me", PUBLIC_KEY]}}  # the set replaced, the old key kept
    assert body == {"name": "gpuq-c", "image": runpod.RunPodOptions.image, "cloud": "SECURE",
                    "gpu": {"id": "NVIDIA RTX A6000", "count": 2}, "disk": 40,
                    "mounts": {"persistent": {"size": 40, "path": "/workspace"}}, "ports": ["22/tcp"],
                    "startSsh": True, "env": {"A": "1", "B": "2"}, "dataCenterIds": ["US-KS-2"]}


def test_spot_is_refused_before_anything_is_sent_and_a_resume_never_bids() -> None:
    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    with pytest.raises(ProviderUnsupported, match=r"vast\.ai is gpuq's spot market"):
        runpod_with(never).provision(ProvisionRequest("gpuq-s", "NVIDIA RTX A6000", spot=True))
    with pytest.raises(ProviderUnsupported, match="no spot pods"):
        runpod_with(never).resume("p1", gpu_count=1, bid_per_gpu=Decimal("0.3"))
    assert not runpod.RunPodProvider.capabilities.spot and not runpod.RunPodProvider.capabilities.rebid


def test_problem_answers_are_quoted_scrubbed_and_a_400_create_or_start_is_no_capacity() -> None:
    def full(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"title": "Bad Request", "status": 400, "detail": "no capacity here"})

    with pytest.raises(NoCapacity, match="no capacity here"):
        runpod_with(full).resume("p1")

    def invalid(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"title": "Conflict", "status": 409, "detail": f"not now {KEY}"})

    with pytest.raises(ProviderError, match=r"HTTP 409: not now \*\*\*") as caught:
        runpod_with(invalid).stop("p1")
    assert KEY not in str(caught.value) and not isinstance(caught.value, NoCapacity)
    with pytest.raises(ProviderError, match="not a pod id"):
        runpod_with(invalid).get("../pods")


def test_an_unknown_cloud_type_or_a_bad_key_is_refused_before_sending_anything() -> None:
    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    with pytest.raises(ProviderError, match="cloud type"):
        runpod_with(never).provision(ProvisionRequest("gpuq-c", "NVIDIA RTX A6000",
                                                      options=runpod.RunPodOptions(cloud_type="ALL")))
    with pytest.raises(ProviderError, match="not an OpenSSH public key"):
        runpod_with(never).ensure_ssh_key("not-a-key AAAA")


def test_up_with_spot_on_runpod_is_one_line_and_exit_2(gpuq_home: Path) -> None:
    done = run_gpuq("up", "--provider", "runpod", "--gpu", "NVIDIA RTX A6000", "--spot",
                    env={"GPUQ_HOME": str(gpuq_home), "RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": "http://127.0.0.1:9"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "RunPod rents no spot machines" in done.stderr and "vast.ai (--provider vastai --spot)" in done.stderr
    assert Ledger(gpuq_home / "ledger.db").hosts() == [], "nothing rented, nothing recorded"


def test_up_for_a_queue_with_spot_on_runpod_is_one_line_and_exit_2(gpuq_home: Path, tmp_path: Path) -> None:
    queue = tmp_path / "queue.txt"
    queue.write_text("c.yaml classify 1 name=a gpus=1\n")
    done = run_gpuq("up", "--for", str(queue), "--max-price", "2", "--spot", "--provider", "runpod",
                    env={"GPUQ_HOME": str(gpuq_home), "RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": "http://127.0.0.1:9"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "vast.ai (--provider vastai --spot)" in done.stderr
