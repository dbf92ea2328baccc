"""The fakes checked against the providers' published OpenAPI documents (Lambda Cloud's, RunPod's REST v2).

Every exchange recorded from a fake (tests/fixtures/providers/<provider>/fake/*.json: the adapter's real
requests and the fake's responses) must be one the published API allows: the path and method exist,
the request body matches the operation's request schema, and the response body matches the schema
the document gives for that status.  A fake that drifts from the real API (a renamed field, a wrong
type, an endpoint the API does not have) fails here, and so does an adapter that sends what the API
does not take.  RunPod's v2 document closes its request bodies itself (``unevaluatedProperties: false``) and
documents every query parameter, so its query strings are checked too.  Where the documents came from:
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
RUNPOD_BASE = "/v2"
RUNPOD = PublishedApi(PROVIDERS / "runpod" / "published" / "openapi-v2.json", "RunPod", lambda path: path,
                      check_query=True)
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
def test_every_recorded_runpod_exchange_is_allowed_by_the_published_v2_api(recording: Path) -> None:
    exchanges = _exchanges(recording)
    assert all(x["request"]["path"].startswith(RUNPOD_BASE + "/") for x in exchanges), "only v2 is spoken"
    assert _problems(RUNPOD, exchanges) == []


def test_the_runpod_recordings_use_every_v2_operation_gpuq_needs() -> None:
    """Catalog, create, list, get, the stop and start actions, delete and both SSH-key calls all pass the check."""
    seen: set[tuple[str, str]] = set()
    actions: set[str] = set()
    for recording in RUNPOD_RECORDINGS:
        for x in _exchanges(recording):
            req = x["request"]
            template, _ = RUNPOD.operation(req["method"], req["path"])
            seen.add((req["method"], template))
            if template == "/v2/pods/{id}/action":
                actions.add(req["json"]["action"])
    assert seen >= {("GET", "/v2/catalog/gpus"), ("POST", "/v2/pods"), ("GET", "/v2/pods"), ("GET", "/v2/pods/{id}"),
                    ("POST", "/v2/pods/{id}/action"), ("DELETE", "/v2/pods/{id}"), ("GET", "/v2/account/ssh-keys"),
                    ("PUT", "/v2/account/ssh-keys")}, seen
    assert actions == {"stop", "start"}


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
    """v1 fields, a spot field, a wrong type, an undocumented query parameter or path each fail the v2 check."""
    direct = {"host": "195.26.233.3", "port": 34446, "username": "root", "command": "ssh root@195.26.233.3 -p 34446"}
    good_pod = {"id": "p1", "name": "gpuq-x", "status": "RUNNING", "actions": ["stop"], "image": "img", "args": "",
                "disk": 40, "mounts": {}, "ports": ["22/tcp"], "env": {}, "registry": None, "cloud": "SECURE",
                "dataCenterId": "US-KS-2", "cudaVersion": None, "ssh": {"proxy": None, "direct": direct},
                "template": None, "cost": 0.79, "locked": False, "runtime": None, "createdAt": "2026-01-01T00:00:00Z",
                "startedAt": None, "globalNetworking": {"enabled": False},
                "gpu": {"id": "NVIDIA RTX A6000", "count": 1}}
    good = {"request": {"method": "GET", "path": "/v2/pods/p1", "auth": "bearer", "json": None, "query": {}},
            "response": {"status": 200, "json": good_pod}}
    assert RUNPOD.check(good) == []
    drifted = {**good, "response": {"status": 200, "json": {**good_pod, "status": "CREATED", "cost": "0.79",
                                                             "desiredStatus": "RUNNING"}}}
    problems = RUNPOD.check(drifted)
    assert any("status" in p for p in problems) and any("cost" in p for p in problems), problems
    create = {"request": {"method": "POST", "path": "/v2/pods", "auth": "bearer", "query": {},
                          "json": {"name": "x", "image": "img", "gpu": {"id": "g", "count": 1}, "interruptible": True,
                                   "gpuTypeIds": ["g"]}},
              "response": {"status": 201, "json": good_pod}}
    problems = RUNPOD.check(create)
    assert any("interruptible" in p for p in problems) and any("gpuTypeIds" in p for p in problems), problems
    catalog = {"request": {"method": "GET", "path": "/v2/catalog/gpus", "auth": "bearer", "json": None,
                           "query": {"include": ["AVAILABILITY"], "product": ["SPOT"], "bid": ["1"]}},
               "response": {"status": 200, "json": {"gpus": []}}}
    problems = RUNPOD.check(catalog)
    assert any("query product" in p for p in problems) and any("'bid'" in p for p in problems), problems
    error = {"request": good["request"], "response": {"status": 404, "json": {"error": "pod not found"}}}
    assert any("detail" in p for p in RUNPOD.check(error))  # v2's errors are RFC 9457 problem objects
    with pytest.raises(AssertionError, match="is not an operation of the published RunPod API"):
        RUNPOD.check({"request": {"method": "POST", "path": "/v1/pods/p1/stop", "auth": "bearer", "json": None},
                      "response": {"status": 200, "json": {}}})
