"""A ``--json`` document's text: ``json.dumps(value, indent=2, sort_keys=True)``, character for character,
fast enough for ``gpuq results --json`` on 10,000 jobs.

``json.dumps`` with an indent runs the json module's pure-Python encoder, one generator step per value:
about a second for a 10,000-job results document.  ``dumps`` writes the same text column by column:
the values found at one place of many dicts that share their keys (a document's rows; the ``final``
dicts of those rows; ...) are written together, their scalars in one call of json's C encoder
(separated by a NUL, which an encoded value never holds: json escapes every control character), and
each dict is one template filled with its column's texts.  ``tests/unit/test_render_scale.py``
compares the two on varied documents.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

_SCALARS = frozenset({str, int, float, bool, type(None)})
# json's C encoder (no indent), for lists of scalars only: the item separator is all it writes between them
_C = json.JSONEncoder(separators=("\x00", ":"), check_circular=False)


def dumps(value: Any) -> str:
    """``json.dumps(value, indent=2, sort_keys=True)`` of JSON data: dicts with str keys, lists, tuples,
    str, int, float, bool, None (and their subclasses)."""
    return _column([value], "")[0]


def _column(values: Sequence[Any], pad: str) -> list[str]:
    """The text of each of ``values``, its lines after the first indented by ``pad``."""
    kinds = set(map(type, values))
    if kinds <= _SCALARS:
        return _scalars(values)
    if kinds == {dict}:
        return _dicts(values, pad)
    out = [""] * len(values)
    scalars: list[int] = []
    dicts: list[int] = []
    for i, value in enumerate(values):
        if type(value) in _SCALARS:
            scalars.append(i)
        elif isinstance(value, dict):
            dicts.append(i)
        elif isinstance(value, list | tuple):
            out[i] = _list(value, pad)
        else:
            out[i] = _C.encode(value)  # a str, int or float subclass as json writes it, or json's TypeError
    for i, text in zip(scalars, _scalars([values[i] for i in scalars]), strict=True):
        out[i] = text
    for i, text in zip(dicts, _dicts([values[i] for i in dicts], pad), strict=True):
        out[i] = text
    return out


def _scalars(values: Sequence[Any]) -> list[str]:
    return _C.encode(list(values))[1:-1].split("\x00") if values else []


def _list(value: Sequence[Any], pad: str) -> str:
    if not value:
        return "[]"
    inner = pad + "  "
    return "[\n" + ",\n".join(inner + text for text in _column(value, inner)) + "\n" + pad + "]"


def _dicts(values: Sequence[dict[str, Any]], pad: str) -> list[str]:
    """Each dict of ``values``: those with the same keys (in the same order) are filled in together."""
    shapes = list(map(tuple, values))
    if len(set(shapes)) <= 1:
        return _filled(values, shapes[0], pad) if values else []
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    out = [""] * len(values)
    for shape, where in groups.items():
        for i, text in zip(where, _filled([values[i] for i in where], shape, pad), strict=True):
            out[i] = text
    return out


def _filled(values: Sequence[dict[str, Any]], keys: tuple[str, ...], pad: str) -> list[str]:
    """Dicts that all have ``keys``: one template, filled with the texts of their values column by column."""
    if not keys:
        return ["{}"] * len(values)
    order = sorted(keys, key=_key)
    inner = pad + "  "
    template = "{\n" + ",\n".join(f"{inner}{_string(k).replace('%', '%%')}: %s" for k in order) + "\n" + pad + "}"
    picked = map(itemgetter(*order), values) if len(order) > 1 else zip(map(itemgetter(order[0]), values))
    columns = [_column(column, inner) for column in zip(*picked, strict=True)]
    return list(map(template.__mod__, zip(*columns, strict=True)))


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"keys must be str, not {type(key).__name__}")
    return key


def _string(key: str) -> str:
    return json.encoder.encode_basestring_ascii(key)
