"""Check recorded provider exchanges against a provider's published OpenAPI document (3.0 or 3.1).

:meth:`PublishedApi.check` takes one recorded request/response pair (tests/support/fakecloud/recording.py's
shape) and says what in it the document does not allow: an unknown path or method, a request body that
does not match the operation's schema (and, with ``closed_requests``, a body field the schema does not
name: the document leaves objects open, so a misspelt field would pass unseen), a response body that
does not match the schema given for its status (a shared ``components/responses`` one too, JSON or RFC 9457
``application/problem+json``), and, with ``check_query``, a query parameter the operation does not document
or a value its schema does not allow.  OpenAPI 3.0's ``nullable: true`` is read as JSON Schema's
``"null"`` type; the vendored document itself is never changed.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

# statuses any operation may answer (rate limiting, server errors) that documents do not list per operation
ANY_OPERATION = ("429", "500", "503")


def _nullable_to_null(node: Any) -> Any:
    """OpenAPI 3.0 schemas as JSON Schema 2020-12: ``nullable: true`` adds ``"null"`` to the type."""
    if isinstance(node, list):
        return [_nullable_to_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nullable_to_null(value) for key, value in node.items()}
    if out.pop("nullable", False) is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif "$ref" in out:
            out = {"anyOf": [{"$ref": out.pop("$ref")}, {"type": "null"}], **out}
    return out


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


class PublishedApi:
    """One vendored document.  ``doc_path`` turns a recorded request path into the document's path (the
    recordings keep paths below the adapter's base URL, the documents their own way)."""

    check_query = False  # recorded query parameters must be documented ones with allowed values

    def __init__(self, path: Path, label: str, doc_path: Callable[[str], str], *,
                 auth: tuple[str, ...] = ("bearer",), closed_requests: bool = False, check_query: bool = False) -> None:
        raw: dict[str, Any] = json.loads(path.read_text())
        self.doc: dict[str, Any] = _nullable_to_null(copy.deepcopy(raw)) if raw["openapi"].startswith("3.0") else raw
        self.label, self.doc_path, self.auth, self.closed = label, doc_path, auth, closed_requests
        self.check_query = check_query
        self.uri = f"urn:gpuq:{label.lower().replace(' ', '-')}-openapi"
        self.registry: Registry = Registry().with_resource(
            self.uri, Resource.from_contents(self.doc, default_specification=DRAFT202012))

    def _validator(self, *parts: str) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"{self.uri}#/{_pointer(*parts)}"}, registry=self.registry)

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        """The documented path template and operation for a concrete (document) path."""
        for template, ops in self.doc["paths"].items():
            pattern = "^" + re.sub(r"\\\{[^/]+\\\}", "[^/]+", re.escape(template)) + "$"
            if re.match(pattern, path) and method.lower() in ops:
                return template, ops[method.lower()]
        raise AssertionError(f"{method} {path} is not an operation of the published {self.label} API")

    def _schema(self, *parts: str) -> Any:
        node: Any = self.doc
        for part in parts:
            node = node[part]
        while isinstance(node, dict) and "$ref" in node and len(node) == 1:
            node = self._schema(*node["$ref"].removeprefix("#/").split("/"))
        return node

    @staticmethod
    def _errors(validator: Draft202012Validator, body: Any) -> list[str]:
        return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(body)]

    def check(self, exchange: dict[str, Any]) -> list[str]:
        """What in one recorded request/response pair the document does not allow."""
        req, resp = exchange["request"], exchange["response"]
        template, op = self.operation(req["method"], self.doc_path(req["path"]))
        method = req["method"].lower()
        problems: list[str] = []
        if req.get("auth") not in self.auth:
            problems.append(f"request sent no {'/'.join(self.auth)} authorization ({req.get('auth')})")
        body_schema = op.get("requestBody", {}).get("content", {}).get("application/json")
        where = ("paths", template, method, "requestBody", "content", "application/json", "schema")
        if req.get("json") is not None:
            if body_schema is None:
                problems.append(f"{req['method']} {template} takes no JSON body")
            else:
                problems += [f"request: {e}" for e in self._errors(self._validator(*where), req["json"])]
                known = self._schema(*where).get("properties", {})
                if self.closed and isinstance(req["json"], dict):
                    problems += [f"request: {k!r} is not a field of the documented body" for k in req["json"]
                                 if k not in known]
        elif body_schema is not None and op["requestBody"].get("required"):
            problems.append(f"{req['method']} {template} requires a JSON body")
        if self.check_query:
            problems += self._query_problems(template, method, req.get("query") or {})
        status = str(resp["status"])
        responses = op["responses"]
        key = status if status in responses else ("default" if "default" in responses else None)
        if key is None:
            if status not in ANY_OPERATION:
                problems.append(f"{req['method']} {template} documents no {status} response")
            return problems
        where: list[str] = ["paths", template, method, "responses", key]
        documented = responses[key]
        if "$ref" in documented:  # a shared response (components/responses/...)
            where = documented["$ref"].removeprefix("#/").split("/")
            documented = self._schema(*where)
        content = documented.get("content", {})
        kind = next((k for k in ("application/json", "application/problem+json") if k in content), None)
        if kind is None:
            return problems  # documented without a body schema: any body
        if "json" not in resp:
            problems.append(f"response {status} is not JSON")
            return problems
        validator = self._validator(*where, "content", kind, "schema")
        problems += [f"response {status}: {e}" for e in self._errors(validator, resp["json"])]
        return problems

    def _query_problems(self, template: str, method: str, query: dict[str, list[str]]) -> list[str]:
        """Query parameters the operation does not document, or whose value its schema does not allow
        (form style: a comma-separated value of an array schema is split; integers and booleans parsed)."""
        ops = self.doc["paths"][template]
        declared: dict[str, Any] = {}
        for param in [*ops.get("parameters", []), *ops[method].get("parameters", [])]:
            if "$ref" in param:
                param = self._schema(*param["$ref"].removeprefix("#/").split("/"))
            if param.get("in") == "query":
                declared[param["name"]] = param["schema"]
        problems = []
        for name, values in query.items():
            if name not in declared:
                problems.append(f"query: {name!r} is not a documented parameter")
                continue
            schema = declared[name]
            kind = self._schema_of(schema).get("type")
            value: Any = values[0] if len(values) == 1 else values
            if kind == "array" and isinstance(value, str):
                value = value.split(",")
            elif kind == "integer" and isinstance(value, str) and value.lstrip("-").isdigit():
                value = int(value)
            elif kind == "boolean" and value in ("true", "false"):
                value = value == "true"
            validator = Draft202012Validator(_absolute(schema, self.uri), registry=self.registry)
            problems += [f"query {name}: {e}" for e in self._errors(validator, value)]
        return problems

    def _schema_of(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self._schema(*schema["$ref"].removeprefix("#/").split("/"))
        return schema


def _absolute(node: Any, uri: str) -> Any:
    """A schema taken out of the document, its ``#/...`` references pointed back into it."""
    if isinstance(node, list):
        return [_absolute(item, uri) for item in node]
    if not isinstance(node, dict):
        return node
    return {k: (f"{uri}{v}" if k == "$ref" and isinstance(v, str) and v.startswith("#") else _absolute(v, uri))
            for k, v in node.items()}
