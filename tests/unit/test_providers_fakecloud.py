"""The fake clouds themselves: auth like the real APIs, schema validation, quirks, controls, backends, replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator.core.errors import ProviderAuthError
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.lambda_cloud import LambdaProvider
from orchestrator.providers.models import ProvisionRequest
from orchestrator.providers.runpod import RunPodProvider
from tests.support.fakecloud import FakeLambda, FakeRunPod
from tests.support.fakecloud.recording import Replay, ReplayMismatch

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFake gpuq@test"


@pytest.fixture
def rp() -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key="rp-key") as cloud:
        yield cloud


@pytest.fixture
def lam() -> Iterator[FakeLambda]:
    with FakeLambda(api_key="lam-key") as cloud:
        yield cloud


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(transport=httpx.HTTPTransport(verify=False), timeout=5) as made:
        yield made


def v2(client: httpx.Client, cloud: FakeRunPod, method: str, path: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("headers", {"Authorization": f"Bearer {cloud.api_key}"})
    return client.request(method, cloud.url + path, **kwargs)


CREATE = {"name": "gpuq-f", "image": "runpod/base", "gpu": {"id": "NVIDIA RTX A6000", "count": 1}, "ports": ["22/tcp"],
          "startSsh": True}


# -- fake RunPod (REST v2) ------------------------------------------------------------------------------------

def test_runpod_auth_is_bearer_only_and_errors_are_problem_objects(rp: FakeRunPod, client: httpx.Client) -> None:
    assert v2(client, rp, "GET", "/pods").json() == {"pods": []}
    denied = client.get(rp.url + "/pods", params={"api_key": "rp-key"})
    assert denied.status_code == 401 and denied.headers["content-type"] == "application/problem+json"
    assert set(denied.json()) == {"title", "status", "detail"}
    assert v2(client, rp, "GET", "/pods", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert [e["auth"] for e in rp.requests()] == ["bearer", "query", "bearer"]
    assert "rp-key" not in json.dumps(rp.requests())
    assert client.get(rp.root_url + "/v1/pods", headers={"Authorization": "Bearer rp-key"}).status_code == 404


def test_runpod_validates_create_bodies_like_the_document(rp: FakeRunPod, client: httpx.Client) -> None:
    for bad in ({**CREATE, "interruptible": True}, {**CREATE, "gpuTypeIds": ["NVIDIA RTX A6000"]},
                {k: v for k, v in CREATE.items() if k != "image"}, {**CREATE, "cloud": "ALL"},
                {**CREATE, "gpu": {"id": "NVIDIA RTX A6000", "count": 0}}, {**CREATE, "env": {"A": 1}}):
        answer = v2(client, rp, "POST", "/pods", json=bad)
        assert answer.status_code == 422 and answer.json()["errors"], bad
    assert v2(client, rp, "POST", "/pods", json={**CREATE, "gpu": {"id": "NVIDIA Imaginary"}}).status_code == 404
    assert not rp.pods
    bad_query = v2(client, rp, "GET", "/catalog/gpus", params={"count": "2"})
    assert bad_query.status_code == 400  # count is valid only with include=AVAILABILITY (the document says so)


def test_runpod_pod_lifecycle(rp: FakeRunPod, client: httpx.Client) -> None:
    made = v2(client, rp, "POST", "/pods", json=CREATE)
    assert made.status_code == 201 and made.json()["ssh"]["direct"] is None  # RUNNING, no port yet (port_polls)
    pod_id = made.json()["id"]
    first = v2(client, rp, "GET", f"/pods/{pod_id}").json()
    assert first["status"] == "RUNNING" and first["ssh"]["direct"] is None
    ready = v2(client, rp, "GET", f"/pods/{pod_id}").json()
    assert ready["ssh"]["direct"]["port"] > 0 and ready["runtime"]["gpus"] and ready["cost"] == 0.79
    stopped = v2(client, rp, "POST", f"/pods/{pod_id}/action", json={"action": "stop"})
    assert stopped.json()["status"] == "EXITED" and stopped.json()["cost"] == 0.0
    assert v2(client, rp, "POST", f"/pods/{pod_id}/action", json={"action": "stop"}).status_code == 409
    assert v2(client, rp, "POST", f"/pods/{pod_id}/action", json={"action": "bid"}).status_code == 422
    started = v2(client, rp, "POST", f"/pods/{pod_id}/action", json={"action": "start"}).json()
    assert started["status"] == "RUNNING"
    assert v2(client, rp, "DELETE", f"/pods/{pod_id}").status_code == 204
    assert v2(client, rp, "GET", f"/pods/{pod_id}").status_code == 404


def test_runpod_catalog_stock_and_capacity(rp: FakeRunPod, client: httpx.Client) -> None:
    rp.set_stock("NVIDIA RTX A6000", 1)
    query = {"include": "AVAILABILITY", "product": "POD", "count": "2", "cloud": "SECURE"}
    gpus = {g["id"]: g for g in v2(client, rp, "GET", "/catalog/gpus", params=query).json()["gpus"]}
    a6000 = gpus["NVIDIA RTX A6000"]
    assert a6000["availability"] == "NONE" and "dataCenters" not in a6000 and a6000["price"]["secure"] == 0.79
    assert "availability" not in v2(client, rp, "GET", "/catalog/gpus").json()["gpus"][0]  # only when asked
    full = v2(client, rp, "POST", "/pods", json={**CREATE, "gpu": {"id": "NVIDIA RTX A6000", "count": 2}})
    assert full.status_code == 400 and "no longer any instances" in full.json()["detail"] and not rp.pods


def test_runpod_ssh_keys_are_one_replaced_set(rp: FakeRunPod, client: httpx.Client) -> None:
    assert v2(client, rp, "GET", "/account/ssh-keys").json() == {"keys": []}
    assert v2(client, rp, "PUT", "/account/ssh-keys", json={"keys": [PUB]}).json() == {"keys": [PUB]}
    assert v2(client, rp, "PUT", "/account/ssh-keys", json={"keys": ["not a key"]}).status_code == 422
    assert v2(client, rp, "PUT", "/account/ssh-keys", json={"keys": [PUB], "x": 1}).status_code == 422
    assert rp.ssh_keys == [PUB]


def test_control_api_over_http(rp: FakeRunPod, client: httpx.Client) -> None:
    made = v2(client, rp, "POST", "/pods", json=CREATE).json()["id"]
    answer = client.post(f"{rp.root_url}/_fake/host_failure", json={"pod_id": made})
    assert answer.json() == {"ok": True, "result": None}
    assert rp.pods[made].status == "ERROR"
    assert client.post(f"{rp.root_url}/_fake/rm_rf", json={}).status_code == 404
    assert client.post(f"{rp.root_url}/_fake/preempt", json={"pod_id": made}).status_code == 404  # no spot on v2
    assert client.post(f"{rp.root_url}/_fake/user_stop", json={"pod_id": "nope"}).status_code == 400
    assert client.get(f"{rp.root_url}/_fake/log").json()[0]["op"] == "POST /pods"
    assert made in client.get(f"{rp.root_url}/_fake/state").json()["pods"]


class RecordingBackend:
    """A custom backend: what a network-namespace SSH host farm would implement."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        self.calls.append(("provision", instance_id, gpu_count))
        return "10.200.0.7", 22

    def preempt(self, instance_id: str, grace_s: float) -> None:
        self.calls.append(("preempt", instance_id, grace_s))

    def destroy(self, instance_id: str) -> None:
        self.calls.append(("destroy", instance_id, 0))


