"""Provider adapters piece by piece: classification, money, credentials, retries, layering.

No sockets here: adapters talk to httpx MockTransports.  RunPod's v2 adapter on its own: test_provider_runpod.py.
"""

from __future__ import annotations

import ast
import json
import pickle
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.core.errors import (
    ConfigError,
    NoCapacity,
    ProviderAuthError,
    ProviderError,
    ProviderUnreachable,
    ProviderUnsupported,
    ProvisioningFailed,
)
from orchestrator.providers import credentials, lambda_cloud, lambda_wire, models, polling, runpod, transport
from orchestrator.providers.base import classify
from orchestrator.providers.credentials import LAMBDA, RUNPOD, ApiKey
from orchestrator.providers.models import Instance, OfferQuery, ProvisionRequest
from orchestrator.providers.polling import PollPolicy

ROOT = Path(__file__).resolve().parents[2]
KEY = "rpa_UNIT0TEST0KEY0never0shown0z9y8"


def inst(state: models.InstanceState, raw: str, *, reason: str = "", ready: bool = False,
         gpus: int | None = 1) -> Instance:
    return Instance("runpod", "p1", "gpuq-x", state, raw, ssh_host="1.2.3.4" if ready else None,
                    ssh_port=2222 if ready else None, gpu_count=gpus, reason=reason)


# -- classification ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("instance", "expected"), [
    (inst("running", "RUNNING", ready=True), "running"),
    (inst("running", "RUNNING"), "pending"),  # RUNNING, runtime null: not ready yet
    (inst("running", "RUNNING", ready=True, gpus=0), "host_failure"),  # came back with zero GPUs
    (inst("pending", "PROVISIONING"), "pending"),  # RunPod v2
    (inst("pending", "STARTING"), "pending"),
    (inst("pending", "CREATED"), "pending"),  # RunPod v1, read from older rows
    (inst("pending", "booting"), "pending"),
    (inst("pending", "SOMETHING_NEW"), "unknown"),
    (inst("exited", "EXITED", reason="Outbid: Fri Jul 12 2024 15:14:40 GMT-0400 (EDT)"), "spot_preemption"),
    (inst("exited", "EXITED", reason="Exited by user: Fri Jul 12 2024 15:14:40 GMT-0400"), "manual_stop"),
    (inst("exited", "EXITED", reason="Exited by Runpod: Fri Jul 12 2024 15:14:40 GMT-0400"), "host_failure"),
    (inst("exited", "EXITED", reason="Machine migrated"), "unknown"),
    (inst("exited", "EXITED"), "unknown"),
    (inst("stopped", "stopped"), "manual_stop"),
    (inst("unhealthy", "unhealthy", ready=True), "host_failure"),
    (inst("terminating", "terminating"), "host_failure"),
    (inst("terminated", "TERMINATED"), "host_failure"),
    (None, "host_failure"),
])
def test_classify(instance: Instance | None, expected: str) -> None:
    assert classify(instance) == expected


def test_readiness_needs_running_and_an_endpoint() -> None:
    assert inst("running", "RUNNING", ready=True).ready
    assert not inst("running", "RUNNING").ready
    assert not inst("unhealthy", "unhealthy", ready=True).ready


def lambda_instance(item: dict[str, Any]) -> Instance:
    return lambda_wire.instance_of(lambda_wire.parse(lambda_wire.WireInstance, item, "GET /instances/{id}"))


def test_lambda_readiness_is_active_with_an_ip() -> None:
    item: dict[str, Any] = {"id": "i", "status": "booting", "ip": None, "ssh_key_names": [], "file_system_names": [],
            "instance_type": {"name": "gpu_8x_h100_sxm5", "price_cents_per_hour": 2392}}
    assert not lambda_instance(item).ready
    active = lambda_instance({**item, "status": "active", "ip": "5.6.7.8"})
    assert active.ready and active.ssh_port == 22 and active.ssh_user == "ubuntu"
    assert active.gpu_count == 8 and active.price_per_hour == Decimal("23.92")
    assert lambda_instance({**item, "status": "mystery"}).state == "pending"
    assert lambda_instance({"id": "i", "status": "active", "name": None}).name == ""  # launched without a name


