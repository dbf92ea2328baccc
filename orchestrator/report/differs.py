"""What a cell runs differently from the baseline: the report's "what differs" lines.

Pure: each side is a :class:`Setup` (the queue line's fields and, where it could be read, the config
file's text as submitted); the lines name the config keys that differ (nested YAML keys dotted), the
trainer arguments that differ (``--key value`` / ``--key=value``, seed arguments left out: seeds are
what a cell is made of), and the task, epochs, GPUs and nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import yaml

MAX_LINES = 8  # per cell; the rest is counted
_MISSING = object()


@dataclass(frozen=True)
class Setup:
    """What one cell's jobs were submitted with (its first job's fields: a cell differs only by seed)."""

    config: str
    config_sha256: str
    config_text: str | None  # None: the submitted bytes are not at hand (moved or edited since)
    task: str
    epochs: int
    gpus: int
    nodes: int
    args: Sequence[str] = field(default_factory=tuple)


def flatten(document: object, prefix: str = "") -> dict[str, object]:
    """Nested mappings as dotted keys (``optim.lr``); a list or scalar is one value."""
    if not isinstance(document, Mapping):
        return {prefix or "(document)": document}
    out: dict[str, object] = {}
    for key, value in document.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def _show(value: object) -> str:
    if value is _MISSING:
        return "unset"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("...").strip()
    return text if len(text) <= 40 else text[:39] + "…"


def _argument(value: object) -> str:
    return "unset" if value is _MISSING else "set" if value is True else str(value)


def _keyed(changes: Mapping[str, tuple[object, object]], label: str, show: Callable[[object], str]) -> list[str]:
    return [f"{label}{key}: {show(changes[key][0])} (baseline {show(changes[key][1])})" for key in sorted(changes)]


def _compare(mine: Mapping[str, object], base: Mapping[str, object]) -> dict[str, tuple[object, object]]:
    keys = set(mine) | set(base)
    return {k: (mine.get(k, _MISSING), base.get(k, _MISSING)) for k in keys
            if mine.get(k, _MISSING) != base.get(k, _MISSING)}


def _config_lines(mine: Setup, base: Setup) -> list[str]:
    if mine.config_sha256 == base.config_sha256 and mine.config_sha256:
        return []
    named = f"config {mine.config}" + ("" if mine.config == base.config else f" (baseline {base.config})")
    if mine.config_text is None or base.config_text is None:
        return [f"{named}: other bytes; their contents are not at hand to compare"]
    try:
        ours, theirs = yaml.safe_load(mine.config_text), yaml.safe_load(base.config_text)
    except yaml.YAMLError:
        return [f"{named}: other bytes (not YAML, so not compared key by key)"]
    changes = _compare(flatten(ours), flatten(theirs))
    if not changes:
        return [f"{named}: same keys and values, other bytes (comments or layout)"]
    keyed = _keyed(changes, "config ", _show)
    return keyed if mine.config == base.config else [named, *keyed]


def options(args: Sequence[str]) -> dict[str, object]:
    """Trainer arguments as option -> value (``--lr 0.1``, ``--lr=0.1``; words that
    follow no option are positional ``#k``; a flag alone is True), seed options left out."""
    out: dict[str, object] = {}
    i, position = 0, 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and len(word) > 1 and not _number(word):
            key, eq, value = word.partition("=")
            if eq:
                out[key] = value
            elif i + 1 < len(args) and not (args[i + 1].startswith("-") and not _number(args[i + 1])):
                out[key] = args[i + 1]
                i += 1
            else:
                out[key] = True
        else:
            out[f"#{position}"] = word
            position += 1
        i += 1
    return {k: v for k, v in out.items() if "seed" not in k.lower()}


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def differences(mine: Setup, base: Setup) -> list[str]:
    """One line per thing ``mine`` runs differently from ``base``; at most MAX_LINES, the rest counted."""
    lines = _config_lines(mine, base)
    for label, ours, theirs in (("task", mine.task, base.task), ("epochs", mine.epochs or "not given",
                                base.epochs or "not given"), ("gpus", mine.gpus, base.gpus),
                                ("nodes", mine.nodes, base.nodes)):
        if ours != theirs:
            lines.append(f"{label} {ours} (baseline {theirs})")
    lines += _keyed(_compare(options(mine.args), options(base.args)), "argument ", _argument)
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES - 1], f"and {len(lines) - MAX_LINES + 1} more differences"]
    return lines
