"""The RunPod fake checked against RunPod's own description of its API types.

RunPod publishes no schema file (tests/fixtures/providers/README.md); the closest machine-readable
description is the Go code gqlgen generated from the live API's introspection in RunPod's Pulumi provider.
tests/support/runpod_api_types.py extracted from it, into
tests/fixtures/providers/runpod/published/api-types.json, every type the fake speaks.  Here:

- every input type the fake accepts exists in the API under the same name; each field the fake accepts
  exists there with the same type, and every field the API requires the fake requires too (the fake is
  nowhere more lenient; where it is stricter is listed and pinned);
- every response the fake gave in the recorded exchanges (tests/fixtures/providers/runpod/fake/), and every
  field the fake can answer at all, is a field of the API type with a value of its type, null only where
  the API allows null, enums among the API's values.

That Go file has no Query or Mutation fields, so which type each root field returns is taken from RunPod's
GraphQL reference page (ROOT_TYPES); documents themselves cannot be validated against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakecloud import graphql as gql
from tests.support.fakecloud import runpod as fake

PROVIDERS = Path(__file__).resolve().parents[1] / "fixtures" / "providers"
API = json.loads((PROVIDERS / "runpod" / "published" / "api-types.json").read_text())["types"]
RECORDINGS = sorted((PROVIDERS / "runpod" / "fake").glob("*.json"))
# https://graphql-spec.runpod.io/ (the root fields gpuq uses); podTerminate returns Void, i.e. null
ROOT_TYPES: dict[str, dict[str, Any] | None] = {
    "myself": {"type": "User", "nullable": True, "list": False},
    "pod": {"type": "Pod", "nullable": True, "list": False},
    "gpuTypes": {"type": "GpuType", "nullable": True, "list": True, "item_nullable": True},
    **{name: {"type": "Pod", "nullable": True, "list": False}
       for name in ("podFindAndDeployOnDemand", "podRentInterruptable", "podStop", "podResume", "podBidResume")},
    "podTerminate": None,
    "updateUserSettings": {"type": "User", "nullable": True, "list": False},
}
FAKE_INPUTS = (fake.DEPLOY_INPUT, fake.RENT_INPUT, fake.POD_ID_INPUT, fake.TERMINATE_INPUT, fake.RESUME_INPUT,
               fake.BID_RESUME_INPUT, fake.POD_FILTER, fake.GPU_FILTER, fake.LOWEST_PRICE_INPUT,
               fake.USER_SETTINGS_INPUT, fake._ENV)
# where the fake requires what the API leaves optional: gpuq always sends these (a comment in the fake says so)
STRICTER = {"PodFindAndDeployOnDemandInput": {"gpuCount", "gpuTypeId"},
            "PodRentInterruptableInput": {"bidPerGpu", "gpuCount", "gpuTypeId"}}
PYTHON_KINDS: dict[str, tuple[type, ...]] = {"String": (str,), "Int": (int,), "Float": (int, float),
                                             "Boolean": (bool,)}


def _fake_field(spec: Any) -> dict[str, Any]:
    """A fake input field's type spec in the extract's terms."""
    if isinstance(spec, list):
        return {**_fake_field(spec[0]), "list": True}
    if isinstance(spec, gql.InputType):
        return {"type": spec.name, "list": False}
    if spec.startswith("enum:"):
        return {"type": spec.split(":")[1], "list": False, "values": sorted(spec.split(":")[2].split("|"))}
    return {"type": spec, "list": False}


def input_drift(spec: gql.InputType) -> list[str]:
    """How a fake input type differs from the API's, beyond the stricter requirements listed above."""
    api = API.get(spec.name)
    if api is None or api["kind"] != "input":
        return [f"{spec.name} is not an input type of the API"]
    problems = []
    for name, fspec in spec.fields.items():
        want = api["fields"].get(name)
        if want is None:
            problems.append(f"{spec.name}.{name} is not a field of the API's {spec.name}")
            continue
        got = _fake_field(fspec)
        if (got["type"], got["list"]) != (want["type"], want["list"]):
            problems.append(f"{spec.name}.{name}: the fake takes {got['type']}{'[]' if got['list'] else ''}, "
                            f"the API {want['type']}{'[]' if want['list'] else ''}")
        if "values" in got and got["values"] != sorted(API[want["type"]]["values"]):
            problems.append(f"{spec.name}.{name}: the fake's values {got['values']} are not the API's "
                            f"{sorted(API[want['type']]['values'])}")
    api_required = {n for n, f in api["fields"].items() if not f["nullable"]}
    for name in sorted(api_required - set(spec.required)):
        problems.append(f"{spec.name}.{name} is required by the API but optional in the fake")
    extra = set(spec.required) - api_required
    if extra != STRICTER.get(spec.name, set()):
        problems.append(f"{spec.name}: the fake requires {sorted(extra)} beyond the API, "
                        f"not {sorted(STRICTER.get(spec.name, set()))}")
    return problems


