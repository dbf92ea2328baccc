"""`gpuq offers` and `gpuq up --for` on a mixed farm: the fake vast.ai's market of different GPU models,
memory sizes and prices (orchestrator/money/rentplan.py, api/offers.py, api/renting_for.py).  No machine is
rented here (that needs SSH hosts: tests/integration/test_cloud.py rents with `up --for`); what is checked is
which offers a queue's lines take, the price cap, the wait for capacity, and what the CLI says."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.api.offers import scan_offers
from orchestrator.api.renting_for import plan_for, up_for
from orchestrator.context import Context, open_context
from orchestrator.core.errors import UsageError
from orchestrator.core.specs import JobSpec
from orchestrator.money import rentplan
from orchestrator.providers.models import Offer
from orchestrator.scheduling.gpumatch import GpuNeed
from tests.conftest import run_gpuq
from tests.support.fakecloud import FakeRunPod
from tests.support.fakecloud.backend import AddressBackend
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import FakeOffer

KEY = "vast-rentfor-key-0123456789"
MARKET = (
    FakeOffer(6001, "RTX 4090", 1, 24564, 0.35, 0.20),
    FakeOffer(6002, "A100 PCIE", 1, 40960, 0.80, 0.45),
    FakeOffer(6003, "A100 SXM4", 1, 81920, 1.30, 0.70),
    FakeOffer(6004, "H100 PCIE", 1, 81559, 2.10, 1.40),
    FakeOffer(6005, "H100 SXM", 1, 81559, 2.60, 1.10),
    FakeOffer(6006, "A10", 1, 24576, 0.25, 0.12),
    FakeOffer(6007, "H100 SXM", 2, 81559, 4.90, 2.90),
    FakeOffer(6008, "L40S", 1, 46068, 0.90, 0.50),
)
CREDENTIAL_VARS = ("RUNPOD_API_KEY", "GPUQ_RUNPOD_API_KEY", "LAMBDA_API_KEY", "GPUQ_LAMBDA_API_KEY", "VAST_API_KEY",
                   "GPUQ_VASTAI_API_KEY")


@pytest.fixture
def market(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVastAI]:
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    with FakeVastAI(api_key=KEY, offers=MARKET) as fake:
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_VASTAI_API_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        yield fake


@pytest.fixture
def ctx(market: FakeVastAI) -> Iterator[Context]:
    context = open_context()
    try:
        yield context
    finally:
        context.close()


def _queue(tmp_path: Path, *lines: str) -> Path:
    (tmp_path / "c.yaml").write_text("epochs: 2\n")
    queue = tmp_path / "queue.txt"
    queue.write_text("".join(f"c.yaml classify 2 {line}\n" for line in lines))
    return queue


def _types(plan: rentplan.RentPlan) -> list[tuple[int, str]]:
    return [(c.offer.gpu_count, c.offer.gpu_type) for c in plan.choices]


# -- the pure rule ---------------------------------------------------------------------------------


def _offer(gpu_type: str, mem: int | None, price: str, gpus: int = 1, available: bool = True) -> Offer:
    return Offer("p", gpu_type, gpu_type, gpus, Decimal(price), gpu_memory_gb=mem, available=available,
                 spot_price_per_hour=Decimal(price) / 2)


def test_lines_with_the_same_ask_share_a_machine_and_pinned_lines_need_none() -> None:
    jobs = [JobSpec(name=n, config="c", task="t", line=i, gpus=g, gpu=m, gpu_mem=mem, host=h, nodes=nodes)
            for i, (n, g, m, mem, h, nodes) in enumerate([
                ("a", 1, (), None, None, 1), ("b", 1, (), None, None, 1), ("c", 2, ("H100",), 80.0, None, 1),
                ("d", 2, ("H100",), 80.0, None, 2), ("e", 1, (), None, "box", 1)], start=1)]
    needs = rentplan.needs_of(jobs)
    assert [(n.gpus, n.need, n.machines, n.lines) for n in needs] == [
        (1, GpuNeed(), 1, (1, 2)), (2, GpuNeed(("H100",), 80.0), 2, (3, 4))]


def test_an_offer_serves_by_model_word_memory_count_and_availability() -> None:
    a100 = GpuNeed(("A100",), None)
    assert rentplan.serves(_offer("A100 SXM4", 80, "1"), 1, a100)
    assert rentplan.serves(_offer("gpu_1x_a100_sxm4", 40, "1"), 1, a100)
    assert not rentplan.serves(_offer("A10", 24, "1"), 1, a100)  # A100 is not A10, nor the reverse
    assert not rentplan.serves(_offer("A100 SXM4", 80, "1"), 2, a100)  # GPU count is exact
    assert not rentplan.serves(_offer("A100 SXM4", 80, "1", available=False), 1, a100)
    assert not rentplan.serves(_offer("A100 SXM4", None, "1"), 1, GpuNeed((), 40.0))  # memory not stated
    assert not rentplan.serves(_offer("A100 PCIE", 40, "1"), 1, GpuNeed((), 80.0))


def test_each_need_takes_the_cheapest_match_under_the_cap_or_names_the_cheapest_refused() -> None:
    offers = [_offer("H100 SXM", 80, "3.00"), _offer("H100 PCIE", 80, "2.50"), _offer("A10", 24, "0.30")]
    need = rentplan.MachineNeed(1, GpuNeed(("H100",), None), lines=(1,))
    plan = rentplan.choose([need], offers, max_price=Decimal("2.50"), spot=False)
    assert [c.offer.gpu_type for c in plan.choices] == ["H100 PCIE"] and plan.complete
    dear = rentplan.choose([need], offers, max_price=Decimal("2.00"), spot=False)
    assert not dear.choices and dear.too_dear and dear.short[0].cheapest is offers[1]
    assert '"H100 PCIE"' in dear.short[0].why and "$2.50/h" in dear.short[0].why
    spot = rentplan.choose([need], offers, max_price=Decimal("1.30"), spot=True)  # spot prices are half
    assert spot.hourly == Decimal("1.25")


# -- against the fake vast.ai -----------------------------------------------------------------------


def test_offers_list_the_configured_providers_cheapest_first_and_say_who_was_skipped(ctx: Context) -> None:
    scan = scan_offers(ctx)
    prices = [o.price_per_hour for o in scan.offers]
    assert prices == sorted(p for p in prices if p is not None) and len(scan.offers) == 7  # the 1-GPU offers
    assert set(scan.skipped) == {"runpod", "lambda"} and all("no API key" in w for w in scan.skipped.values())
    big = scan_offers(ctx, models=("H100", "A100"), mem_gb=79)
    assert [o.gpu_type for o in big.offers] == ["A100 SXM4", "H100 PCIE", "H100 SXM"]
    two = scan_offers(ctx, gpu_counts=(2,), spot=True)
    assert [(o.gpu_type, o.spot_price_per_hour) for o in two.offers] == [("H100 SXM", Decimal("2.9"))]


def test_a_provider_whose_offers_call_fails_is_named_and_the_rest_still_list(
        ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeRunPod(api_key="the-right-key") as runpod:
        monkeypatch.setenv("RUNPOD_API_KEY", "a-wrong-key-0123456789")
        monkeypatch.setenv("GPUQ_RUNPOD_URL", runpod.url)
        scan = scan_offers(ctx)
    assert list(scan.failed) == ["runpod"] and "a-wrong-key" not in scan.failed["runpod"]
    assert scan.offers and {o.provider for o in scan.offers} == {"vastai"}


def test_up_for_picks_only_offers_that_match_each_line(ctx: Context, tmp_path: Path) -> None:
    queue = _queue(tmp_path, "name=big gpu_mem=80", "name=hopper gpu=H100", "name=ampere gpu=A100 gpu_mem=40",
                   "name=any", "name=pair gpus=2 gpu=H100", "name=twin gpu_mem=80")
    plan = plan_for(ctx, queue, max_price=5.0)
    assert plan.plan.complete and plan.polls == 1
    # gpu_mem=80: the A100 SXM4 80 GB (the H100s are dearer); gpu=H100: the cheaper H100; gpu=A100 with 40 GB:
    # the A100 PCIE, never the cheaper A10; no ask: the cheapest of all; 2 GPUs: the only 2-GPU H100
    assert _types(plan.plan) == [(1, "A100 SXM4"), (1, "H100 PCIE"), (1, "A100 PCIE"), (1, "A10"), (2, "H100 SXM")]
    assert plan.plan.choices[0].need.lines == (1, 6)  # same ask, one machine
    total = sum((c.offer.price_per_hour or Decimal(0) for c in plan.plan.choices), Decimal(0))
    assert plan.plan.hourly == total and f"total ${total:.2f} per hour" in plan.lines()[-1]
    spot = plan_for(ctx, queue, max_price=5.0, spot=True)  # by minimum bid: the H100 SXM bids lower
    assert _types(spot.plan)[1] == (1, "H100 SXM")
    assert not market_rented(ctx)


def market_rented(ctx: Context) -> list[str]:
    return [h.name for h in ctx.ledger.hosts()]


def test_a_cap_below_every_match_refuses_naming_the_cheapest_and_rents_nothing(
        ctx: Context, market: FakeVastAI, tmp_path: Path) -> None:
    queue = _queue(tmp_path, "name=hopper gpu=H100", "name=small")
    with pytest.raises(UsageError, match=r"--max-price must be more than 0 \(US dollars per machine-hour\)"):
        plan_for(ctx, queue, max_price=0.0)
    plan = plan_for(ctx, queue, max_price=1.0)
    assert not plan.plan.complete and _types(plan.plan) == [(1, "A10")]
    assert '"H100 PCIE"' in plan.missing() and "over --max-price $1" in plan.missing()
    with pytest.raises(UsageError):
        up_for(ctx, plan)
    assert not market.instances and not market_rented(ctx)


def test_retry_until_polls_with_backoff_until_capacity_appears(
        ctx: Context, market: FakeVastAI, tmp_path: Path) -> None:
    queue = _queue(tmp_path, "name=hopper gpu=H100")
    market.no_capacity(3)  # the next three searches find nothing
    now = [0.0]
    slept: list[float] = []
    said: list[str] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    plan = plan_for(ctx, queue, max_price=3.0, retry_until_s=3600, sleep=sleep, clock=lambda: now[0],
                    say=said.append)
    assert plan.plan.complete and plan.polls == 4 and _types(plan.plan) == [(1, "H100 PCIE")]
    base = ctx.settings.offers_retry_s
    assert slept == [base, 2 * base, 4 * base] and len(said) == 3 and "no offer available now" in said[0]
    market.no_capacity(100)
    now[0], slept[:] = 0.0, []
    late = plan_for(ctx, queue, max_price=3.0, retry_until_s=100, sleep=sleep, clock=lambda: now[0])
    assert not late.plan.complete and now[0] == 100 and slept[-1] == 100 - sum(slept[:-1])  # never past the deadline


# -- the CLI ------------------------------------------------------------------------------------------


def test_cli_offers_and_up_for_dry_run_and_refusal(market: FakeVastAI, tmp_path: Path) -> None:
    listed = run_gpuq("offers", "--gpu", "H100|A100", "--gpu-mem", "79")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith("vastai")]
    assert [re.split(r"\s{2,}", r)[1] for r in rows] == ["A100 SXM4", "H100 PCIE", "H100 SXM"]
    assert "$0.650" not in listed.stdout and "$1.301" in listed.stdout  # machine price, and per GPU
    assert listed.stderr.count("skipped") == 2, listed.stderr
    doc = json.loads(run_gpuq("offers", "--json", "--spot", "--max-price", "1.2").stdout)
    assert [o["gpu_type"] for o in doc["offers"]][:2] == ["A10", "RTX 4090"] and doc["schema"] == "gpuq.cli.offers/1"
    bad = run_gpuq("offers", "--max-price", "cheap")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    queue = _queue(tmp_path, "name=hopper gpu=H100", "name=any")
    dry = run_gpuq("up", "--for", str(queue), "--max-price", "3", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert '"H100 PCIE"' in dry.stdout and "total $2.35 per hour" in dry.stdout and "nothing rented" in dry.stdout
    refused = run_gpuq("up", "--for", str(queue), "--max-price", "1")
    assert refused.returncode == 1 and "nothing rented" in refused.stderr and '"H100 PCIE"' in refused.stderr
    assert not market.instances
    mixed = run_gpuq("up", "--for", str(queue), "--max-price", "1", "--gpu", "A10")
    assert mixed.returncode == 2 and "--gpu" in mixed.stderr


class _RefusedAddresses(AddressBackend):
    """Machines ready at a host name outside vast.ai's gateways: each is refused before any SSH, and ended."""

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        _ip, port = super().provision(instance_id, gpu_count)
        return "machine.example", port


