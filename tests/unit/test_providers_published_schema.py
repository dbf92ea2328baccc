"""The fakes checked against the providers' published OpenAPI documents (Lambda Cloud's, RunPod's REST).

Every exchange recorded from a fake (tests/fixtures/providers/<provider>/fake/*.json: the adapter's real
requests and the fake's responses) must be one the published API allows: the path and method exist,
the request body matches the operation's request schema, and the response body matches the schema
the document gives for that status.  A fake that drifts from the real API (a renamed field, a wrong
type, an endpoint the API does not have) fails here, and so does an adapter that sends what the API
does not take.  RunPod's recordings also hold its GraphQL calls (checked in test_runpod_published_types.py);
only their REST exchanges (``/v1/...``) are checked here.  Where the documents came from:
tests/fixtures/providers/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.openapi_check import PublishedApi

PROVIDERS = Path(__file__).resolve().parents[1] / "fixtures" / "providers"
LAMBDA = PublishedApi(PROVIDERS / "lambda" / "published" / "openapi-1.8.3.json", "Lambda",
                      lambda path: "/api/v1" + path, auth=("bearer", "basic"))
RUNPOD_REST = "/v1"
RUNPOD = PublishedApi(PROVIDERS / "runpod" / "published" / "openapi.json", "RunPod",
                      lambda path: path.removeprefix(RUNPOD_REST), closed_requests=True)
check_exchange = LAMBDA.check


def _problems(api: PublishedApi, exchanges: list[dict[str, Any]]) -> list[str]:
    return [f"#{i} {x['request']['method']} {x['request']['path']}: {p}"
            for i, x in enumerate(exchanges) for p in api.check(x)]


def _exchanges(recording: Path) -> list[dict[str, Any]]:
    exchanges: list[dict[str, Any]] = json.loads(recording.read_text())["exchanges"]
    assert exchanges, f"{recording.name} holds no exchange"
    return exchanges


RECORDINGS = sorted((PROVIDERS / "lambda" / "fake").glob("*.json"))
RUNPOD_RECORDINGS = sorted((PROVIDERS / "runpod" / "fake").glob("*.json"))


@pytest.mark.parametrize("recording", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_every_recorded_lambda_exchange_is_allowed_by_the_published_api(recording: Path) -> None:
    assert _problems(LAMBDA, _exchanges(recording)) == []


@pytest.mark.parametrize("recording", RUNPOD_RECORDINGS, ids=[p.stem for p in RUNPOD_RECORDINGS])
def test_every_recorded_runpod_rest_exchange_is_allowed_by_the_published_api(recording: Path) -> None:
    rest = [x for x in _exchanges(recording) if x["request"]["path"].startswith(RUNPOD_REST + "/")]
    assert _problems(RUNPOD, rest) == []


def test_the_runpod_recordings_use_every_rest_operation_gpuq_needs() -> None:
    """Create (on demand and interruptible), list, get, stop, start and delete all pass through the check."""
    seen: set[tuple[str, str]] = set()
    interruptible: set[bool] = set()
    for recording in RUNPOD_RECORDINGS:
        for x in _exchanges(recording):
            req = x["request"]
            if req["path"].startswith(RUNPOD_REST + "/"):
                template, _ = RUNPOD.operation(req["method"], req["path"].removeprefix(RUNPOD_REST))
                seen.add((req["method"], template))
                if (req["method"], template) == ("POST", "/pods"):
                    interruptible.add(bool(req["json"].get("interruptible")))
    assert seen >= {("POST", "/pods"), ("GET", "/pods"), ("GET", "/pods/{podId}"), ("POST", "/pods/{podId}/stop"),
                    ("POST", "/pods/{podId}/start"), ("DELETE", "/pods/{podId}")}, seen
    assert interruptible == {True, False}


def test_the_check_catches_a_drifted_fake() -> None:
    """The check has teeth: a renamed field, a wrong type, an unknown endpoint each fail it."""
    good = {"request": {"method": "GET", "path": "/instances", "auth": "bearer", "json": None, "query": {}},
            "response": {"status": 200, "json": {"data": []}}}
    assert check_exchange(good) == []
    bad_launch = {"request": {"method": "POST", "path": "/instance-operations/launch", "auth": "bearer",
                              "json": {"region": "us-east-1", "instance_type_name": "gpu_1x_a10"}, "query": {}},
                  "response": {"status": 200, "json": {"data": {"instance_ids": "i-1"}}}}
    problems = check_exchange(bad_launch)
    assert any(p.startswith("request: ") and "region_name" in p for p in problems), problems
    assert any(p.startswith("response 200: data/instance_ids") for p in problems), problems
    with pytest.raises(AssertionError, match="is not an operation of the published Lambda API"):
        check_exchange({"request": {"method": "POST", "path": "/pods", "auth": "bearer", "json": {}},
                        "response": {"status": 200, "json": {}}})


def test_the_runpod_check_catches_a_drifted_fake_or_adapter() -> None:
    pod = {"id": "p1", "desiredStatus": "RUNNING", "interruptible": True, "costPerHr": 0.25,
           "publicIp": None, "portMappings": {"22": 10341}}
    good = {"request": {"method": "GET", "path": "/v1/pods/p1", "auth": "bearer", "json": None, "query": {}},
            "response": {"status": 200, "json": pod}}
    assert RUNPOD.check(good) == []  # publicIp may be null (OpenAPI 3.0 nullable)
    drifted = {**good, "response": {"status": 200, "json": {**pod, "desiredStatus": "EXITING", "costPerHr": "0.25",
                                                             "interruptible": "yes"}}}
    problems = RUNPOD.check(drifted)
    for field in ("desiredStatus", "costPerHr", "interruptible"):
        assert any(p.startswith(f"response 200: {field}") for p in problems), (field, problems)
    create = {"request": {"method": "POST", "path": "/v1/pods", "auth": "bearer", "query": {},
                          "json": {"gpuTypeIds": ["NVIDIA RTX A6000"], "cloudType": "ALL", "bidPerGpu": 0.3}},
              "response": {"status": 201, "json": pod}}
    problems = RUNPOD.check(create)
    assert any("cloudType" in p for p in problems) and any("'bidPerGpu' is not a field" in p for p in problems)
    with pytest.raises(AssertionError, match="is not an operation of the published RunPod API"):
        RUNPOD.check({"request": {"method": "POST", "path": "/v1/pods/p1/bid", "auth": "bearer", "json": None},
                      "response": {"status": 200, "json": {}}})
