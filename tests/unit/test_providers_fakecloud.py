"""The fake clouds themselves: auth like the real APIs, schema validation, quirks, controls, backends, replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator.core.errors import ProviderAuthError
from orchestrator.providers.base import ProvisionRequest
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.lambda_cloud import LambdaProvider
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


def gql(client: httpx.Client, cloud: FakeRunPod, document: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("headers", {"Authorization": f"Bearer {cloud.api_key}"})
    return client.post(cloud.graphql_url, json={"query": document}, **kwargs)


def first_error(response: httpx.Response) -> str:
    assert response.status_code == 200, "GraphQL errors come with HTTP 200"
    return str(response.json()["errors"][0]["message"])


# -- fake RunPod -------------------------------------------------------------------------------------------

def test_runpod_auth_by_bearer_or_query_parameter(rp: FakeRunPod, client: httpx.Client) -> None:
    doc = "query { myself { id } }"
    assert gql(client, rp, doc).json() == {"data": {"myself": {"id": "user_fake"}}}
    assert client.post(rp.graphql_url, params={"api_key": "rp-key"}, json={"query": doc}).status_code == 200
    assert client.post(rp.graphql_url, json={"query": doc}).status_code == 401
    assert gql(client, rp, doc, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert [e["auth"] for e in rp.requests()] == ["bearer", "query", "none", "bearer"]
    assert "rp-key" not in json.dumps(rp.requests())


def test_runpod_validates_selections_and_inputs_like_graphql(rp: FakeRunPod, client: httpx.Client) -> None:
    assert first_error(gql(client, rp, "query { myself { id nonsense } }")) == \
        'Cannot query field "nonsense" on type "User".'
    assert "must have a selection" in first_error(gql(client, rp, "query { myself }"))
    assert 'Cannot query field "podStop" on type "Query"' in first_error(
        gql(client, rp, 'query { podStop(input: {podId: "x"}) { id } }'))
    deploy = ('mutation {{ podFindAndDeployOnDemand(input: {{gpuTypeId: "NVIDIA RTX A6000", gpuCount: 1, '
              'cloudType: {cloud}{extra}}}) {{ id }} }}')
    assert 'Enum "CloudTypeEnum" cannot represent non-enum value: "SECURE"' in first_error(
        gql(client, rp, deploy.format(cloud='"SECURE"', extra="")))
    assert 'Field "bogus" is not defined by type "PodFindAndDeployOnDemandInput"' in first_error(
        gql(client, rp, deploy.format(cloud="SECURE", extra=", bogus: 1")))
    assert "cannot represent" in first_error(gql(client, rp, deploy.format(cloud="SECURE", extra=", ports: 22")))
    assert 'required type "Float!" was not provided' in first_error(gql(
        client, rp, 'mutation { podRentInterruptable(input: {gpuTypeId: "NVIDIA RTX A6000", gpuCount: 1}) { id } }'))
    assert "Syntax Error" in first_error(gql(client, rp, "query { myself { id }"))
    response = client.post(rp.graphql_url, headers={"Authorization": "Bearer rp-key"},
                           json={"query": "query { myself { id } }", "variables": {"a": 1}})
    assert "variables" in first_error(response)


def test_runpod_pod_lifecycle_and_quirks(rp: FakeRunPod, client: httpx.Client) -> None:
    made = gql(client, rp, 'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", gpuCount: 1, '
                           'name: "gpuq-x", cloudType: SECURE, ports: "22/tcp"}) { id desiredStatus } }').json()
    pod_id = made["data"]["podFindAndDeployOnDemand"]["id"]
    read = f'query {{ pod(input: {{podId: "{pod_id}"}}) {{ desiredStatus lastStatusChange runtime {{ ports {{ ip '\
           "publicPort privatePort isIpPublic type } } } }"

    def pod() -> dict[str, Any]:
        return gql(client, rp, read).json()["data"]["pod"]  # type: ignore[no-any-return]

    first = pod()
    assert first["desiredStatus"] == "RUNNING" and first["runtime"] is None, "RUNNING before port 22 is mapped"
    port = next(p for p in pod()["runtime"]["ports"] if p["isIpPublic"])["publicPort"]
    rp.preempt(pod_id)
    gone = pod()
    assert gone["desiredStatus"] == "EXITED" and gone["lastStatusChange"].startswith("Outbid: ")
    assert gone["runtime"] is None
    resumed = gql(client, rp, f'mutation {{ podBidResume(input: {{podId: "{pod_id}", bidPerGpu: 0.3, gpuCount: 1}}) '
                              "{ id } }")
    assert resumed.json()["data"]["podBidResume"]["id"] == pod_id
    pod()
    assert next(p for p in pod()["runtime"]["ports"] if p["isIpPublic"])["publicPort"] != port
    assert gql(client, rp, f'mutation {{ podTerminate(input: {{podId: "{pod_id}"}}) }}').json() == \
        {"data": {"podTerminate": None}}
    assert pod() is None
    assert [e[0] for e in rp.backend.events] == ["provision", "preempt", "provision", "destroy"]  # type: ignore[attr-defined]


def test_runpod_capacity_bids_and_prices(rp: FakeRunPod, client: httpx.Client) -> None:
    rp.set_stock("NVIDIA H100 80GB HBM3", 0)
    prices = gql(client, rp, 'query { gpuTypes(input: {id: "NVIDIA H100 80GB HBM3"}) { id lowestPrice(input: '
                             "{gpuCount: 1}) { minimumBidPrice uninterruptablePrice } } }").json()
    assert prices["data"]["gpuTypes"][0]["lowestPrice"] == {"minimumBidPrice": None, "uninterruptablePrice": None}
    full = gql(client, rp, 'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA H100 80GB HBM3", '
                           "gpuCount: 1}) { id } }")
    assert "no longer any instances available" in first_error(full)
    low = gql(client, rp, 'mutation { podRentInterruptable(input: {gpuTypeId: "NVIDIA RTX A6000", gpuCount: 1, '
                          "bidPerGpu: 0.01}) { id } }")
    assert "bid" in first_error(low)


def rp_rest(client: httpx.Client, cloud: FakeRunPod, method: str, path: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("headers", {"Authorization": f"Bearer {cloud.api_key}"})
    return client.request(method, cloud.url + path, **kwargs)


CREATE = {"name": "gpuq-r", "imageName": "img", "gpuTypeIds": ["NVIDIA RTX A6000"], "gpuCount": 1}


def test_runpod_rest_is_bearer_only_and_validates_creates(rp: FakeRunPod, client: httpx.Client) -> None:
    assert rp_rest(client, rp, "GET", "/pods").json() == []
    assert client.get(rp.url + "/pods", params={"api_key": "rp-key"}).status_code == 401  # REST: Bearer only
    assert rp_rest(client, rp, "GET", "/pods", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for body, words in [({**CREATE, "bidPerGpu": 0.3}, "unknown field 'bidPerGpu'"),
                        ({**CREATE, "gpuCount": "1"}, "gpuCount: wrong type"),
                        ({k: v for k, v in CREATE.items() if k != "gpuTypeIds"}, "missing gpuTypeIds"),
                        ({**CREATE, "cloudType": "ALL"}, "cloudType"),
                        ({**CREATE, "gpuTypeIds": ["NVIDIA Imaginary 9000"]}, "invalid GPU type")]:
        answer = rp_rest(client, rp, "POST", "/pods", json=body)
        assert answer.status_code == 400 and words in answer.json()["error"], (body, answer.json())
    assert rp.pods == {}


def test_runpod_rest_lifecycle_on_the_same_pods_as_graphql(rp: FakeRunPod, client: httpx.Client) -> None:
    made = rp_rest(client, rp, "POST", "/pods", json={**CREATE, "interruptible": True})
    assert made.status_code == 201
    pod = made.json()
    assert pod["interruptible"] and pod["costPerHr"] == rp.gpu_types["NVIDIA RTX A6000"].min_bid  # the market price
    assert pod["publicIp"] is None and pod["portMappings"] == {}, "not mapped yet"
    first = rp_rest(client, rp, "GET", f"/pods/{pod['id']}").json()
    assert first["desiredStatus"] == "RUNNING" and first["portMappings"] == {}, "RUNNING before port 22 is mapped"
    ready = rp_rest(client, rp, "GET", f"/pods/{pod['id']}").json()
    assert ready["portMappings"] == {"22": rp.pods[pod["id"]].port} and ready["publicIp"]
    rp.preempt(pod["id"])
    graphql_view = gql(client, rp, f'query {{ pod(input: {{podId: "{pod["id"]}"}}) {{ desiredStatus }} }}').json()
    assert graphql_view["data"]["pod"]["desiredStatus"] == "EXITED"  # one pod, two APIs
    exited = rp_rest(client, rp, "GET", f"/pods/{pod['id']}").json()
    assert exited["desiredStatus"] == "EXITED" and exited["lastStatusChange"].startswith("Outbid: ")
    assert rp_rest(client, rp, "POST", f"/pods/{pod['id']}/start").status_code == 200
    assert rp_rest(client, rp, "POST", f"/pods/{pod['id']}/start").status_code == 400  # already running
    assert rp_rest(client, rp, "POST", f"/pods/{pod['id']}/stop").status_code == 200
    assert rp.pods[pod["id"]].last_change.startswith("Exited by user: ")
    assert rp_rest(client, rp, "DELETE", f"/pods/{pod['id']}").status_code == 204
    assert rp_rest(client, rp, "GET", f"/pods/{pod['id']}").status_code == 404
    assert rp_rest(client, rp, "DELETE", f"/pods/{pod['id']}").status_code == 404
    assert [e["op"] for e in rp.requests()][:2] == ["POST /pods", f"GET /pods/{pod['id']}"]


def test_runpod_pubkey_is_one_newline_joined_string(rp: FakeRunPod) -> None:
    rp.pub_key = "ssh-rsa AAAAother someone@else"
    provider = RunPodProvider(ApiKey("rp-key", "RUNPOD_API_KEY"), url=rp.url, min_interval_s=0,
                              transport=httpx.HTTPTransport(verify=False))
    provider.ensure_ssh_key(PUB)
    provider.ensure_ssh_key(PUB)
    assert rp.pub_key.splitlines() == ["ssh-rsa AAAAother someone@else", PUB]
    provider.close()


def test_control_api_over_http(rp: FakeRunPod, client: httpx.Client) -> None:
    made = gql(client, rp, 'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
                           "gpuCount: 1}) { id } }").json()["data"]["podFindAndDeployOnDemand"]["id"]
    answer = client.post(f"{rp.root_url}/_fake/host_failure", json={"pod_id": made})
    assert answer.json() == {"ok": True, "result": None}
    assert rp.pods[made].last_change.startswith("Exited by Runpod: ")
    assert client.post(f"{rp.root_url}/_fake/rm_rf", json={}).status_code == 404
    assert client.post(f"{rp.root_url}/_fake/preempt", json={"pod_id": "nope"}).status_code == 400
    assert client.get(f"{rp.root_url}/_fake/log").json()[0]["op"] == "podFindAndDeployOnDemand"
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
        [pod] = provider.provision(ProvisionRequest("gpuq-b", "NVIDIA RTX A6000", gpu_count=2, spot=True))
        ready = provider.wait_ready(pod.id)
        assert (ready.ssh_host, ready.ssh_port) == ("10.200.0.7", 22)
        cloud.preempt(pod.id)
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