@pytest.mark.parametrize("bad", [
    {"status": "active"},  # no id
    {"id": "i", "status": "active", "instance_type": {"price_cents_per_hour": "2392"}},  # the document: integer
    {"id": "i", "status": "active", "instance_type": {"price_cents_per_hour": -1}},
    {"id": "i", "status": "active", "ip": 5},
    {"id": "x" * 101, "status": "active"},
])
def test_a_lambda_instance_that_does_not_fit_the_document_is_refused_without_its_text(bad: dict[str, Any]) -> None:
    with pytest.raises(ProviderError, match="unexpected answer") as caught:
        lambda_instance(bad)
    assert caught.value.code == "bad-answer" and "2392" not in str(caught.value)


# -- money ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "expected"), [
    ("0.74", Decimal("0.74")), (0.69, Decimal("0.69")), (2, Decimal("2")), (" 1.5 ", Decimal("1.5")),
    (None, None), ("abc", None), (-1, None), ("NaN", None), ("Infinity", None), (True, None), ([1], None),
])
def test_parse_money(raw: object, expected: Decimal | None) -> None:
    assert models.parse_money(raw) == expected


def test_cents_round_half_up() -> None:
    assert models.to_cents(Decimal("0.745")) == 75 and models.to_cents(Decimal("0.744")) == 74
    assert models.to_cents(None) is None


def test_request_names_one_per_machine() -> None:
    assert ProvisionRequest("gpuq-a", "t").names() == ["gpuq-a"]
    assert ProvisionRequest("gpuq-a", "t", count=3).names() == ["gpuq-a-0", "gpuq-a-1", "gpuq-a-2"]


# -- polling -------------------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def sequence(*states: Instance | None) -> Callable[[str], Instance | None]:
    items = list(states)

    def fetch(_: str) -> Instance | None:
        return items.pop(0) if len(items) > 1 else items[0]

    return fetch


def test_wait_ready_polls_with_growing_intervals_until_ready() -> None:
    clock = Clock()
    fetch = sequence(inst("pending", "CREATED"), inst("running", "RUNNING"), inst("pending", "NEWSTATE"),
                     inst("running", "RUNNING", ready=True))
    got = polling.poll_until_ready("RunPod", "p1", fetch, PollPolicy(100, 5, 15, factor=2), sleep=clock.sleep,
                                clock=lambda: clock.now)
    assert got.ready and clock.sleeps == [5, 10, 15]


def test_wait_ready_gives_up_as_stuck_provisioning() -> None:
    clock = Clock()
    with pytest.raises(ProvisioningFailed, match="stuck provisioning") as caught:
        polling.poll_until_ready("RunPod", "p1", sequence(inst("running", "RUNNING")), PollPolicy(60, 5, 15),
                              sleep=clock.sleep, clock=lambda: clock.now)
    assert caught.value.code == "stuck_provisioning" and 60 <= clock.now < 80


@pytest.mark.parametrize(("dead", "words"), [
    (inst("exited", "EXITED", reason="Outbid: now"), "EXITED (Outbid: now)"),
    (inst("running", "RUNNING", ready=True, gpus=0), "0 GPUs"),
    (None, "is gone"),
])
def test_wait_ready_fails_when_the_instance_dies(dead: Instance | None, words: str) -> None:
    clock = Clock()
    with pytest.raises(ProvisioningFailed, match=words.replace("(", r"\(").replace(")", r"\)")):
        polling.poll_until_ready("RunPod", "p1", sequence(inst("pending", "CREATED"), dead), PollPolicy(60, 5, 15),
                              sleep=clock.sleep, clock=lambda: clock.now)


def test_wait_gone_reports_a_resource_that_may_still_bill() -> None:
    clock = Clock()
    with pytest.raises(ProviderError, match="may still bill"):
        polling.poll_until_gone("Lambda Cloud", "i", sequence(inst("terminating", "terminating")),
                                PollPolicy(30, 10, 10), sleep=clock.sleep, clock=lambda: clock.now)


# -- credentials ---------------------------------------------------------------------------------------------