def value_drift(value: Any, spec: dict[str, Any] | None, where: str) -> list[str]:
    """What in one response value the API's type does not allow (``spec`` None: the field returns null)."""
    if spec is None:
        return [] if value is None else [f"{where}: the API returns null here, the fake {value!r}"]
    if value is None:
        return [] if spec["nullable"] else [f"{where}: null where the API's {spec['type']} is non-null"]
    if spec["list"]:
        if not isinstance(value, list):
            return [f"{where}: {value!r} where the API has a list of {spec['type']}"]
        item = {"type": spec["type"], "nullable": spec.get("item_nullable", True), "list": False}
        return [p for i, v in enumerate(value) for p in value_drift(v, item, f"{where}[{i}]")]
    kind = spec["type"]
    if kind in PYTHON_KINDS:
        ok = isinstance(value, PYTHON_KINDS[kind]) and (kind == "Boolean" or not isinstance(value, bool))
        return [] if ok else [f"{where}: {value!r} is not {kind}"]
    api = API.get(kind)
    if api is None:
        return [f"{where}: the fake answers with type {kind}, which the extract does not describe"]
    if api["kind"] == "enum":
        return [] if value in api["values"] else [f"{where}: {value!r} is not one of {kind}'s {api['values']}"]
    if not isinstance(value, dict):
        return [f"{where}: {value!r} where the API has an object {kind}"]
    problems = []
    if value.get("__typename", kind) != kind:
        problems.append(f"{where}: the fake calls it {value['__typename']}, the API {kind}")
    for name, sub in value.items():
        if name == "__typename":
            continue
        if name not in api["fields"]:
            problems.append(f"{where}.{name} is not a field of the API's {kind}")
            continue
        if callable(sub):  # a field with arguments: what the fake answers for gpuq's own call
            args = "(input: {gpuCount: 1})" if name == "lowestPrice" else ""
            sub = sub(gql.parse(f"query {{ {name}{args} {{ id }} }}").fields[0])
        problems += value_drift(sub, api["fields"][name], f"{where}.{name}")
    return problems


@pytest.mark.parametrize("spec", FAKE_INPUTS, ids=lambda s: s.name)
def test_every_input_the_fake_accepts_is_one_the_api_has(spec: gql.InputType) -> None:
    assert input_drift(spec) == []


def _answers(path: Path) -> list[tuple[str, Any]]:
    """(root field, value) of every GraphQL response with data in one recording (its REST exchanges are
    checked against RunPod's OpenAPI document: test_providers_published_schema.py)."""
    found = []
    for exchange in json.loads(path.read_text())["exchanges"]:
        if exchange["request"]["path"] != "/graphql":
            continue
        body = exchange["response"].get("json")
        data = body.get("data") if isinstance(body, dict) else None
        found += list((data or {}).items())
    return found


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_every_recorded_response_is_one_the_api_types_allow(path: Path) -> None:
    for root, value in _answers(path):
        assert root in ROOT_TYPES, f"{path.name}: root field {root} is not one gpuq is known to use"
        assert value_drift(value, ROOT_TYPES[root], root) == []


# what gpuq still asks GraphQL for: REST has no prices, no account keys and no re-bid (docs/providers.md);
# the fake still answers the pod roots an older gpuq used (ROOT_TYPES)
GRAPHQL_STILL_USED = {"gpuTypes", "myself", "updateUserSettings", "podBidResume"}


def test_the_recordings_answer_every_root_field_gpuq_uses() -> None:
    assert {root for path in RECORDINGS for root, _ in _answers(path)} == GRAPHQL_STILL_USED