def test_backends_are_injectable_and_see_the_grace() -> None:
    backend = RecordingBackend()
    with FakeRunPod(api_key="k", backend=backend) as cloud:
        provider = RunPodProvider(ApiKey("k", "RUNPOD_API_KEY"), url=cloud.url, min_interval_s=0,
                                  transport=httpx.HTTPTransport(verify=False), sleep=lambda s: None)
        [pod] = provider.provision(ProvisionRequest("gpuq-b", "NVIDIA RTX A6000", gpu_count=2))
        ready = provider.wait_ready(pod.id)
        assert (ready.ssh_host, ready.ssh_port) == ("10.200.0.7", 22)
        provider.stop(pod.id)
        provider.terminate(pod.id)
        provider.close()
    assert backend.calls == [("provision", pod.id, 2), ("preempt", pod.id, 5.0), ("destroy", pod.id, 0)]


# -- fake Lambda -----------------------------------------------------------------------------------------------

def rest(client: httpx.Client, cloud: FakeLambda, method: str, path: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("headers", {"Authorization": f"Bearer {cloud.api_key}"})
    return client.request(method, cloud.url + path, **kwargs)


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, str(response.json()["error"]["code"])


def test_lambda_auth_basic_or_bearer(lam: FakeLambda, client: httpx.Client) -> None:
    assert client.get(lam.url + "/instances", auth=("lam-key", "")).json() == {"data": []}
    assert code(client.get(lam.url + "/instances", auth=("lam-key", "x"))) == (401, "global/invalid-api-key")
    assert code(client.get(lam.url + "/instances")) == (401, "global/invalid-api-key")
    lam.account_inactive()
    assert code(rest(client, lam, "GET", "/instances")) == (403, "global/account-inactive")


def test_lambda_launch_validation(lam: FakeLambda, client: httpx.Client) -> None:
    rest(client, lam, "POST", "/ssh-keys", json={"name": "k1", "public_key": PUB})
    lam.add_file_system("data", "us-west-1")
    ok = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["k1"]}

    def launch(**changes: Any) -> httpx.Response:
        return rest(client, lam, "POST", "/instance-operations/launch", json={**ok, **changes})

    assert code(launch(ssh_key_names=["k1", "k1"])) == (400, "global/invalid-parameters")
    assert code(launch(ssh_key_names=["missing"])) == (400, "global/invalid-parameters")
    assert code(launch(quantity=2)) == (400, "global/invalid-parameters")
    assert code(launch(file_system_names=["data"])) == (400, "instance-operations/launch/file-system-in-wrong-region")
    assert code(launch(region_name="europe-central-1")) == (400, "instance-operations/launch/insufficient-capacity")
    instance_id = launch().json()["data"]["instance_ids"][0]
    assert "ip" not in rest(client, lam, "GET", f"/instances/{instance_id}").json()["data"], "booting: no ip"
    assert rest(client, lam, "GET", f"/instances/{instance_id}").json()["data"]["status"] == "active"
    key_id = rest(client, lam, "GET", "/ssh-keys").json()["data"][0]["id"]
    assert code(rest(client, lam, "DELETE", f"/ssh-keys/{key_id}")) == (400, "ssh-keys/key-in-use")
    assert code(rest(client, lam, "GET", "/instances/nope")) == (404, "global/object-does-not-exist")
    lam.launch_interval(10)
    limited = launch()
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "10"


