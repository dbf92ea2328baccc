"""One contract for every provider adapter (docs/architecture.md): :class:`ProviderContract` holds the contract's
tests, and each provider in the registry has one subclass that supplies that provider's answers (its fake, its
adapter, its GPU type, SSH user and key variable, the calls it is counted by, its own expected refusals) and
overrides a test only where its answer is its own, as huey's ``TestRedisStorage(StorageTests)`` does.  A
provider added to the registry without a subclass fails :func:`test_every_provider_in_the_registry_runs_the_contract`.

Each subclass runs two ways (``modes``; the toy only the first):

- ``fake``: the adapter against the provider's local fake server (tests/support/fakecloud);
- ``replay``: the adapter against recorded exchanges (tests/fixtures/providers/<provider>/fake/<test>.json)
  through an httpx MockTransport that fails the test on any request the recording does not have.

Injections (preempt, capacity, 429, ...) act on the fake and are no-ops on a replay, whose recorded
responses already carry their effect.  Re-record after an intended change to what an adapter sends:

    python scripts/fakecloud.py record
"""

from __future__ import annotations

import dataclasses
import logging
import os
import traceback
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, ClassVar

import httpx
import pytest

from orchestrator.core.errors import NoCapacity, ProviderAuthError, ProviderError, ProviderUnsupported, RateLimited
from orchestrator.providers import lambda_cloud, registry, runpod
from orchestrator.providers.base import Provider, classify
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.models import Instance, OfferQuery, ProvisionRequest
from orchestrator.providers.transport import RetryPolicy
from tests.support import toycloud
from tests.support.fakecloud import FakeLambda, FakeRunPod
from tests.support.fakecloud.recording import Recorder, Replay, assert_secret_free, fixture_path, load, save
from tests.support.fakecloud.server import FakeCloud
from tests.support.fakecloud.toy import FakeToy

RECORD = os.environ.get("GPUQ_RECORD_PROVIDER_FIXTURES") == "1"
BAD_KEY = "rpa_WRONG0KEY0that0must0never0be0shown0e5f6"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpx8rWc3fGk7ZqSgpuqF0contractTestKeyOnly gpuq@test"
EVERY_OFFER = OfferQuery()


class Counting(httpx.BaseTransport):
    """Names every request by operation: ``METHOD /path`` below the REST base."""

    def __init__(self, inner: httpx.BaseTransport, rest_path: str) -> None:
        self.inner = inner
        self.rest_path = rest_path
        self.ops: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.ops.append(self.op(request))
        return self.inner.handle_request(request)

    def op(self, request: httpx.Request) -> str:
        return f"{request.method} {request.url.path.removeprefix(self.rest_path)}"

    def close(self) -> None:
        self.inner.close()


class Cloud:
    """One provider under test: the adapter its contract class makes, its injected clock, and the fake's
    controls (or no-ops on a replay)."""

    def __init__(self, answers: ProviderContract, mode: str, test_name: str) -> None:
        self.answers, self.kind, self.mode, self.test_name = answers, answers.kind, mode, test_name
        self.now = 0.0
        self.sleeps: list[float] = []
        self.fake: FakeCloud | None = None
        self.recorder: Recorder | None = None
        self.replay: Replay | None = None
        self.adapters: list[Any] = []
        if mode == "fake":
            self.fake = answers.fake(answers.key).start()
            # plain http to 127.0.0.1: verify=False only skips building a TLS context (0.4 s each)
            inner: httpx.BaseTransport = httpx.HTTPTransport(verify=False)
            if RECORD and "replay" in answers.modes:
                self.recorder = inner = Recorder(inner, answers.base_path)
            self.url = self.fake.url
        else:
            path = fixture_path(self.kind, test_name)
            found = path.is_file()
            self.replay = Replay(load(path) if found else [], answers.base_path, f"{self.kind} replay of {test_name}",
                                 missing=None if found else path)
            inner = self.replay.transport
            self.url = answers.real_url
        self.counter = answers.counting(inner)
        self.provider: Any = self.adapter()

    # -- the adapter ------------------------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def adapter(self, key: str | None = None) -> Any:
        made = self.answers.adapter(ApiKey(key or self.answers.key, self.answers.env_var), url=self.url,
                                    transport=self.counter, min_interval_s=0.0, sleep=self.sleep,
                                    clock=lambda: self.now)
        self.adapters.append(made)
        return made

    def request(self, name: str, **changes: Any) -> ProvisionRequest:
        return ProvisionRequest(name=name, gpu_type=self.answers.gpu_type, ssh_public_key=PUBLIC_KEY, **changes)

    def ops(self, op: str) -> int:
        return sum(1 for o in self.counter.ops if o == op)

    @property
    def create_op(self) -> str:
        return self.answers.create_op

    # -- injections (no-ops on a replay) ----------------------------------------------------------------

    def inject(self, control: str, *args: Any, **kwargs: Any) -> None:
        if self.fake is not None and control not in self.answers.lacks:
            getattr(self.fake, control)(*args, **kwargs)

    def close(self) -> None:
        try:
            if self.recorder is not None and self.recorder.exchanges:
                assert_secret_free(self.recorder.exchanges, [self.answers.key, BAD_KEY])
                save(fixture_path(self.kind, self.test_name), self.kind, self.recorder.exchanges,
                     checked=getattr(type(self.fake), "checked", ""), note=f"{__name__}::{self.test_name}")
            if self.replay is not None:
                self.replay.assert_done()
        finally:
            for made in self.adapters:
                made.close()
            if self.fake is not None:
                self.fake.stop()