def test_every_field_the_fake_can_answer_is_one_the_api_has() -> None:
    """Not only what gpuq selects: the fake's whole view of a running spot pod, a GPU type and the user."""
    cloud = fake.FakeRunPod(pub_key="ssh-ed25519 AAAA gpuq")
    gpu = cloud.gpu_types["NVIDIA RTX A6000"]
    pod = fake.Pod(id="p1", name="gpuq-a", gpu_type=gpu, gpu_count=1, image="img", spot=True, bid=0.3,
                   env=["A=1"], ports="22/tcp", volume_gb=10, disk_gb=20, mount="/workspace", ip="10.0.0.2",
                   port=22022, machine_id="m1", host_id="h1", last_change="Rented by User: now")
    cloud.pods[pod.id] = pod
    assert value_drift(cloud._pod_view(pod), ROOT_TYPES["pod"], "pod") == []
    assert value_drift([cloud._gpu_view(gpu)], ROOT_TYPES["gpuTypes"], "gpuTypes") == []
    myself = gql.parse("query { myself { pods { id } } }").fields[0]
    assert value_drift(cloud._q_myself(myself), ROOT_TYPES["myself"], "myself") == []


def test_the_checks_catch_a_drifting_fake() -> None:
    """The checks above can fail: a renamed field, a wrong type, a null the API forbids, a wrong enum value,
    a looser requirement and a wrong type name are each named."""
    pod = {"id": "p1", "desiredStatus": "RUNNING", "costPerHr": 0.4, "gpuCount": 1}
    spec = ROOT_TYPES["pod"]
    assert value_drift(pod, spec, "pod") == []
    assert value_drift({**pod, "desired_status": "RUNNING"}, spec, "pod") == [
        "pod.desired_status is not a field of the API's Pod"]
    assert value_drift({**pod, "gpuCount": "1"}, spec, "pod") == ["pod.gpuCount: '1' is not Int"]
    assert value_drift({**pod, "gpuCount": True}, spec, "pod") == ["pod.gpuCount: True is not Int"]
    assert value_drift({**pod, "costPerHr": None}, spec, "pod") == ["pod.costPerHr: null where the API's Float "
                                                                    "is non-null"]
    assert value_drift({**pod, "desiredStatus": "STOPPED"}, spec, "pod") == [
        "pod.desiredStatus: 'STOPPED' is not one of PodStatus's " + str(API["PodStatus"]["values"])]
    assert value_drift({**pod, "machine": {"__typename": "Machine", "podHostId": "h"}}, spec, "pod") == [
        "pod.machine: the fake calls it Machine, the API PodMachineInfo"]
    assert value_drift({"id": "x"}, None, "podTerminate") == ["podTerminate: the API returns null here, the fake "
                                                              "{'id': 'x'}"]
    loose = gql.InputType("PodBidResumeInput", {"podId": "String", "bidPerGpu": "Float", "gpuCount": "Int"},
                          frozenset({"podId"}))
    assert input_drift(loose) == ["PodBidResumeInput.bidPerGpu is required by the API but optional in the fake",
                                  "PodBidResumeInput.gpuCount is required by the API but optional in the fake"]
    assert input_drift(gql.InputType("PodStopInput", {"podId": "Int"}, frozenset({"podId"}))) == [
        "PodStopInput.podId: the fake takes Int, the API String"]
    assert input_drift(gql.InputType("PodStopInput", {"podId": "String", "force": "Boolean"},
                                     frozenset({"podId"}))) == [
        "PodStopInput.force is not a field of the API's PodStopInput"]


def test_the_extractor_reads_gqlgens_conventions() -> None:
    """How api-types.json was made: nullability from omitempty, lists, scalars, enums and their values."""
    from tests.support import runpod_api_types as extractor

    go = ('type PodBidResumeInput struct {\n\tPodID     string  `json:"podId"`\n'
          '\tGpuCount  *int    `json:"gpuCount,omitempty"`\n\t// a comment\n'
          '\tEnv       []*EnvironmentVariableInput `json:"env,omitempty"`\n\tIds []string `json:"ids,omitempty"`\n'
          '\tStatus    *PodStatus `json:"status,omitempty"`\n}\n\ntype PodStatus string\n\nconst (\n'
          '\tPodStatusRunning PodStatus = "RUNNING"\n\tPodStatusExited  PodStatus = "EXITED"\n)\n')
    types = extractor.parse_go(go)
    assert types["PodStatus"] == {"kind": "enum", "values": ["RUNNING", "EXITED"]}
    assert types["PodBidResumeInput"]["fields"] == {
        "podId": {"type": "String", "nullable": False, "list": False},
        "gpuCount": {"type": "Int", "nullable": True, "list": False},
        "env": {"type": "EnvironmentVariableInput", "nullable": True, "list": True, "item_nullable": True},
        "ids": {"type": "String", "nullable": True, "list": True, "item_nullable": False},
        "status": {"type": "PodStatus", "nullable": True, "list": False},
    }
    assert API["PodBidResumeInput"]["fields"]["podId"] == {"type": "String", "nullable": False, "list": False}