def test_lambda_terminate_is_eventually_consistent_and_may_omit_instances(lam: FakeLambda) -> None:
    provider = LambdaProvider(ApiKey("lam-key", "LAMBDA_API_KEY"), url=lam.url, min_interval_s=0,
                              launch_interval_s=0, transport=httpx.HTTPTransport(verify=False), sleep=lambda s: None)
    [made] = provider.provision(ProvisionRequest("gpuq-t", "gpu_1x_a10", ssh_public_key=PUB))
    lam.terminate_lag(terminating_polls=2, linger_polls=1)
    lam.short_terminate_response()
    provider.terminate(made.id)
    states = []
    while (now := provider.get(made.id)) is not None:
        states.append(now.raw_status)
    assert states == ["terminating", "terminating", "terminated"]
    provider.close()


def test_lambda_generated_key_pairs_are_possible_but_gpuq_never_asks(lam: FakeLambda, client: httpx.Client) -> None:
    generated = rest(client, lam, "POST", "/ssh-keys", json={"name": "gen"}).json()["data"]
    assert "private_key" in generated
    provider = LambdaProvider(ApiKey("lam-key", "LAMBDA_API_KEY"), url=lam.url, min_interval_s=0,
                              transport=httpx.HTTPTransport(verify=False))
    provider.ensure_ssh_key(PUB)
    posted = [e for e in lam.requests() if e["method"] == "POST" and e["path"].endswith("/ssh-keys")]
    assert len(posted) == 2 and all("private_key" not in k for k in lam.ssh_keys.values())
    provider.close()


def test_wrong_key_against_the_fake_is_an_auth_error(lam: FakeLambda) -> None:
    provider = LambdaProvider(ApiKey("not-the-key", "LAMBDA_API_KEY"), url=lam.url, min_interval_s=0,
                              transport=httpx.HTTPTransport(verify=False))
    with pytest.raises(ProviderAuthError, match="set LAMBDA_API_KEY") as caught:
        provider.list_instances()
    assert "not-the-key" not in str(caught.value)
    provider.close()


# -- replay ------------------------------------------------------------------------------------------------

def exchange(path: str, body: Any = None) -> dict[str, Any]:
    return {"request": {"method": "GET", "path": path, "query": {}, "auth": "bearer", "json": body},
            "response": {"status": 200, "headers": {}, "json": {"data": []}}}


def test_replay_fails_on_anything_unexpected() -> None:
    replay = Replay([exchange("/instances")], "/api/v1", "unit")
    with httpx.Client(transport=replay.transport, headers={"Authorization": "Bearer k"}) as http, \
            pytest.raises(ReplayMismatch, match="differs"):
        http.get("https://x.example/api/v1/ssh-keys")
    with pytest.raises(AssertionError):
        replay.assert_done()
    replay = Replay([exchange("/instances")], "/api/v1", "unit")
    with httpx.Client(transport=replay.transport) as http, pytest.raises(ReplayMismatch, match="Bearer"):
        http.get("https://x.example/api/v1/instances")
    replay = Replay([exchange("/instances")], "/api/v1", "unit")
    with httpx.Client(transport=replay.transport, headers={"Authorization": "Bearer k"}) as http:
        assert http.get("https://x.example/api/v1/instances").json() == {"data": []}
        with pytest.raises(ReplayMismatch, match="beyond the recording"):
            http.get("https://x.example/api/v1/instances")