def ready_instance(cloud: Cloud, name: str, **changes: Any) -> Instance:
    [instance] = cloud.provider.provision(cloud.request(name, **changes))
    return cloud.provider.wait_ready(instance.id)  # type: ignore[no-any-return]


class ProviderContract:
    """The contract every adapter keeps.  Not collected itself (no ``Test`` prefix): each provider's subclass
    ``Test<Provider>Contract`` sets the class attributes below and :meth:`fake` / :meth:`adapter`."""

    kind: ClassVar[str]  # the registry's name for the provider
    key: ClassVar[str]  # the fake account's API key (never in a recording, a log or an error)
    env_var: ClassVar[str]  # the variable an auth failure names
    gpu_type: ClassVar[str]  # what a request rents and an offer lists
    ssh_user: ClassVar[str]
    create_op: ClassVar[str]  # the one call that creates a machine
    key_writes: ClassVar[tuple[str, ...]] = ()  # the calls that register an SSH key
    removed_behind_our_back: ClassVar[str] = "terminate_externally"  # the fake's control for it
    base_path: ClassVar[str] = ""  # recordings keep paths below it
    rest_path: ClassVar[str] = ""  # operations are named below it
    real_url: ClassVar[str] = ""  # the base URL a replay is played at
    modes: ClassVar[tuple[str, ...]] = ("fake", "replay")
    lacks: ClassVar[frozenset[str]] = frozenset()  # injections its fake does not have (there, no-ops)

    def fake(self, key: str) -> FakeCloud:
        raise NotImplementedError

    def adapter(self, api_key: ApiKey, **common: Any) -> Any:
        raise NotImplementedError

    def counting(self, inner: httpx.BaseTransport) -> Counting:
        return Counting(inner, self.rest_path)

    @pytest.fixture(params=["fake", "replay"])
    def cloud(self, request: pytest.FixtureRequest) -> Iterator[Cloud]:
        mode: str = request.param
        if mode not in self.modes:
            pytest.skip(f"{self.kind} runs the contract only against its {' and '.join(self.modes)}")
        if RECORD and mode == "replay":
            pytest.skip("recording: replays run afterwards")
        made = Cloud(self, mode, request.node.originalname)
        try:
            yield made
        finally:
            made.close()

    def test_is_a_provider(self, cloud: Cloud) -> None:
        assert isinstance(cloud.provider, Provider)
        assert registry.entry(self.kind).adapter_class() is type(cloud.provider)

    def test_offers_carry_prices(self, cloud: Cloud) -> None:
        offers = cloud.provider.list_offers(EVERY_OFFER)
        by_type = {o.gpu_type: o for o in offers}
        offer = by_type[self.gpu_type]
        assert offer.available and offer.gpu_count == 1
        assert offer.price_per_hour is not None and Decimal("0.01") < offer.price_per_hour < Decimal("50")
        assert offer.price_cents_per_hour == int(offer.price_per_hour * 100)
        if cloud.provider.supports_spot:
            assert offer.min_bid_per_gpu is not None and offer.min_bid_per_gpu < offer.price_per_hour
        else:
            assert offer.regions, "the regions with capacity are named"
        cap = offer.price_per_hour - Decimal("0.001")
        assert all((o.price_per_hour or cap) <= cap for o in cloud.provider.list_offers(
            OfferQuery(max_price_per_hour=cap))), "a query's price cap is kept, by the vendor or the adapter"

    def test_provision_then_wait_ready_gives_an_ssh_endpoint(self, cloud: Cloud) -> None:
        cloud.inject("slow_ready", 2)
        [made] = cloud.provider.provision(cloud.request("gpuq-ready"))
        assert made.name == "gpuq-ready" and not made.ready and classify(made) == "pending"
        ready = cloud.provider.wait_ready(made.id)
        assert ready.id == made.id and ready.ready and classify(ready) == "running"
        assert ready.ssh_host and ready.ssh_port and ready.ssh_user == self.ssh_user
        assert ready.gpu_count == 1 and ready.price_per_hour and ready.price_per_hour > 0
        assert cloud.sleeps, "not ready on the first polls: the wait polled and slept"
        assert cloud.ops(cloud.create_op) == 1

    def test_provision_is_idempotent_by_name(self, cloud: Cloud) -> None:
        [first] = cloud.provider.provision(cloud.request("gpuq-once"))
        [again] = cloud.provider.provision(cloud.request("gpuq-once"))
        assert again.id == first.id
        assert cloud.ops(cloud.create_op) == 1
        assert [i.id for i in cloud.provider.list_instances() if i.name == "gpuq-once"] == [first.id]

    def test_create_that_failed_client_side_is_adopted_not_repeated(self, cloud: Cloud) -> None:
        cloud.inject("fail_after_create", 1, status=429, retry_after=2)
        [made] = cloud.provider.provision(cloud.request("gpuq-leak"))
        assert cloud.ops(cloud.create_op) == 1, "no second create after a create that may have succeeded"
        assert [i.id for i in cloud.provider.list_instances() if i.name == "gpuq-leak"] == [made.id]

    def test_several_machines_are_created_one_call_each(self, cloud: Cloud) -> None:
        made = cloud.provider.provision(cloud.request("gpuq-many", count=2))
        assert [m.name for m in made] == ["gpuq-many-0", "gpuq-many-1"] and made[0].id != made[1].id
        assert cloud.ops(cloud.create_op) == 2

    def test_terminate_then_gone_and_terminate_is_idempotent(self, cloud: Cloud) -> None:
        cloud.inject("terminate_lag", 1)
        instance = ready_instance(cloud, "gpuq-term")
        cloud.provider.terminate(instance.id)
        cloud.provider.wait_gone(instance.id)
        after = cloud.provider.get(instance.id)
        assert after is None or after.gone
        cloud.provider.terminate(instance.id)
        assert all(i.id != instance.id or i.gone for i in cloud.provider.list_instances())

    def test_unknown_instance_is_none(self, cloud: Cloud) -> None:
        assert cloud.provider.get("nosuchinstance0") is None
        cloud.provider.terminate("nosuchinstance0")

    def test_stop_is_a_manual_stop_or_unsupported(self, cloud: Cloud) -> None:
        instance = ready_instance(cloud, "gpuq-stop")
        if not cloud.provider.supports_stop:
            with pytest.raises(ProviderUnsupported, match="no stop"):
                cloud.provider.stop(instance.id)
            return
        cloud.provider.stop(instance.id)
        stopped = cloud.provider.get(instance.id)
        assert stopped is not None and stopped.state in ("exited", "stopped") and not stopped.ready
        assert classify(stopped) == "manual_stop"

    def test_spot_preemption_is_classified_and_bid_resume_brings_a_new_endpoint(self, cloud: Cloud) -> None:
        if not cloud.provider.supports_spot:
            with pytest.raises(ProviderUnsupported, match="no spot"):
                cloud.provider.provision(cloud.request("gpuq-spot", spot=True))
            with pytest.raises(ProviderUnsupported, match="no spot"):
                cloud.provider.list_offers(OfferQuery(spot=True))
            assert cloud.ops(cloud.create_op) == 0
            return
        instance = ready_instance(cloud, "gpuq-spot", spot=True)
        assert instance.spot
        cloud.inject("preempt", instance.id)
        preempted = cloud.provider.get(instance.id)
        assert preempted is not None and preempted.reason.startswith("Outbid")
        assert classify(preempted) == "spot_preemption" and not preempted.ready
        cloud.provider.resume(instance.id, gpu_count=1, bid_per_gpu=Decimal("0.30"))
        back = cloud.provider.wait_ready(instance.id)
        assert (back.ssh_host, back.ssh_port) != (instance.ssh_host, instance.ssh_port)

    def test_platform_stop_or_unhealthy_is_a_host_failure(self, cloud: Cloud) -> None:
        instance = ready_instance(cloud, "gpuq-fail")
        cloud.inject("host_failure", instance.id)
        failed = cloud.provider.get(instance.id)
        assert failed is not None and classify(failed) == "host_failure"

    def test_terminated_behind_our_back_is_a_host_failure(self, cloud: Cloud) -> None:
        instance = ready_instance(cloud, "gpuq-gone")
        cloud.inject(self.removed_behind_our_back, instance.id)
        assert classify(cloud.provider.get(instance.id)) == "host_failure"

    def test_resume_with_zero_gpus_is_a_host_failure(self, cloud: Cloud) -> None:
        if not cloud.provider.supports_stop:
            with pytest.raises(ProviderUnsupported, match="resume"):
                cloud.provider.resume("nosuchinstance0", gpu_count=1)
            return
        instance = ready_instance(cloud, "gpuq-zero")
        cloud.provider.stop(instance.id)
        cloud.inject("zero_gpus_on_resume", instance.id)
        cloud.provider.resume(instance.id, gpu_count=1)
        back = cloud.provider.get(instance.id)
        assert back is not None and back.gpu_count == 0 and classify(back) == "host_failure"

    def test_no_capacity_is_its_own_error_and_creates_nothing(self, cloud: Cloud) -> None:
        cloud.inject("no_capacity", 1)
        with pytest.raises(NoCapacity) as caught:
            cloud.provider.provision(cloud.request("gpuq-cap"))
        assert "capacity" in str(caught.value).lower() or "no longer any instances" in str(caught.value)
        assert cloud.provider.list_instances() == []
        [made] = cloud.provider.provision(cloud.request("gpuq-cap"))
        assert made.name == "gpuq-cap"

    def test_429_is_retried_honouring_retry_after(self, cloud: Cloud) -> None:
        cloud.inject("rate_limit", 2, retry_after=3)
        assert cloud.provider.list_offers(EVERY_OFFER)
        assert cloud.sleeps == [3.0, 3.0]
        assert len(cloud.counter.ops) == 3

    def test_429_without_retry_after_backs_off_exponentially(self, cloud: Cloud) -> None:
        cloud.inject("rate_limit", 3, retry_after=None)
        assert cloud.provider.list_offers(EVERY_OFFER)
        policy = cloud.provider.http.policy
        assert cloud.sleeps == [policy.first_delay_s, policy.first_delay_s * 2, policy.first_delay_s * 4]

    def test_429_gives_up_after_bounded_tries(self, cloud: Cloud) -> None:
        cloud.inject("rate_limit", 10, retry_after=1)
        with pytest.raises(RateLimited, match="429"):
            cloud.provider.list_offers(EVERY_OFFER)
        tries = cloud.provider.http.policy.tries
        assert len(cloud.counter.ops) == tries and cloud.sleeps == [1.0] * (tries - 1)

    def test_auth_failure_names_the_variable_and_never_the_key(self, cloud: Cloud,
                                                                caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        bad = cloud.adapter(BAD_KEY)
        with pytest.raises(ProviderAuthError) as caught:
            bad.list_offers(EVERY_OFFER)
        err = caught.value
        assert self.env_var in str(err) and "rejected" in str(err)
        shown = [str(err), repr(err), repr(bad), repr(bad.http), caplog.text,
                 "".join(traceback.format_exception(type(err), err, err.__traceback__))]
        assert not any(BAD_KEY in text for text in shown)
        assert len(cloud.counter.ops) == 1, "an auth failure is not retried"

    def test_the_key_never_reaches_logs_reprs_or_errors(self, cloud: Cloud, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        cloud.inject("rate_limit", 1, retry_after=1)
        instance = ready_instance(cloud, "gpuq-quiet")
        cloud.provider.terminate(instance.id)
        assert self.key not in caplog.text and self.key not in repr(cloud.provider) and self.key not in repr(instance)
        assert caplog.records, "the adapter logs its requests at DEBUG"

    def test_ssh_key_registration_is_append_only_and_idempotent(self, cloud: Cloud) -> None:
        first = cloud.provider.ensure_ssh_key(PUBLIC_KEY)
        again = cloud.provider.ensure_ssh_key(PUBLIC_KEY + "  ")
        assert first == again and first.startswith("gpuq-")
        writes = [o for o in cloud.counter.ops if o in self.key_writes]
        assert len(writes) == 1


class TestRunPodContract(ProviderContract):
    kind = "runpod"
    key = "rpa_CONTRACT0TEST0KEY0do0not0leak0a1b2"
    env_var = "RUNPOD_API_KEY"
    gpu_type = "NVIDIA RTX A6000"
    ssh_user = "root"
    create_op = "POST /pods"
    key_writes = ("PUT /account/ssh-keys",)
    removed_behind_our_back = "remove"
    rest_path = "/v2"  # recordings keep the whole path, /v2/...
    real_url = "https://api.runpod.io/v2"

    def fake(self, key: str) -> FakeCloud:
        return FakeRunPod(api_key=key)

    def adapter(self, api_key: ApiKey, **common: Any) -> Any:
        return runpod.RunPodProvider(api_key, policy=dataclasses.replace(runpod.RETRY, jitter=0.0), **common)

    def test_a_problem_answer_is_quoted_and_not_retried(self, cloud: Cloud) -> None:
        """RunPod v2's RFC 9457 problem objects."""
        cloud.inject("rest_error", "Something went wrong. Please try again later.", operation="GET /catalog",
                     status=400)
        with pytest.raises(ProviderError, match="HTTP 400: Something went wrong") as caught:
            cloud.provider.list_offers(EVERY_OFFER)
        assert not isinstance(caught.value, NoCapacity) and caught.value.status == 400
        assert len(cloud.counter.ops) == 1
        assert cloud.provider.list_offers(EVERY_OFFER)

    def test_an_unknown_gpu_type_is_refused_before_a_create(self, cloud: Cloud) -> None:
        """RunPod's catalog names every GPU type a create may ask for."""
        with pytest.raises(ProviderError, match="unknown GPU type"):
            cloud.provider.provision(ProvisionRequest(name="gpuq-bad", gpu_type="NVIDIA Imaginary 9000"))
        assert cloud.ops(cloud.create_op) == 0


class TestLambdaContract(ProviderContract):
    kind = "lambda"
    key = "secret_contract-test-key.do-not-leak.c3d4"
    env_var = "LAMBDA_API_KEY"
    gpu_type = "gpu_1x_a10"
    ssh_user = "ubuntu"
    create_op = "POST /instance-operations/launch"
    key_writes = ("POST /ssh-keys",)
    base_path = rest_path = "/api/v1"
    real_url = "https://cloud.lambda.ai/api/v1"

    def fake(self, key: str) -> FakeCloud:
        return FakeLambda(api_key=key)

    def adapter(self, api_key: ApiKey, **common: Any) -> Any:
        return lambda_cloud.LambdaProvider(api_key, policy=dataclasses.replace(lambda_cloud.RETRY, jitter=0.0),
                                           launch_interval_s=0.0, **common)


class TestToyContract(ProviderContract):
    """The tests' plugin provider (tests/support/toycloud.py): a seam test, not a cloud.  Its fake has no
    recordings and no injections but 429s, and its adapter is only what `gpuq up`/`down` need; the tests it
    cannot keep say so."""

    kind = "toy"
    key = "toy_CONTRACT0TEST0KEY0do0not0leak0g9h0"
    env_var = "TOY_API_KEY"
    gpu_type = "toy-1"
    ssh_user = "root"
    create_op = "POST /machines"
    rest_path = "/toy"
    modes = ("fake",)
    lacks = frozenset({"slow_ready", "terminate_lag"})

    @pytest.fixture(autouse=True)
    def plugged(self) -> Iterator[None]:
        registry.register(toycloud.PROVIDER)
        try:
            yield
        finally:
            registry.unregister("toy")

    def fake(self, key: str) -> FakeCloud:
        return FakeToy(api_key=key)

    def adapter(self, api_key: ApiKey, **common: Any) -> Any:
        return toycloud.ToyProvider(api_key, policy=RetryPolicy(jitter=0.0), **common)

    def test_offers_carry_prices(self, cloud: Cloud) -> None:
        """The toy's shapes name no regions."""
        offers = {o.gpu_type: o for o in cloud.provider.list_offers(EVERY_OFFER)}
        assert offers[self.gpu_type].price_per_hour == Decimal("0.11") and offers[self.gpu_type].gpu_count == 1
        assert [o.gpu_type for o in cloud.provider.list_offers(OfferQuery(gpu_count=2))] == ["toy-2"]
        assert cloud.provider.list_offers(OfferQuery(max_price_per_hour=Decimal("0.10"))) == []

    def test_provision_then_wait_ready_gives_an_ssh_endpoint(self, cloud: Cloud) -> None:
        """The toy's machines are up at once: no polling to see."""
        [made] = cloud.provider.provision(cloud.request("gpuq-ready"))
        ready = cloud.provider.wait_ready(made.id)
        assert ready.id == made.id and ready.ready and ready.ssh_user == self.ssh_user
        assert cloud.ops(cloud.create_op) == 1

    def test_the_key_never_reaches_logs_reprs_or_errors(self, cloud: Cloud, caplog: pytest.LogCaptureFixture) -> None:
        """The toy's create is one call, never retried: no 429 before it."""
        caplog.set_level(logging.DEBUG)
        instance = ready_instance(cloud, "gpuq-quiet")
        cloud.provider.terminate(instance.id)
        assert self.key not in caplog.text and self.key not in repr(cloud.provider) and self.key not in repr(instance)
        assert caplog.records, "the adapter logs its requests at DEBUG"

    @pytest.mark.skip(reason="the toy adapter creates by name without adopting (a plugin seam test, not a cloud)")
    def test_provision_is_idempotent_by_name(self, cloud: Cloud) -> None: ...

    @pytest.mark.skip(reason="the toy fake has no injection of a create that fails after it was made")
    def test_create_that_failed_client_side_is_adopted_not_repeated(self, cloud: Cloud) -> None: ...

    @pytest.mark.skip(reason="the toy fake has no platform stop, no removal behind gpuq's back")
    def test_platform_stop_or_unhealthy_is_a_host_failure(self, cloud: Cloud) -> None: ...

    @pytest.mark.skip(reason="the toy fake has no platform stop, no removal behind gpuq's back")
    def test_terminated_behind_our_back_is_a_host_failure(self, cloud: Cloud) -> None: ...

    @pytest.mark.skip(reason="the toy fake never runs out of capacity")
    def test_no_capacity_is_its_own_error_and_creates_nothing(self, cloud: Cloud) -> None: ...

    @pytest.mark.skip(reason="the toy fake's hosts already trust the test farm's key: nothing is registered")
    def test_ssh_key_registration_is_append_only_and_idempotent(self, cloud: Cloud) -> None: ...


def contract_classes() -> dict[str, type[ProviderContract]]:
    """Every provider's contract class, by provider: this module's and those of the adapters' own test modules
    (``tests/unit/test_provider_*.py``: vast.ai's), all imported under ``tests.unit`` so that they share one
    :class:`ProviderContract` (pytest may import this file under its bare name as well)."""
    import importlib
    import pkgutil
    from pathlib import Path

    base = importlib.import_module("tests.unit.test_providers_contract").ProviderContract
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("test_provider_"):
            importlib.import_module(f"tests.unit.{info.name}")
    found: dict[str, type[ProviderContract]] = {}
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__name__.startswith("Test"):
            found[cls.kind] = cls
    return found


def test_every_provider_in_the_registry_runs_the_contract() -> None:
    """A provider added to the registry (built in, or plugged in as the toy is) without a contract subclass
    fails here."""
    registry.register(toycloud.PROVIDER)
    try:
        names = set(registry.names())
    finally:
        registry.unregister("toy")
    covered = contract_classes()
    assert {"runpod", "lambda", "vastai", "toy"} <= names
    assert names <= set(covered), f"no contract subclass for {sorted(names - set(covered))}"
    for name, cls in covered.items():
        assert cls.kind == name and cls.modes and set(cls.modes) <= {"fake", "replay"}
