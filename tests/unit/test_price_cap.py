"""A price cap reaches the create (`gpuq up --max-price`, and every `up` of `gpuq up --for`;
providers/base.check_price_cap): each adapter reads the machine's price from its provider before it creates
anything and refuses a dearer one with NoCapacity, nothing created.  On vast.ai, a marketplace, the cap also
decides which offer replaces one another renter took meanwhile.  Run against the loopback fakes."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.core.errors import NoCapacity
from orchestrator.providers.lambda_cloud import LambdaProvider
from orchestrator.providers.models import OfferQuery, ProvisionRequest
from orchestrator.providers.runpod import RunPodProvider
from orchestrator.providers.vastai import VastAIProvider
from tests.conftest import run_gpuq
from tests.support.fakecloud import FakeLambda, FakeRunPod
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import FakeOffer

KEY = "price-cap-key-0123456789"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPriceCapTestKeyOnly0000000000000000000000 gpuq@test"
A100S = (FakeOffer(7001, "A100 SXM4", 1, 81920, 1.30, 0.70), FakeOffer(7002, "A100 SXM4", 1, 81920, 1.90, 0.75))


def _request(gpu_type: str, cap: str | None, *, spot: bool = False) -> ProvisionRequest:
    return ProvisionRequest(name="gpuq-pricecap-0", gpu_type=gpu_type, spot=spot, ssh_public_key=PUBLIC_KEY,
                            max_price_per_hour=Decimal(cap) if cap is not None else None)


@pytest.fixture
def vast() -> Iterator[tuple[FakeVastAI, VastAIProvider]]:
    with FakeVastAI(api_key=KEY, offers=A100S) as fake:
        prov = VastAIProvider.from_env({"VAST_API_KEY": KEY, "GPUQ_VASTAI_API_URL": fake.url}, min_interval_s=0.0)
        try:
            yield fake, prov
        finally:
            prov.close()


def test_vastai_replaces_a_taken_offer_only_by_one_under_the_cap(vast: tuple[FakeVastAI, VastAIProvider]) -> None:
    fake, prov = vast
    fake.race(1)  # the $1.30 offer goes to another renter just before gpuq's create arrives
    with pytest.raises(NoCapacity):
        prov.provision(_request("A100 SXM4", "1.50"))
    assert not fake.instances  # the $1.90 one was not taken in its place
    (made,) = prov.provision(_request("A100 SXM4", None))  # without a cap the next offer is rented
    assert fake.instances[int(made.id)].offer.id == 7002


def test_vastai_refuses_when_every_offer_is_above_the_cap(vast: tuple[FakeVastAI, VastAIProvider]) -> None:
    fake, prov = vast
    with pytest.raises(NoCapacity, match=r"costs \$0\.7/h spot now, above the cap of \$0\.5/h"):
        prov.provision(_request("A100 SXM4", "0.5", spot=True))  # the cheapest minimum bid is $0.70
    with pytest.raises(NoCapacity, match=r"above the cap of \$1\.2/h"):
        prov.provision(_request("A100 SXM4", "1.2"))
    assert not fake.instances
    (made,) = prov.provision(_request("A100 SXM4", "0.72", spot=True))
    inst = fake.instances[int(made.id)]
    assert inst.offer.id == 7001 and inst.bid is not None and 0.70 <= inst.bid <= 0.72  # never bids past the cap


def test_runpod_reads_the_price_before_it_creates() -> None:
    with FakeRunPod(api_key=KEY) as fake:
        gpu = next(iter(fake.gpu_types.values()))
        prov = RunPodProvider.from_env({"RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": fake.url}, min_interval_s=0.0)
        try:
            below = Decimal(str(gpu.secure_price)) - Decimal("0.01")
            with pytest.raises(NoCapacity, match="above the cap"):
                prov.provision(_request(gpu.id, str(below)))
            assert not fake.pods
            prov.provision(_request(gpu.id, str(gpu.secure_price)))  # at the price: rented
            assert len(fake.pods) == 1
        finally:
            prov.close()


def test_runpod_offers_quote_the_cloud_gpuq_rents_in() -> None:
    """An offer's price is what the pod gpuq would create costs (the Secure cloud's), not RunPod's lowest
    across clouds (the community cloud's is lower): a plan made under a cap from the offers is one the create
    accepts, and one just under the offer's price is refused."""
    with FakeRunPod(api_key=KEY) as fake:
        prov = RunPodProvider.from_env({"RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": fake.url}, min_interval_s=0.0)
        try:
            offers = {o.gpu_type: o for o in prov.list_offers(OfferQuery(gpu_count=2))}
            for gpu in fake.gpu_types.values():
                assert gpu.community_price < gpu.secure_price  # the lowest price is not the rented cloud's
                offer = offers[gpu.id]
                assert offer.price_per_hour == Decimal(str(gpu.secure_price)) * 2
                assert offer.spot_price_per_hour is None and offer.min_bid_per_gpu is None  # v2 prices no spot
            gpu = next(iter(fake.gpu_types.values()))
            quoted = offers[gpu.id].price_per_hour
            assert quoted is not None
            with pytest.raises(NoCapacity, match="above the cap"):
                prov.provision(ProvisionRequest(name="gpuq-pricecap-1", gpu_type=gpu.id, gpu_count=2,
                                                ssh_public_key=PUBLIC_KEY, max_price_per_hour=quoted - Decimal("0.01")))
            assert not fake.pods
            prov.provision(ProvisionRequest(name="gpuq-pricecap-1", gpu_type=gpu.id, gpu_count=2,
                                            ssh_public_key=PUBLIC_KEY, max_price_per_hour=quoted))
            assert len(fake.pods) == 1
        finally:
            prov.close()


def test_lambda_reads_the_price_before_it_launches() -> None:
    with FakeLambda(api_key=KEY) as fake:
        itype = next(t for t in fake.types.values() if t.regions)
        prov = LambdaProvider.from_env({"LAMBDA_API_KEY": KEY, "GPUQ_LAMBDA_API_URL": fake.url}, min_interval_s=0.0,
                                       launch_interval_s=0.0)
        try:
            with pytest.raises(NoCapacity, match="above the cap"):
                prov.provision(_request(itype.name, str(Decimal(itype.price_cents - 1) / 100)))
            assert not fake.instances
            prov.provision(_request(itype.name, str(Decimal(itype.price_cents) / 100)))
            assert len(fake.instances) == 1
        finally:
            prov.close()


@pytest.mark.parametrize(("args", "said"), [
    (("--max-price", "abc"), "--max-price 'abc': give a number more than 0"),
    (("--max-price", "-1"), "--max-price '-1': give a number more than 0"),
    (("--retry-until", "1h"), "--retry-until and --dry-run go with --for QUEUE"),
])
def test_a_bad_cap_on_up_is_one_line_and_exit_2_before_any_provider_is_asked(
        gpuq_home: Path, args: tuple[str, ...], said: str) -> None:
    done = run_gpuq("up", "--provider", "runpod", "--gpu", "NVIDIA GeForce RTX 4090", *args,
                    env={"GPUQ_HOME": str(gpuq_home), "RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": "http://127.0.0.1:9"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
