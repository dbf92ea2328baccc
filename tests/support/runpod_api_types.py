"""RunPod's GraphQL types as the API itself describes them, extracted from the Go types that gqlgen
generated from the live API's introspection (the source is named in tests/fixtures/providers/README.md).

RunPod publishes no schema file; that generated file is the closest machine-readable description.  This
module turns its structs and enums into a small JSON document of the types gpuq's RunPod fake speaks, which
tests/unit/test_runpod_published_types.py checks the fake against:

    python -m tests.support.runpod_api_types models_gen.go > tests/fixtures/providers/runpod/published/api-types.json

gqlgen's conventions, which the reading relies on: a field is nullable exactly when its JSON tag has
``omitempty``; ``*T`` is a nullable element, ``[]T`` a list; Go's string, int, float64 and bool are GraphQL's
String (or ID), Int, Float and Boolean; other names are object, input or enum types.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

STRUCT = re.compile(r"^type (\w+) struct \{$")
FIELD = re.compile(r'^\t\w+\s+(\S+)\s+`json:"(\w+)(,omitempty)?"`$')
ENUM = re.compile(r"^type (\w+) string$")
ENUM_VALUE = re.compile(r'^\t\w+\s+(\w+) = "(\w+)"$')
SCALARS = {"string": "String", "int": "Int", "float64": "Float", "bool": "Boolean"}

# the types gpuq's fake answers with or accepts, and every input or enum type they lead to
OBJECTS = ("User", "Pod", "PodMachineInfo", "PodRuntime", "PodRuntimePorts", "PodRuntimeGpus", "PodRuntimeContainer",
           "GpuType", "LowestPrice")
INPUTS = ("PodFindAndDeployOnDemandInput", "PodRentInterruptableInput", "PodStopInput", "PodTerminateInput",
          "PodResumeInput", "PodBidResumeInput", "PodFilter", "GpuTypeFilter", "GpuLowestPriceInput",
          "UpdateUserSettingsInput", "EnvironmentVariableInput")


def field_type(go: str, tagged_optional: bool) -> dict[str, Any]:
    """One Go field type as {"type", "nullable", "list", "item_nullable"}."""
    spec: dict[str, Any] = {"nullable": tagged_optional, "list": go.startswith("[]")}
    if spec["list"]:
        go = go[2:]
        spec["item_nullable"] = go.startswith("*")
    go = go.lstrip("*")
    spec["type"] = SCALARS.get(go, go)
    return spec


def parse_go(text: str) -> dict[str, dict[str, Any]]:
    """Every struct (its fields by JSON name) and every string enum (its values) of a gqlgen models file."""
    types: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    enum: list[str] | None = None
    for line in text.splitlines():
        if current is not None:
            if line == "}":
                current = None
                continue
            m = FIELD.match(line)
            if m:
                current[m.group(2)] = field_type(m.group(1), m.group(3) is not None)
            continue
        m = STRUCT.match(line)
        if m:
            current = {}
            types[m.group(1)] = {"kind": "struct", "fields": current}
            continue
        m = ENUM.match(line)
        if m:
            enum = []
            types[m.group(1)] = {"kind": "enum", "values": enum}
            continue
        if line.startswith("const (") or line == ")":
            continue
        m = ENUM_VALUE.match(line)
        if m and m.group(1) in types and types[m.group(1)]["kind"] == "enum":
            types[m.group(1)]["values"].append(m.group(2))
    return types


def extract(types: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The named object and input types, with every input and enum type reachable from them."""
    wanted: dict[str, dict[str, Any]] = {}
    todo = [*OBJECTS, *INPUTS]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        if name not in types:
            raise SystemExit(f"type {name} is not in the models file")
        kind = types[name]["kind"]
        wanted[name] = dict(types[name], kind="input" if name in INPUTS or name.endswith("Input") else
                            "object" if kind == "struct" else "enum")
        if kind == "struct":
            for spec in types[name]["fields"].values():
                ref = types.get(spec["type"])
                if ref is not None and (ref["kind"] == "enum" or name not in OBJECTS):
                    todo.append(spec["type"])
    return dict(sorted(wanted.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.runpod_api_types MODELS_GEN_GO", file=sys.stderr)
        return 2
    print(json.dumps({"types": extract(parse_go(Path(argv[0]).read_text(encoding="utf-8")))}, indent=1,
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
