"""The vast.ai adapter's own rules: its status table, typed and bounded parsing of vast.ai's JSON, the
marketplace (cheapest offer first, filters, bids, an offer taken meanwhile, capacity that comes later),
direct SSH before the proxy, and the key kept out of errors.  Against the fake vast.ai (tests/support/fakecloud)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from orchestrator.core.errors import NoCapacity, ProviderError
from orchestrator.money import rentplan
from orchestrator.providers import vastai
from orchestrator.providers import vastai_wire as wire
from orchestrator.providers.base import classify
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.models import OfferQuery, ProvisionRequest
from orchestrator.providers.polling import PollPolicy
from orchestrator.scheduling.gpumatch import GpuNeed, host_matches
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import DEFAULT_OFFERS, FakeOffer

KEY = "vast_WIRE0TEST0KEY0never0shown0c9d0"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIWireTestKeyOnly gpuq@test"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def adapter(url: str, transport: httpx.BaseTransport, clock: Clock, **kw: Any) -> vastai.VastAIProvider:
    return vastai.VastAIProvider(ApiKey(KEY, "VAST_API_KEY"), url=url, transport=transport, min_interval_s=0.0,
                                 sleep=clock.sleep, clock=lambda: clock.now, **kw)


@pytest.fixture
def fake() -> Iterator[FakeVastAI]:
    with FakeVastAI(api_key=KEY) as cloud:
        yield cloud


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def vast(fake: FakeVastAI, clock: Clock) -> Iterator[vastai.VastAIProvider]:
    made = adapter(fake.url, httpx.HTTPTransport(verify=False), clock)
    yield made
    made.close()


def row(**changes: Any) -> wire.WireInstance:
    base: dict[str, Any] = {"id": 7, "label": "gpuq-x", "actual_status": "running", "intended_status": "running",
                            "is_bid": False, "public_ipaddr": "198.51.100.7",
                            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]},
                            "ssh_host": "ssh4.vast.ai", "ssh_port": 10007, "num_gpus": 1, "dph_total": 0.4}
    return wire.WireInstance.model_validate({**base, **changes})


# -- the status table ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("intended", "actual", "is_bid", "state", "verdict"), [
    ("running", "running", False, "running", "running"),
    ("running", None, False, "pending", "pending"),
    ("running", "loading", True, "pending", "pending"),
    ("running", "stopped", True, "exited", "spot_preemption"),  # outbid: paused, intended still running
    ("running", "exited", True, "exited", "spot_preemption"),
    ("running", "exited", False, "exited", "unknown"),  # the container died on its own: escalate
    ("running", "stopped", False, "pending", "pending"),  # started again, waiting for its GPU (VAST3)
    ("stopped", "stopped", True, "stopped", "manual_stop"),  # the user's stop, interruptible or not
    ("stopped", "running", False, "stopped", "manual_stop"),
    ("running", "offline", False, "unhealthy", "host_failure"),
    ("running", "unknown", True, "unhealthy", "host_failure"),
    ("running", "hibernating", False, "pending", "unknown"),  # a status gpuq does not know
])
def test_vast_statuses_map_to_gpuq_states(intended: str, actual: str | None, is_bid: bool, state: str,
                                          verdict: str) -> None:
    made = wire.instance_of(row(intended_status=intended, actual_status=actual, is_bid=is_bid))
    assert (made.state, classify(made)) == (state, verdict)
    assert made.ready == (verdict == "running")
    assert (made.ssh_host is not None) == (verdict == "running")


def test_destroyed_by_gpuq_but_still_listed_is_terminating() -> None:
    made = wire.instance_of(row(actual_status="exited", intended_status="stopped"), destroyed=True)
    assert made.state == "terminating" and classify(made) == "host_failure" and not made.gone


def test_ports_in_another_form_give_no_direct_endpoint_and_no_error() -> None:
    """vast.ai's OpenAPI document calls ``ports`` a list of port numbers; the client reads a Docker port map."""
    made = wire.instance_of(row(ports=[8080, 22]))
    assert (made.ssh_host, made.ssh_port) == ("ssh4.vast.ai", 10007) and wire.via_proxy(made)


def test_direct_ssh_first_then_the_proxy_only_when_allowed() -> None:
    direct = wire.instance_of(row())
    assert (direct.ssh_host, direct.ssh_port, direct.ssh_user) == ("198.51.100.7", 41022, "root")
    assert not wire.via_proxy(direct)
    no_ports = row(ports={})
    assert wire.instance_of(no_ports, allow_proxy=False).ssh_host is None
    proxied = wire.instance_of(no_ports)
    assert (proxied.ssh_host, proxied.ssh_port) == ("ssh4.vast.ai", 10007) and wire.via_proxy(proxied)


# -- parsing at the edge -------------------------------------------------------------------------------------


