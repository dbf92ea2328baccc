"""Just enough GraphQL for the fake RunPod: literal-only documents, selections, input validation.

Parses ``query { ... }`` / ``mutation { ... }`` (optionally named) with fields, aliases, arguments
whose values are literals (strings, block strings, numbers, booleans, null, enums, lists, objects) and
nested selections.  Variables (``$x``), fragments and directives are refused, as the real adapter
never sends them (docs/providers.md).  Results are projected through the selection exactly: selecting
an unknown field, omitting a required sub-selection or selecting into a scalar is a GraphQL error
with graphql-js wording, delivered with HTTP 200 like the real API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class GraphQLError(Exception):
    """A GraphQL error: reported in ``errors`` with HTTP 200."""

    def __init__(self, message: str, path: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path or []


class EnumValue(str):
    """An unquoted enum literal (``SECURE``), as opposed to the string ``"SECURE"``."""


@dataclass
class Field:
    name: str
    alias: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    selection: list[Field] | None = None

    @property
    def key(self) -> str:
        return self.alias or self.name


@dataclass
class Operation:
    kind: str  # "query" | "mutation"
    fields: list[Field]


_TOKEN = re.compile(r'''
    (?P<ws>[\s,\ufeff]+|\#[^\n]*)
  | (?P<block>"""(?:\\"""|[^"]|"(?!""))*""")
  | (?P<string>"(?:\\.|[^"\\\n])*")
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[_A-Za-z][_0-9A-Za-z]*)
  | (?P<punct>\.\.\.|[!$&()\:=@\[\]{}|])