def test_key_from_env_prefers_gpuq_own_variable(tmp_path: Path) -> None:
    env = {"GPUQ_HOME": str(tmp_path), "RUNPOD_API_KEY": "vendor", "GPUQ_RUNPOD_API_KEY": "own"}
    key = credentials.load_key(RUNPOD, env)
    assert key.reveal() == "own" and key.source == "GPUQ_RUNPOD_API_KEY"
    assert credentials.load_key(LAMBDA, {"GPUQ_HOME": str(tmp_path), "LAMBDA_API_KEY": "l"}).source == "LAMBDA_API_KEY"


def test_empty_key_variable_is_an_error_not_unset(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RUNPOD_API_KEY is set but empty"):
        credentials.load_key(RUNPOD, {"GPUQ_HOME": str(tmp_path), "RUNPOD_API_KEY": " "})


def test_missing_key_says_which_variable_to_set(tmp_path: Path) -> None:
    with pytest.raises(ProviderAuthError, match="set LAMBDA_API_KEY"):
        credentials.load_key(LAMBDA, {"GPUQ_HOME": str(tmp_path)})


@pytest.mark.parametrize("filename", credentials.KEY_FILES)
def test_keys_file_is_read_only_when_private(tmp_path: Path, filename: str) -> None:
    path = tmp_path / filename
    path.write_text(f'[runpod]\napi_key = "{KEY}"\n')
    path.chmod(0o600)
    key = credentials.load_key(RUNPOD, {"GPUQ_HOME": str(tmp_path)})
    assert key.reveal() == KEY and filename in key.source
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600") as caught:
        credentials.load_key(RUNPOD, {"GPUQ_HOME": str(tmp_path)})
    assert KEY not in str(caught.value)
    path.chmod(0o600)
    with pytest.raises(ProviderAuthError):  # no [lambda] section: no Lambda key
        credentials.load_key(LAMBDA, {"GPUQ_HOME": str(tmp_path)})


def test_broken_keys_file_never_echoes_its_content(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[runpod]\napi_key = "{KEY}\n')
    path.chmod(0o600)
    with pytest.raises(ConfigError) as caught:
        credentials.load_key(RUNPOD, {"GPUQ_HOME": str(tmp_path)})
    assert KEY not in str(caught.value) and caught.value.__cause__ is None


def test_api_key_hides_itself() -> None:
    key = ApiKey(KEY, "RUNPOD_API_KEY")
    assert KEY not in repr(key) and KEY not in str(key) and KEY not in f"{key}"
    assert key.scrub(f"bad key {KEY}!") == "bad key ***!"
    with pytest.raises(TypeError):
        pickle.dumps(key)


def test_urls_from_env_and_refusals() -> None:
    assert credentials.load_url(RUNPOD, {}) == "https://api.runpod.io/v2"
    assert credentials.load_url(RUNPOD, {"GPUQ_RUNPOD_URL": "http://127.0.0.1:9/v2/"}) == "http://127.0.0.1:9/v2"
    assert credentials.load_url(RUNPOD, {"GPUQ_RUNPOD_REST_URL": "https://r.example/v2",
                                         "GPUQ_RUNPOD_URL": "https://ignored.example/v2"}) == "https://r.example/v2"
    env = {"GPUQ_LAMBDA_API_URL": "https://a.example/api/v1", "GPUQ_LAMBDA_URL": "https://b.example"}
    assert credentials.load_url(LAMBDA, env) == "https://a.example/api/v1"
    with pytest.raises(ConfigError, match="loopback"):
        credentials.load_url(LAMBDA, {"GPUQ_LAMBDA_URL": "http://cloud.example/api/v1"})
    with pytest.raises(ConfigError, match="credentials") as caught:
        credentials.load_url(RUNPOD, {"GPUQ_RUNPOD_URL": f"https://api.example/v2?api_key={KEY}"})
    assert KEY not in str(caught.value)
    with pytest.raises(ValueError, match="no API named"):
        credentials.load_url(RUNPOD, {}, "graphql")  # RunPod's GraphQL is gone


TWO_APIS = credentials.ProviderSpec("two", "Two", ("TWO_KEY",), ("TWO_URL",), "https://api.two.example/v1", "two",
                                    more_urls=(credentials.Endpoint("extra", ("TWO_EXTRA_URL",),
                                                                    "https://x.two.example/extra"),))


@pytest.mark.parametrize(("env", "main", "extra"), [
    ({}, "https://api.two.example/v1", "https://x.two.example/extra"),
    # one URL overridden: the other API follows it to the same server (a fake, a proxy), never to the vendor
    ({"TWO_URL": "http://127.0.0.1:9/v1"}, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/extra"),
    ({"TWO_EXTRA_URL": "https://proxy.example:8443/extra"}, "https://proxy.example:8443/v1",
     "https://proxy.example:8443/extra"),
])
def test_a_second_api_follows_an_overridden_url(env: dict[str, str], main: str, extra: str) -> None:
    assert (credentials.load_url(TWO_APIS, env), credentials.load_url(TWO_APIS, env, "extra")) == (main, extra)


def test_from_env_builds_an_adapter_without_showing_the_key(tmp_path: Path) -> None:
    env = {"GPUQ_HOME": str(tmp_path), "RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": "http://127.0.0.1:1/v2"}
    provider = runpod.RunPodProvider.from_env(env)
    assert provider.http.base_url == "http://127.0.0.1:1/v2" and KEY not in repr(provider)
    provider.close()


@pytest.mark.parametrize(("header", "expected"), [("3", 3.0), ("2.5", 2.5), ("-4", 0.0), ("soon", None), (None, None)])
def test_retry_after_seconds(header: str | None, expected: float | None) -> None:
    assert transport.parse_retry_after(header) == expected


def test_retry_after_http_date() -> None:
    assert transport.parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0


def test_backoff_doubles_with_bounded_jitter_and_a_cap() -> None:
    import random
    policy = transport.RetryPolicy(tries=6, first_delay_s=10, max_delay_s=120, jitter=0.2)
    rng = random.Random(1)
    for retry, centre in [(1, 10), (2, 20), (3, 40), (4, 80)]:
        assert centre * 0.8 <= policy.delay(retry, None, rng) <= min(120, centre * 1.2)
    assert policy.delay(5, None, rng) <= 120 and policy.delay(9, 999.0, rng) == 120


Handler = Callable[[httpx.Request], httpx.Response]


def lambda_with(handler: Handler, clock: Clock | None = None) -> lambda_cloud.LambdaProvider:
    clock = clock or Clock()
    return lambda_cloud.LambdaProvider(ApiKey(KEY, "LAMBDA_API_KEY"), transport=httpx.MockTransport(handler),
                                       min_interval_s=0, launch_interval_s=0, sleep=clock.sleep,
                                       clock=lambda: clock.now)


def runpod_with(handler: Handler, clock: Clock | None = None) -> runpod.RunPodProvider:
    clock = clock or Clock()
    return runpod.RunPodProvider(ApiKey(KEY, "RUNPOD_API_KEY"), transport=httpx.MockTransport(handler),
                                 min_interval_s=0, sleep=clock.sleep, clock=lambda: clock.now)


def test_network_errors_are_retried_then_unreachable() -> None:
    calls: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    clock = Clock()
    with pytest.raises(ProviderUnreachable, match="cannot connect"):
        lambda_with(refuse, clock).list_offers(OfferQuery())
    assert len(calls) == lambda_cloud.RETRY.tries and len(clock.sleeps) == lambda_cloud.RETRY.tries - 1


def test_5xx_is_retried_and_4xx_is_not() -> None:
    statuses = [502, 503, 200]

    def flaky(request: httpx.Request) -> httpx.Response:
        status = statuses.pop(0)
        return httpx.Response(status, json={"data": {}} if status == 200 else {"error": {"code": "global/unknown"}})

    assert lambda_with(flaky).list_offers(OfferQuery()) == [] and not statuses
    calls: list[int] = []

    def invalid(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, json={"error": {"code": "global/invalid-parameters", "message": "nope",
                                                   "suggestion": "fix it"}})

    with pytest.raises(ProviderError, match="global/invalid-parameters: nope \\(fix it\\)"):
        lambda_with(invalid).list_offers(OfferQuery())
    assert calls == [1]


def test_every_request_has_a_timeout_a_bearer_header_and_no_key_in_the_url() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/terminate"):
            return httpx.Response(200, json={"data": {"terminated_instances": []}})
        return httpx.Response(200, json={"data": []})

    provider = lambda_with(answer)
    provider.list_instances()
    provider.terminate("abc")
    for request in seen:
        assert request.headers["authorization"] == f"Bearer {KEY}" and KEY not in str(request.url)
        assert all(value for value in request.extensions["timeout"].values())
    assert seen[0].extensions["timeout"]["read"] == 30.0 and seen[1].extensions["timeout"]["read"] == 60.0


def test_server_text_that_echoes_the_key_is_scrubbed() -> None:
    def echo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"code": "global/invalid-parameters", "message": f"bad {KEY}"}})

    with pytest.raises(ProviderError) as caught:
        lambda_with(echo).list_offers(OfferQuery())
    assert KEY not in str(caught.value) and "***" in str(caught.value)


