"""The fake vast.ai and the adapter's recordings checked against vast.ai's published OpenAPI document
(tests/fixtures/providers/vastai/published/openapi.yaml, vendored unchanged; where it came from:
tests/fixtures/providers/README.md), like the other providers' in test_providers_published_schema.py.

Where the document and vast.ai's official client (vast-ai/vast-cli) disagree, gpuq follows the client,
which is what the live API has been answering; each such place is listed in :data:`CLIENT_OVER_DOCUMENT`
with the reason, and every entry must still be needed (a stale one fails)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.support.openapi_check import PublishedApi, _nullable_to_null

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "providers" / "vastai"

# (operation, problem pattern): why gpuq does what the client does, not what the document says
CLIENT_OVER_DOCUMENT = {
    ("POST /api/v0/bundles", r"type: 'on-demand' is not one of"):
        "the client's search sends type 'on-demand' (its default); the document spells it 'ondemand'",
    ("POST /api/v0/bundles", r"order: \[\[.*\]\] is too short"):
        "the document puts minItems 2 on the list of sort keys, not on each [field, direction] pair",
    ("PUT /api/v0/asks/{id}", r"runtype: 'ssh_direc ssh_proxy' is not one of"):
        "the client's --ssh --direct sends 'ssh_direc ssh_proxy'; the document's enum lacks it",
    ("GET /api/v0/instances/{id}", r"instances/ports: .* is not of type 'array'"):
        "the client reads ports as Docker's map ({'22/tcp': [{'HostPort': ...}]}); the document says a list",
    ("GET /api/v0/instances/{id}", r"instances: None is not of type 'object'"):
        "the client expects {'instances': null} for an instance that is gone",
}


class YamlApi(PublishedApi):
    """PublishedApi over a YAML document (vast.ai publishes YAML)."""

    def __init__(self, path: Path) -> None:
        raw: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
        self.doc = _nullable_to_null(copy.deepcopy(raw)) if str(raw["openapi"]).startswith("3.0") else raw
        self.label, self.auth, self.closed = "vast.ai", ("bearer",), False
        self.doc_path = lambda path: path.rstrip("/")  # the client's paths end in "/", the document's do not
        self.uri = "urn:gpuq:vastai-openapi"
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(self.uri, resource)


def test_the_recordings_are_what_the_published_api_allows() -> None:
    api = YamlApi(FIXTURES / "published" / "openapi.yaml")
    recordings = sorted((FIXTURES / "fake").glob("*.json"))
    assert len(recordings) >= 15
    used: set[tuple[str, str]] = set()
    problems: list[str] = []
    for recording in recordings:
        for exchange in json.loads(recording.read_text(encoding="utf-8"))["exchanges"]:
            request = exchange["request"]
            if exchange["response"]["status"] == 401:
                continue  # the document lists 401 for some operations only; the auth test's bad key
            template, _ = api.operation(request["method"], api.doc_path(request["path"]))
            operation = f"{request['method']} {template}"
            for problem in api.check(exchange):
                allowed = [k for k in CLIENT_OVER_DOCUMENT if k[0] == operation and re.search(k[1], problem)]
                used.update(allowed)
                if not allowed:
                    problems.append(f"{recording.name}: {operation}: {problem}")
    assert problems == []
    assert used == set(CLIENT_OVER_DOCUMENT), f"no longer needed: {sorted(set(CLIENT_OVER_DOCUMENT) - used)}"


def test_every_call_the_adapter_makes_is_a_published_operation() -> None:
    api = YamlApi(FIXTURES / "published" / "openapi.yaml")
    client = json.loads((FIXTURES / "client_requests.json").read_text(encoding="utf-8"))
    for request in client["requests"]:
        concrete = request["path"].replace("{id}", "123")
        template, operation = api.operation(request["method"], api.doc_path(concrete))
        assert operation.get("security") != [], f"{request['method']} {template} is not authenticated"
