"""The money rules of the values every provider adapter speaks in (orchestrator/providers/models.py): the
price cap a machine is held to before it is created, the ranges an offer query accepts, the provider options
a request may carry, and the ports an SSH endpoint from an API may have."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from orchestrator.core.errors import NoCapacity, ProviderError
from orchestrator.providers.lambda_cloud import LambdaOptions
from orchestrator.providers.models import (
    OfferQuery,
    ProviderOptions,
    ProvisionRequest,
    check_price_cap,
    instance_name,
    parse_money,
    ssh_address,
)
from orchestrator.providers.runpod import RunPodOptions

A40 = "NVIDIA A40"


def _request(cap: str | None, *, spot: bool = False) -> ProvisionRequest:
    return ProvisionRequest("gpuq-0a1b2c3d-abc123", A40, spot=spot,
                            max_price_per_hour=None if cap is None else Decimal(cap))


def test_without_a_cap_any_price_or_none_is_rented() -> None:
    check_price_cap("runpod", _request(None), None)
    check_price_cap("runpod", _request(None), Decimal("999"))


def test_a_price_on_the_cap_is_rented() -> None:
    check_price_cap("runpod", _request("1.50"), Decimal("1.50"))
    check_price_cap("runpod", _request("1.50", spot=True), Decimal("0.01"))


@pytest.mark.parametrize(("spot", "kind"), [(False, "on-demand"), (True, "spot")])
def test_a_price_above_the_cap_is_refused_saying_what_it_costs(spot: bool, kind: str) -> None:
    with pytest.raises(NoCapacity) as refused:
        check_price_cap("vastai", _request("1.50", spot=spot), Decimal("1.51"))
    assert refused.value.provider == "vastai"
    assert str(refused.value) == f"vastai: {A40} costs $1.51/h {kind} now, above the cap of $1.50/h"


@pytest.mark.parametrize(("spot", "kind"), [(False, "on-demand"), (True, "spot")])
def test_an_unknown_price_under_a_cap_is_refused_not_rented_blind(spot: bool, kind: str) -> None:
    with pytest.raises(NoCapacity) as refused:
        check_price_cap("lambda", _request("2", spot=spot), None)
    assert refused.value.provider == "lambda"
    assert str(refused.value) == f"lambda: no {kind} price for {A40} now: not renting above a cap of $2/h blind"


def test_an_offer_query_takes_any_memory_or_price_floor_from_zero() -> None:
    for value in ("0", "0.5"):
        query = OfferQuery(min_gpu_memory_gb=float(value), max_price_per_hour=Decimal(value))
        assert query.min_gpu_memory_gb == float(value) and query.max_price_per_hour == Decimal(value)
    with pytest.raises(ValueError, match=r"min_gpu_memory_gb is not negative: -0\.5"):
        OfferQuery(min_gpu_memory_gb=-0.5)
    with pytest.raises(ValueError, match="max_price_per_hour is not negative"):
        OfferQuery(max_price_per_hour=Decimal("-0.01"))


def test_a_request_carries_only_its_own_providers_options() -> None:
    assert _request(None).options_for(RunPodOptions) == RunPodOptions()
    mine = RunPodOptions()
    request = ProvisionRequest("gpuq-0a1b2c3d-abc123", A40, options=mine)
    assert request.options_for(RunPodOptions) is mine
    with pytest.raises(ProviderError) as refused:
        request.options_for(LambdaOptions)
    assert refused.value.provider == "lambda"
    assert str(refused.value) == "lambda: RunPodOptions are not lambda options"


def test_options_of_a_kind_with_no_provider_name_are_refused_by_its_class_name() -> None:
    @dataclass(frozen=True)
    class Unnamed(ProviderOptions):
        pass

    with pytest.raises(ProviderError) as refused:
        ProvisionRequest("gpuq-0a1b2c3d-abc123", A40, options=RunPodOptions()).options_for(Unnamed)
    assert refused.value.provider == "provider"
    assert str(refused.value) == "provider: RunPodOptions are not Unnamed options"


@pytest.mark.parametrize(("port", "expected"), [
    (1, ("203.0.113.7", 1)), (65535, ("203.0.113.7", 65535)), (0, None), (65536, None),
    (True, None), ("22", None), (22.0, None), (None, None),
])
def test_an_ssh_port_from_an_api_is_a_whole_number_from_1_to_65535(port: object, expected: object) -> None:
    assert ssh_address("203.0.113.7", port, ()) == expected  # type: ignore[arg-type]


def test_an_instance_name_needs_a_ledger_id() -> None:
    with pytest.raises(ValueError, match="not a ledger id: 'ABCDEFGH'"):
        instance_name("ABCDEFGH", "abc123")


def test_a_free_machine_has_a_price_of_nothing_not_an_unknown_price() -> None:
    assert parse_money("0") == Decimal(0) and parse_money(0) == Decimal(0) and parse_money("0.00") == Decimal(0)
    check_price_cap("runpod", _request("0"), parse_money("0"))  # it fits a cap of $0, an unknown price does not