def test_up_for_rents_each_need_with_its_offer_and_says_which_failed(
        gpuq_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    private = tmp_path / "id_for"
    private.write_text("not used: gpuq never connects\n")
    (tmp_path / "id_for.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRentForTestKeyOnly00000000 t\n")
    with FakeVastAI(api_key=KEY, offers=MARKET, backend=_RefusedAddresses()) as fake:
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_VASTAI_API_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        context = open_context()
        try:
            queue = _queue(tmp_path, "name=pair gpus=2 gpu=H100", "name=pair2 gpus=2 gpu=H100", "name=small gpu=A10")
            plan = plan_for(context, queue, max_price=5.0)
            assert _types(plan.plan) == [(2, "H100 SXM"), (1, "A10")] and plan.plan.choices[0].need.machines == 1
            assert plan.lines() == [
                '1x 2-GPU machine (gpu=H100) for line(s) 1, 2: vastai "H100 SXM" 2x 85 GB at $4.90/h ($2.45/GPU-h)',
                '1x 1-GPU machine (gpu=A10) for line(s) 3: vastai "A10" 1x 25 GB at $0.25/h ($0.25/GPU-h)',
                "total $5.15 per hour while all run"]
            short = plan_for(context, queue, max_price=1.0)
            assert short.lines() == [
                '1x 1-GPU machine (gpu=A10) for line(s) 3: vastai "A10" 1x 25 GB at $0.25/h ($0.25/GPU-h)',
                '1x 2-GPU machine (gpu=H100) for line(s) 1, 2: the cheapest matching offer, vastai "H100 SXM" 2x 85 GB '
                'at $4.90/h ($2.45/GPU-h), is over --max-price $1.0/h',
                "total $0.25 per hour while all run (for the machines found; nothing is rented while one is missing)"]
            assert short.missing() == short.lines()[1].replace(" for line(s) 1, 2", "")
            fake.no_capacity(1)  # the first need's first create finds none; the A10's goes through
            said: list[str] = []
            result = up_for(context, plan, key=str(private), prefix="for",
                            down_when_done=not context.settings.auto_down, say=said.append)
            assert any(line.endswith("created; waiting until it is ready") for line in said), said
            (rental,) = result.rentals
            row = context.ledger.host(rental.unusable[0].host)
            assert row is not None and (row.provider, row.gpu_type, row.gpu_count, row.down_when_done) == (
                "vastai", "A10", 1, not context.settings.auto_down)
            assert row.name.startswith("for-") and row.lease_state == "terminated"
        finally:
            context.close()
    assert list(result.failed) == [plan.plan.choices[0].need.text()] and not result.ok
    assert result.failed[plan.plan.choices[0].need.text()].startswith("vastai H100 SXM: ")
    assert rental.provider == "vastai" and rental.wanted == 1 and len(rental.unusable) == 1
    assert "no on-demand vast.ai offer has capacity for 2x H100 SXM" in result.failed["1x 2-GPU machine (gpu=H100)"]


def test_cli_offers_without_any_provider_key_says_nothing_was_asked(gpuq_home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No key anywhere: not "no offers match" and exit 0 (nothing was looked at), but one line saying
    so and exit 1 (issue 39)."""
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    listed = run_gpuq("offers")
    assert listed.returncode == 1, listed.stdout + listed.stderr
    assert "no offers match" not in listed.stdout and "no provider was asked" in listed.stderr