def test_types_are_strict_and_extra_fields_ignored() -> None:
    assert row(some_new_field={"x": 1}).id == 7
    with pytest.raises(ProviderError, match=r"instances\.num_gpus") as caught:
        wire.parse(wire.WireOneInstance, {"instances": {"id": 7, "num_gpus": "1"}}, "GET x")
    assert caught.value.code == "bad-response" and "'1'" not in str(caught.value)
    with pytest.raises(ProviderError, match="new_contract"):
        wire.parse(wire.WireCreated, {"success": True, "new_contract": "123"}, "PUT x")


def test_host_text_is_one_bounded_printable_line() -> None:
    made = wire.instance_of(row(actual_status="exited", status_msg="\x1b[31mboom\x1b[0m\nline2\r\n" + "x" * 900))
    assert "\n" not in made.reason and "\x1b" not in made.reason and len(made.reason) < wire.MAX_TEXT + 80
    assert "boom" in made.reason and made.reason.endswith("...)")


@pytest.mark.parametrize("changes", [
    {"public_ipaddr": "198.51.100.7; rm -rf /", "ssh_host": None},
    {"public_ipaddr": "-oProxyCommand=evil", "ssh_host": "-oProxyCommand=evil"},
    {"ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "99999"}]}, "ssh_host": None},
    {"ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "0"}]}, "ssh_host": "ssh 4.vast.ai"},
])
def test_an_address_that_is_not_one_gives_no_endpoint(changes: dict[str, Any]) -> None:
    try:
        made = wire.instance_of(row(**changes))
    except ValueError:
        return  # refused while parsing is as good
    assert made.ssh_host is None and not made.ready and classify(made) == "pending"


# -- the marketplace ------------------------------------------------------------------------------------------


def test_offers_are_cheapest_first_and_filtered(vast: vastai.VastAIProvider) -> None:
    offers = vast.list_offers(OfferQuery())
    prices = [o.price_per_hour or 0 for o in offers]
    assert prices == sorted(prices) and len(offers) >= 4
    assert all(o.gpu_count == 1 and o.available for o in offers)
    shown = " ".join(o.display_name for o in offers)
    assert "offer 5003" not in shown, "no direct SSH port: filtered"
    assert "offer 5004" not in shown, "reliability 0.80: filtered"
    assert {o.gpu_type for o in offers} >= {"RTX 4090", "RTX A6000", "A100 SXM4"}
    big = {o.gpu_type: o for o in vast.list_offers(OfferQuery(gpu_count=2, gpu_name="H100 SXM"))}["H100 SXM"]
    assert big.min_bid_per_gpu == Decimal("1.3")
    assert vast.list_offers(OfferQuery(gpu_count=1, min_gpu_memory_gb=48)) and all(
        (o.gpu_memory_gb or 0) >= 48 for o in vast.list_offers(OfferQuery(gpu_count=1, min_gpu_memory_gb=48)))


def test_an_offers_memory_answers_gpu_mem_as_the_rented_host_will(vast: vastai.VastAIProvider) -> None:
    """vast.ai's gpu_ram is the machine's memory.total in MiB: the offer's GB figure says yes to `gpu_mem=N`
    exactly when the host, once rented and probed, does (gpumatch.host_matches), so `gpuq up --for` neither
    passes over a machine its jobs would run on nor rents one they would not (an A10's 23,028 MiB is 24 GB)."""
    market = {o.id: o for o in DEFAULT_OFFERS}
    offers = vast.list_offers(OfferQuery()) + vast.list_offers(OfferQuery(gpu_count=2))
    assert offers
    for offer in offers:
        mib = market[int(offer.display_name.rsplit("offer ", 1)[1].rstrip(")"))].gpu_ram_mb
        for n in range(1, 120):
            need = GpuNeed((), float(n))
            assert rentplan.memory_ok(offer, n) == host_matches(need, (offer.gpu_type,), mib), (offer, n)
    a10 = wire.offer_of(wire.WireOffer.model_validate({**DEFAULT_OFFERS[0].row(10), "gpu_name": "A10",
                                                       "gpu_ram": 23028}))
    assert rentplan.memory_ok(a10, 24) and not rentplan.memory_ok(a10, 25)


def test_the_cheapest_offer_is_rented_and_an_interruptible_one_at_its_bid(vast: vastai.VastAIProvider,
                                                                           fake: FakeVastAI) -> None:
    [demand] = vast.provision(ProvisionRequest("gpuq-d", "RTX 4090", ssh_public_key=PUB))
    [spot] = vast.provision(ProvisionRequest("gpuq-s", "RTX 4090", spot=True, ssh_public_key=PUB))
    cheapest, next_one = (o for o in DEFAULT_OFFERS if o.id in (5001, 5002))
    assert fake.instances[int(demand.id)].offer.id == cheapest.id and fake.instances[int(demand.id)].bid is None
    rented = fake.instances[int(spot.id)]
    assert rented.offer.id == next_one.id and rented.bid == pytest.approx(next_one.min_bid + 0.01)
    assert spot.spot and spot.price_per_hour is not None and spot.price_per_hour < Decimal(str(next_one.dph_total))
    assert PUB in rented.ssh_keys and [k["ssh_key"] for k in fake.ssh_keys] == [PUB]


def test_a_bid_ceiling_below_every_minimum_rents_nothing(vast: vastai.VastAIProvider, fake: FakeVastAI) -> None:
    with pytest.raises(NoCapacity, match="interruptible"):
        vast.provision(ProvisionRequest("gpuq-low", "RTX 4090", spot=True, bid_per_gpu=Decimal("0.05"),
                                        ssh_public_key=PUB))
    assert fake.instances == {} and not fake.requests("PUT /api/v0/asks/{id}/")


def test_an_offer_taken_meanwhile_moves_to_the_next(vast: vastai.VastAIProvider, fake: FakeVastAI) -> None:
    fake.race(1)
    [made] = vast.provision(ProvisionRequest("gpuq-race", "RTX 4090", ssh_public_key=PUB))
    assert fake.instances[int(made.id)].offer.id == 5002
    assert [e["status"] for e in fake.requests("PUT /api/v0/asks/{id}/")] == [410, 200]


def test_capacity_that_appears_after_polls(vast: vastai.VastAIProvider, fake: FakeVastAI) -> None:
    fake.no_capacity(2)
    for _ in range(2):
        with pytest.raises(NoCapacity, match="capacity"):
            vast.provision(ProvisionRequest("gpuq-later", "RTX A6000", ssh_public_key=PUB))
    [made] = vast.provision(ProvisionRequest("gpuq-later", "RTX A6000", ssh_public_key=PUB))
    assert made.gpu_type == "RTX A6000" and len(fake.instances) == 1


def test_the_proxy_endpoint_only_after_waiting_for_a_direct_one(fake: FakeVastAI, clock: Clock) -> None:
    fake.no_direct()
    vast = adapter(fake.url, httpx.HTTPTransport(verify=False), clock, proxy_after_s=30.0,
                   ready=PollPolicy(timeout_s=100, first_s=5, max_s=5))
    try:
        [made] = vast.provision(ProvisionRequest("gpuq-proxy", "RTX 4090", ssh_public_key=PUB))
        started = clock.now
        ready = vast.wait_ready(made.id)
        assert wire.via_proxy(ready) and ready.ssh_port and clock.now - started >= 30.0
    finally:
        vast.close()


def test_instances_are_listed_across_pages(clock: Clock) -> None:
    offers = tuple(FakeOffer(6000 + i, "RTX 4090", 1, 24564, 0.30 + i / 1000, 0.2) for i in range(27))
    with FakeVastAI(api_key=KEY, offers=offers) as fake:
        vast = adapter(fake.url, httpx.HTTPTransport(verify=False), clock)
        try:
            made = vast.provision(ProvisionRequest("gpuq-many", "RTX 4090", count=27, ssh_public_key=PUB))
            listed = vast.list_instances()
            assert sorted(i.id for i in listed) == sorted(m.id for m in made)
            assert len(fake.requests("GET /api/v1/instances/")) >= 2 + 1  # the adopt check's list, then 2 pages
        finally:
            vast.close()


def test_terminate_is_remembered_while_vast_still_lists_it(vast: vastai.VastAIProvider, fake: FakeVastAI) -> None:
    fake.terminate_lag(2)
    [made] = vast.provision(ProvisionRequest("gpuq-lag", "RTX 4090", ssh_public_key=PUB))
    vast.terminate(made.id)
    still = vast.get(made.id)
    assert still is not None and still.state == "terminating"
    vast.wait_gone(made.id)
    assert vast.get(made.id) is None
    vast.terminate(made.id)  # idempotent: vast.ai answers 404 now


def test_ids_are_numbers(vast: vastai.VastAIProvider, fake: FakeVastAI) -> None:
    assert vast.get("../ssh") is None and vast.get("i-123") is None
    with pytest.raises(ProviderError, match=r"not a vast\.ai instance id"):
        vast.stop("1/../2")
    assert fake.requests() == []


def test_the_key_is_scrubbed_from_vast_error_text(clock: Clock) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"success": False, "error": "invalid_args",
                                         "msg": f"bad request for key {KEY} (url ?api_key={KEY})"})

    vast = adapter("https://console.vast.ai", httpx.MockTransport(answer), clock)
    try:
        with pytest.raises(ProviderError) as caught:
            vast.list_offers(OfferQuery())
    finally:
        vast.close()
    assert KEY not in str(caught.value) and "***" in str(caught.value) and caught.value.code == "invalid_args"


def test_stopped_still_bills_and_terminate_is_the_meter_stop() -> None:
    caps = vastai.VastAIProvider.capabilities
    assert caps.stop_bills_storage is True
    assert caps.spot and caps.stop and caps.rebid
    assert vastai.VastAIProvider.supports_stop and vastai.VastAIProvider.supports_spot
