"""Lambda Cloud's wire models (orchestrator/providers/lambda_wire.py) against Lambda's published OpenAPI document
and every answer the fake recorded (tests/fixtures/providers/lambda/, which
tests/unit/test_providers_published_schema.py checks against that document)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import ProviderError
from orchestrator.providers import lambda_wire as wire

LAMBDA = Path(__file__).resolve().parents[1] / "fixtures" / "providers" / "lambda"
DOC = json.loads((LAMBDA / "published" / "openapi-1.8.3.json").read_text(encoding="utf-8"))
RECORDINGS = sorted((LAMBDA / "fake").glob("*.json"))


def test_the_published_instance_types_example_is_an_offer() -> None:
    example = DOC["components"]["schemas"]["InstanceTypes"]["example"]
    [(name, entry)] = wire.parse_as(wire.InstanceTypes, example, "GET /instance-types").items()
    offer = wire.offer_of(name, entry)
    assert (offer.gpu_type, offer.gpu_count, offer.gpu_memory_gb) == ("gpu_1x_gh200", 1, 96)
    assert offer.price_per_hour == Decimal("1.49") and offer.regions == ("us-west-1",) and offer.available


def test_the_fields_gpuq_reads_are_the_documents() -> None:
    """Each model field gpuq reads is a property of the published schema it stands for."""
    schemas = DOC["components"]["schemas"]
    pairs = {wire.WireInstance: "Instance", wire.WireInstanceType: "InstanceType", wire.WireRegion: "Region",
             wire.WireSpecs: "InstanceTypeSpecs", wire.WireTypeEntry: "InstanceTypesItem",
             wire.WireLaunch: "InstanceLaunchResponse", wire.WireSshKey: "SSHKey"}
    for model, schema in pairs.items():
        assert set(model.model_fields) <= set(schemas[schema]["properties"]), (model.__name__, schema)
    assert set(wire.STATES) <= set(schemas["InstanceStatus"]["enum"])


def answers(path: str) -> list[Any]:
    out = []
    for recording in RECORDINGS:
        for exchange in json.loads(recording.read_text(encoding="utf-8"))["exchanges"]:
            request, response = exchange["request"], exchange["response"]
            if request["method"] == "GET" and request["path"] == path and response["status"] == 200:
                out.append(response["json"]["data"])
    return out


def test_every_recorded_answer_parses() -> None:
    listed = answers("/instances")
    types = answers("/instance-types")
    keys = answers("/ssh-keys")
    assert listed and types and keys, "the recordings list instances, instance types and keys"
    for data in listed:
        for item in wire.parse_as(wire.Instances, data, "GET /instances"):
            made = wire.instance_of(item)
            assert made.id and made.state in ("pending", "running", "unhealthy", "terminating", "terminated")
    for data in types:
        assert all(wire.offer_of(n, e).price_per_hour for n, e in wire.parse_as(wire.InstanceTypes, data, "t").items())
    for data in keys:
        assert all(k.public_key.startswith("ssh-") for k in wire.parse_as(wire.SshKeys, data, "GET /ssh-keys"))


@pytest.mark.parametrize("body", [
    {"gpu_1x_a10": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 1.5}}},  # cents: an integer
    {"gpu_1x_a10": {"instance_type": {"name": "gpu_1x_a10"}, "regions_with_capacity_available": "us-east-1"}},
    ["gpu_1x_a10"],
])
def test_instance_types_that_do_not_fit_are_refused(body: object) -> None:
    with pytest.raises(ProviderError, match="unexpected answer") as caught:
        wire.parse_as(wire.InstanceTypes, body, "GET /instance-types")
    assert caught.value.code == "bad-answer"


def test_an_error_body_is_read_by_its_code_and_anything_else_is_no_error() -> None:
    err = wire.parse_error({"error": {"code": "global/invalid-api-key", "message": "API key was invalid\n\x1b[0m",
                                      "suggestion": "Check it"}})
    # one printable line: the newline and the escape byte go, what is printable stays
    assert (err.code, err.message, err.suggestion) == ("global/invalid-api-key", "API key was invalid [0m", "Check it")
    assert wire.parse_error("oops") == wire.parse_error({"error": 3}) == wire.WireError()
