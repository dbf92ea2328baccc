"""The words ``gpuq offers`` and ``gpuq up --for`` show for a machine and its price (orchestrator/money/rentplan.py
``describe`` and ``MachineNeed.text``): the machine's price per hour on demand or spot, per GPU-hour, its
memory where the provider says it, and what a need asks."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.core.specs import JobSpec
from orchestrator.money import rentplan
from orchestrator.money.rentplan import MachineNeed, cheapest_first, choose, describe, needs_of
from orchestrator.providers.models import Offer
from orchestrator.scheduling.gpumatch import GpuNeed


def _offer(count: int, price: str | None, *, spot: str | None = None, memory: int | None = 80) -> Offer:
    return Offer(provider="vastai", gpu_type="A100 SXM4", display_name="A100", gpu_count=count,
                 price_per_hour=None if price is None else Decimal(price), gpu_memory_gb=memory,
                 spot_price_per_hour=None if spot is None else Decimal(spot))


def test_a_machine_reads_with_its_price_per_hour_and_per_gpu_hour() -> None:
    two = _offer(2, "2.40", spot="1.00")
    assert describe(two, False) == 'vastai "A100 SXM4" 2x 80 GB at $2.40/h ($1.20/GPU-h)'
    assert describe(two, True) == 'vastai "A100 SXM4" 2x 80 GB at $1.00/h ($0.50/GPU-h)'
    assert describe(_offer(1, "0.79"), False) == 'vastai "A100 SXM4" 1x 80 GB at $0.79/h ($0.79/GPU-h)'


def test_a_machine_without_a_price_memory_or_gpus_says_only_what_is_known() -> None:
    assert describe(_offer(2, None, memory=None), False) == 'vastai "A100 SXM4" 2x at no price'
    assert describe(_offer(2, "2.40"), True) == 'vastai "A100 SXM4" 2x 80 GB at no price'  # no spot price
    assert describe(_offer(0, "1.00"), False) == 'vastai "A100 SXM4" 0x 80 GB at $1.00/h'


def test_a_need_reads_as_its_machines_and_what_they_must_have() -> None:
    assert MachineNeed(2, GpuNeed(("H100",), 80.0), 3).text() == "3x 2-GPU machine (gpu=H100 gpu_mem=80)"
    assert MachineNeed(1, GpuNeed((), None)).text() == "1x 1-GPU machine (any GPU)"


def _job(name: str, line: int, *, host: str | None = None, gpus: int = 1) -> JobSpec:
    return JobSpec(name=name, config="c", task="t", line=line, gpus=gpus, host=host)


def test_a_pinned_line_does_not_hide_the_lines_after_it_and_a_grid_line_is_named_once() -> None:
    jobs = [_job("pinned", 1, host="box"), _job("g-0", 2), _job("g-1", 2), _job("two", 3, gpus=2)]
    assert [(n.gpus, n.lines) for n in needs_of(jobs)] == [(1, (2,)), (2, (3,))]


def test_a_spot_shortage_names_the_spot_price_and_says_spot() -> None:
    need = MachineNeed(2, GpuNeed(("A100",), None), lines=(1,))
    dear = choose([need], [_offer(2, "2.40", spot="1.00")], max_price=Decimal("0.50"), spot=True)
    assert dear.short[0].why == ('the cheapest matching offer, vastai "A100 SXM4" 2x 80 GB at $1.00/h '
                                 "($0.50/GPU-h), is over --max-price $0.50/h")
    none = choose([need], [_offer(1, "0.10", spot="0.05")], max_price=Decimal("9"), spot=True)
    assert none.short[0].why == "no spot offer available now matches it"
    on_demand = choose([need], [], max_price=Decimal("9"), spot=False)
    assert on_demand.short[0].why == "no offer available now matches it"


def test_a_spot_offer_without_an_on_demand_price_is_rented_spot() -> None:
    need = MachineNeed(2, GpuNeed((), None), lines=(1,))
    plan = choose([need], [_offer(2, None, spot="1.00")], max_price=Decimal("1.00"), spot=True)
    assert plan.complete and plan.hourly == Decimal("1.00")


def test_offers_list_cheapest_first_and_unpriced_last() -> None:
    unpriced, dear, cheap = _offer(1, None), _offer(1, "2.00"), _offer(1, "0.50")
    assert cheapest_first([unpriced, dear, cheap], False) == [cheap, dear, unpriced]


@pytest.mark.parametrize(("price", "cap", "said"), [
    (Decimal("2.37"), Decimal("1.00"), "priced $2.37/h once created, above --max-price $1.00/h"),
    (Decimal("1.001"), Decimal("1"), "priced $1.00/h once created, above --max-price $1.00/h"),
    (Decimal("1.00"), Decimal("1.00"), None),  # at the cap is within it
    (Decimal("0.99"), Decimal("1.00"), None),
    (None, Decimal("1.00"), None),  # no price named: the offer was checked before the create
    (Decimal("9.99"), None, None),  # no cap
])
def test_a_price_named_after_the_create_is_held_to_the_cap(price: Decimal | None, cap: Decimal | None,
                                                           said: str | None) -> None:
    assert rentplan.over_cap(price, cap) == said
