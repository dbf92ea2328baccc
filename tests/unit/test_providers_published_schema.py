"""The Lambda fake checked against Lambda Cloud's published OpenAPI document.

Every exchange recorded from the fake (tests/fixtures/providers/lambda/fake/*.json: the adapter's real
requests and the fake's responses) must be one the published API allows: the path and method exist,
the request body matches the operation's request schema, and the response body matches the schema
the document gives for that status.  A fake that drifts from the real API (a renamed field, a wrong
type, an endpoint the API does not have) fails here.  Where the document came from:
tests/fixtures/providers/README.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

PROVIDERS = Path(__file__).resolve().parents[1] / "fixtures" / "providers"
OPENAPI = PROVIDERS / "lambda" / "published" / "openapi-1.8.3.json"
BASE = "/api/v1"
ROOT_URI = "urn:gpuq:lambda-openapi"


def _document() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(OPENAPI.read_text())
    return doc


DOC = _document()
REGISTRY: Registry = Registry().with_resource(ROOT_URI, Resource.from_contents(DOC, default_specification=DRAFT202012))


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _validator(*parts: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{ROOT_URI}#/{_pointer(*parts)}"}, registry=REGISTRY)


def _operation(method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The documented path template and operation for a concrete request path."""
    for template, ops in DOC["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^/]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, BASE + path) and method.lower() in ops:
            return template, ops[method.lower()]
    raise AssertionError(f"{method} {BASE}{path} is not an operation of the published Lambda API")


def _errors(validator: Draft202012Validator, body: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(body)]


def check_exchange(exchange: dict[str, Any]) -> list[str]:
    """What in one recorded request/response pair the published API does not allow."""
    req, resp = exchange["request"], exchange["response"]
    template, op = _operation(req["method"], req["path"])
    method = req["method"].lower()
    problems: list[str] = []
    if req.get("auth") not in ("bearer", "basic"):
        problems.append(f"request sent no Bearer/Basic authorization ({req.get('auth')})")
    body_schema = op.get("requestBody", {}).get("content", {}).get("application/json")
    if req.get("json") is not None:
        if body_schema is None:
            problems.append(f"{req['method']} {template} takes no JSON body")
        else:
            validator = _validator("paths", template, method, "requestBody", "content", "application/json", "schema")
            problems += [f"request: {e}" for e in _errors(validator, req["json"])]
    elif body_schema is not None and op["requestBody"].get("required"):
        problems.append(f"{req['method']} {template} requires a JSON body")
    status = str(resp["status"])
    responses = op["responses"]
    key = status if status in responses else ("default" if "default" in responses else None)
    if key is None:
        # statuses every endpoint may answer (rate limiting, server errors) are not listed per operation
        if status not in ("429", "500", "503"):
            problems.append(f"{req['method']} {template} documents no {status} response")
        return problems
    if "json" not in resp:
        problems.append(f"response {status} is not JSON")
        return problems
    validator = _validator("paths", template, method, "responses", key, "content", "application/json", "schema")
    problems += [f"response {status}: {e}" for e in _errors(validator, resp["json"])]
    return problems


RECORDINGS = sorted((PROVIDERS / "lambda" / "fake").glob("*.json"))


@pytest.mark.parametrize("recording", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_every_recorded_lambda_exchange_is_allowed_by_the_published_api(recording: Path) -> None:
    exchanges = json.loads(recording.read_text())["exchanges"]
    assert exchanges, f"{recording.name} holds no exchange"
    problems = [f"#{i} {x['request']['method']} {x['request']['path']}: {p}"
                for i, x in enumerate(exchanges) for p in check_exchange(x)]
    assert problems == []


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