def test_account_inactive_is_an_auth_error() -> None:
    def inactive(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json={"error": {"code": "global/account-inactive", "message": "inactive"}})

    with pytest.raises(ProviderAuthError, match="LAMBDA_API_KEY"):
        lambda_with(inactive).list_instances()


def test_a_launch_that_timed_out_is_adopted_by_name() -> None:
    launched: list[dict[str, Any]] = []
    listed: list[dict[str, Any]] = []
    active = {"id": "i-1", "name": "gpuq-t", "status": "booting", "ssh_key_names": ["k"], "file_system_names": [],
              "instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 75}}
    types = {"gpu_1x_a10": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 75},
                            "regions_with_capacity_available": [{"name": "us-east-1"}]}}
    pub = "ssh-ed25519 AAAAkey c"

    def cloud(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        if path == "/instance-types":
            return httpx.Response(200, json={"data": types})
        if path == "/ssh-keys":
            return httpx.Response(200, json={"data": [{"id": "1", "name": "mine", "public_key": pub}]})
        if path == "/instances":
            return httpx.Response(200, json={"data": listed})
        if path == "/instance-operations/launch":
            launched.append(json.loads(request.content))
            listed.append(active)  # it happened server-side ...
            raise httpx.ReadTimeout("slow", request=request)  # ... but the answer never arrived
        if path == "/instances/i-1":
            return httpx.Response(200, json={"data": active})
        return httpx.Response(404, json={"error": {"code": "global/object-does-not-exist"}})

    [made] = lambda_with(cloud).provision(ProvisionRequest("gpuq-t", "gpu_1x_a10", ssh_public_key=pub))
    assert made.id == "i-1" and len(launched) == 1
    assert launched[0] == {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["mine"],
                           "name": "gpuq-t"}


def test_lambda_region_choice_and_capacity() -> None:
    types = {"gpu_1x_a100": {"instance_type": {"name": "gpu_1x_a100", "price_cents_per_hour": 129},
                             "regions_with_capacity_available": [{"name": "us-west-1"}]},
             "gpu_8x_h100_sxm5": {"instance_type": {"name": "gpu_8x_h100_sxm5", "price_cents_per_hour": 2392},
                                  "regions_with_capacity_available": []}}

    def cloud(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": types})

    provider = lambda_with(cloud)
    pub = "ssh-ed25519 AAAAkey"
    with pytest.raises(NoCapacity, match="no region has capacity"):
        provider.provision(ProvisionRequest("gpuq-h", "gpu_8x_h100_sxm5", ssh_public_key=pub))
    with pytest.raises(NoCapacity, match="us-west-1"):
        provider.provision(ProvisionRequest("gpuq-a", "gpu_1x_a100", region="us-east-1", ssh_public_key=pub))
    with pytest.raises(ProviderError, match="unknown instance type"):
        provider.provision(ProvisionRequest("gpuq-a", "gpu_1x_z9", ssh_public_key=pub))
    assert [o.gpu_type for o in provider.list_offers(OfferQuery(gpu_count=8))] == ["gpu_8x_h100_sxm5"]


# -- layering -------------------------------------------------------------------------------------------------

ALLOWED_INTERNAL = {"orchestrator.core.errors", "orchestrator.core.specs", "orchestrator.core.states",
                    "orchestrator.core.protocol", "orchestrator.core.config", "orchestrator.providers",
                    "orchestrator.scheduling.gpumatch"}  # pure: an offer's GPU memory in the words gpu_mem= uses
ALLOWED_EXTERNAL = {"httpx", "pydantic"}  # pydantic: the typed wire models (vastai_wire.py, runpod_wire.py)


def test_providers_import_only_their_allowed_layers() -> None:
    """docs/architecture.md: providers never import hosts, ledger, api or cli, nor sqlmodel, paramiko or torch."""
    for path in sorted((ROOT / "orchestrator" / "providers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "orchestrator":
                    assert any(name == a or name.startswith(a + ".") for a in ALLOWED_INTERNAL), f"{path.name}: {name}"
                elif top != "__future__" and top not in sys.stdlib_module_names:
                    assert top in ALLOWED_EXTERNAL, f"{path.name} imports {name}"



# -- the offer query ------------------------------------------------------------------------------------------

def test_an_offer_query_admits_by_count_type_memory_region_and_price() -> None:
    offer = models.Offer("runpod", "NVIDIA A100 80GB PCIe", "A100 PCIe", 2, Decimal("3.00"), gpu_memory_gb=80,
                         spot_price_per_hour=Decimal("1.50"), regions=("US-TX-3", "EU-RO-1"))
    Q = OfferQuery
    assert Q().admits(offer) and Q(gpu_count=2, gpu_name="NVIDIA A100 80GB PCIe", min_gpu_memory_gb=80,
                                   region="EU-RO-1", max_price_per_hour=Decimal("3.00")).admits(offer)
    assert not Q(gpu_count=1).admits(offer) and not Q(gpu_name="A100").admits(offer)
    assert not Q(min_gpu_memory_gb=80.5).admits(offer) and not Q(region="US-CA-1").admits(offer)
    assert not Q(max_price_per_hour=Decimal("2.99")).admits(offer)
    assert Q(spot=True, max_price_per_hour=Decimal("1.50")).admits(offer), "spot: priced by its minimum bid"
    unknown = models.Offer("lambda", "gpu_1x_x", "x", 1, None)
    assert Q().admits(unknown) and Q(region="us-east-1").admits(unknown), "an offer naming no region is kept"
    assert not Q(min_gpu_memory_gb=1).admits(unknown) and not Q(max_price_per_hour=Decimal(9)).admits(unknown)


@pytest.mark.parametrize("bad", [{"gpu_count": 0}, {"gpu_count": True}, {"min_gpu_memory_gb": -1},
                                 {"min_gpu_memory_gb": float("nan")}, {"max_price_per_hour": Decimal("-0.01")}])
def test_an_offer_query_out_of_range_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="offer query"):
        OfferQuery(**bad)


def test_lambda_filters_what_its_api_cannot() -> None:
    types = {"gpu_1x_a100": {"instance_type": {"name": "gpu_1x_a100", "price_cents_per_hour": 129,
                                               "gpu_description": "A100 (40 GB SXM4)"},
                             "regions_with_capacity_available": [{"name": "us-west-1"}]},
             "gpu_1x_h100": {"instance_type": {"name": "gpu_1x_h100", "price_cents_per_hour": 249,
                                               "gpu_description": "H100 (80 GB PCIe)"},
                             "regions_with_capacity_available": [{"name": "us-east-1"}]}}
    sent: list[str] = []

    def cloud(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(200, json={"data": types})

    lam = lambda_with(cloud)
    assert [o.gpu_type for o in lam.list_offers(OfferQuery(min_gpu_memory_gb=80))] == ["gpu_1x_h100"]
    assert [o.gpu_type for o in lam.list_offers(OfferQuery(region="us-west-1"))] == ["gpu_1x_a100"]
    assert [o.gpu_type for o in lam.list_offers(OfferQuery(max_price_per_hour=Decimal("2")))] == ["gpu_1x_a100"]
    assert all("?" not in url for url in sent), "Lambda's /instance-types takes no filter"
    with pytest.raises(ProviderUnsupported, match="no spot"):
        lam.list_offers(OfferQuery(spot=True))
    assert len(sent) == 3, "a spot query is refused before anything is asked"