''', re.VERBOSE)


def _tokens(source: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise GraphQLError(f"Syntax Error: Unexpected character: {source[pos]!r}.")
        kind = match.lastgroup or ""
        if kind != "ws":
            out.append((kind, match.group()))
        pos = match.end()
    out.append(("eof", ""))
    return out


class _Parser:
    def __init__(self, source: str) -> None:
        self.toks = _tokens(source)
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i]

    def take(self, kind: str | None = None, value: str | None = None) -> str:
        tok_kind, tok_value = self.toks[self.i]
        if (kind is not None and tok_kind != kind) or (value is not None and tok_value != value):
            shown = "<EOF>" if tok_kind == "eof" else f'"{tok_value}"'
            raise GraphQLError(f"Syntax Error: Expected {value or kind}, found {shown}.")
        self.i += 1
        return tok_value

    def document(self) -> Operation:
        kind, value = self.peek()
        op = "query"
        if kind == "name" and value in ("query", "mutation", "subscription"):
            op = self.take()
            if op == "subscription":
                raise GraphQLError("Subscriptions are not supported.")
            if self.peek()[0] == "name":
                self.take()
            if self.peek() == ("punct", "("):
                raise GraphQLError("Variables are not supported by this fake (the real adapter never sends them).")
        elif kind == "name" and value == "fragment":
            raise GraphQLError("Fragments are not supported by this fake.")
        fields = self.selection_set()
        if self.peek()[0] != "eof":
            raise GraphQLError("This fake accepts exactly one operation per document.")
        return Operation(op, fields)

    def selection_set(self) -> list[Field]:
        self.take("punct", "{")
        fields: list[Field] = []
        while self.peek() != ("punct", "}"):
            if self.peek() == ("punct", "..."):
                raise GraphQLError("Fragments are not supported by this fake.")
            fields.append(self.field())
        self.take("punct", "}")
        if not fields:
            raise GraphQLError("Syntax Error: Expected Name, found \"}\".")
        return fields

    def field(self) -> Field:
        name = self.take("name")
        alias = None
        if self.peek() == ("punct", ":"):
            self.take()
            alias, name = name, self.take("name")
        args: dict[str, Any] = {}
        if self.peek() == ("punct", "("):
            self.take()
            while self.peek() != ("punct", ")"):
                arg = self.take("name")
                self.take("punct", ":")
                args[arg] = self.value()
            self.take("punct", ")")
        if self.peek() == ("punct", "@"):
            raise GraphQLError("Directives are not supported by this fake.")
        selection = self.selection_set() if self.peek() == ("punct", "{") else None
        return Field(name, alias, args, selection)

    def value(self) -> Any:
        kind, text = self.peek()
        if kind == "punct" and text == "$":
            raise GraphQLError("Variables are not supported by this fake (the real adapter never sends them).")
        if kind == "string":
            self.take()
            try:
                return str(json.loads(text))
            except ValueError as exc:
                raise GraphQLError(f"Syntax Error: Invalid string {text[:40]}.") from exc
        if kind == "block":
            self.take()
            return text[3:-3].replace('\\"""', '"""')
        if kind == "number":
            self.take()
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name":
            self.take()
            if text in ("true", "false"):
                return text == "true"
            return None if text == "null" else EnumValue(text)
        if text == "[":
            self.take()
            items = []
            while self.peek() != ("punct", "]"):
                items.append(self.value())
            self.take("punct", "]")
            return items
        if text == "{":
            self.take()
            obj: dict[str, Any] = {}
            while self.peek() != ("punct", "}"):
                key = self.take("name")
                self.take("punct", ":")
                obj[key] = self.value()
            self.take("punct", "}")
            return obj
        raise GraphQLError(f"Syntax Error: Unexpected \"{text or '<EOF>'}\".")


def parse(source: str) -> Operation:
    return _Parser(source).document()


# -- input validation -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputType:
    """A GraphQL input object type: ``fields`` maps name → type spec; ``required`` names the ``!`` ones.

    Type specs: ``String``, ``Int``, ``Float``, ``Boolean``, ``[String]``, ``enum:<Name>:<A|B|C>``, or
    another InputType for nested objects (``[<InputType>]`` via a one-element list).
    """

    name: str
    fields: Mapping[str, Any]
    required: frozenset[str] = frozenset()


def _type_label(spec: Any) -> str:
    if isinstance(spec, InputType):
        return spec.name
    if isinstance(spec, list):
        return f"[{_type_label(spec[0])}]"
    if isinstance(spec, str) and spec.startswith("enum:"):
        return spec.split(":")[1]
    return str(spec)


def _show(value: Any) -> str:
    if isinstance(value, EnumValue):
        return str(value)
    return json.dumps(value)


def check_value(spec: Any, value: Any, where: str) -> Any:
    """Validate one literal against its type spec; returns it (enums as plain str)."""
    if value is None:
        return None
    if isinstance(spec, InputType):
        if not isinstance(value, dict):
            raise GraphQLError(f'Expected value of type "{spec.name}", found {_show(value)}.')
        return check_input(spec, value)
    if isinstance(spec, list):
        items = value if isinstance(value, list) else [value]  # GraphQL input coercion of a single item
        return [check_value(spec[0], item, where) for item in items]
    if isinstance(spec, str) and spec.startswith("enum:"):
        _, name, allowed = spec.split(":")
        if not isinstance(value, EnumValue):
            hint = f' Did you mean the enum value "{value}"?' if value in allowed.split("|") else ""
            raise GraphQLError(f'Enum "{name}" cannot represent non-enum value: {_show(value)}.{hint}')
        if value not in allowed.split("|"):
            raise GraphQLError(f'Value "{value}" does not exist in "{name}" enum.')
        return str(value)
    ok = {
        "String": isinstance(value, str) and not isinstance(value, EnumValue),
        "Int": isinstance(value, int) and not isinstance(value, bool),
        "Float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "Boolean": isinstance(value, bool),
    }.get(spec, False)
    if not ok:
        article = "an" if spec[0] in "AEIOU" else "a"
        raise GraphQLError(f"{spec} cannot represent {article} non {spec.lower()} value: {_show(value)} ({where})")
    return value


def check_input(spec: InputType, value: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in spec.fields:
            raise GraphQLError(f'Field "{key}" is not defined by type "{spec.name}".')
        out[key] = check_value(spec.fields[key], item, f"{spec.name}.{key}")
    for key in sorted(spec.required):
        if out.get(key) is None:
            raise GraphQLError(f'Field "{spec.name}.{key}" of required type "{_type_label(spec.fields[key])}!" '
                               "was not provided.")
    return out


def input_arg(fld: Field, spec: InputType, *, required: bool = True) -> dict[str, Any]:
    """The ``input:`` argument of ``fld``, validated; the only argument RunPod's fields take."""
    for arg in fld.args:
        if arg != "input":
            raise GraphQLError(f'Unknown argument "{arg}" on field "{fld.name}".')
    if "input" not in fld.args:
        if required:
            raise GraphQLError(f'Field "{fld.name}" argument "input" of type "{spec.name}!" is required, '
                               "but it was not provided.")
        return {}
    raw = fld.args["input"]
    if not isinstance(raw, dict):
        raise GraphQLError(f'Expected value of type "{spec.name}!", found {_show(raw)}.')
    return check_input(spec, raw)


# -- result projection ----------------------------------------------------------------------------------

Resolver = Callable[[Field], Any]


def project(value: Any, fld: Field, path: list[str]) -> Any:
    """Shape ``value`` by ``fld.selection``.  Objects are dicts with a ``__typename``; a callable value is a
    field with arguments, called with the Field."""
    if callable(value):
        value = value(fld)
    elif fld.args:
        raise GraphQLError(f'Unknown argument "{next(iter(fld.args))}" on field "{fld.name}".', path)
    if value is None:
        return None
    if isinstance(value, list):
        return [project_item(item, fld, path) for item in value]
    return project_item(value, fld, path)


def project_item(value: Any, fld: Field, path: list[str]) -> Any:
    if isinstance(value, dict):
        type_name = value.get("__typename", "Object")
        if fld.selection is None:
            raise GraphQLError(f'Field "{fld.name}" of type "{type_name}" must have a selection of subfields. '
                               f'Did you mean "{fld.name} {{ ... }}"?', path)
        out: dict[str, Any] = {}
        for sub in fld.selection:
            if sub.name == "__typename":
                out[sub.key] = type_name
                continue
            if sub.name not in value:
                raise GraphQLError(f'Cannot query field "{sub.name}" on type "{type_name}".', [*path, sub.key])
            out[sub.key] = project(value[sub.name], sub, [*path, sub.key])
        return out
    if fld.selection is not None:
        raise GraphQLError(f'Field "{fld.name}" must not have a selection since its type has no subfields.', path)
    return value
