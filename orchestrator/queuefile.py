"""Parse and validate queue files (docs/queue.md).

A queue file is UTF-8 text, one job per line::

    <config_path> <task> [epochs] [key=value ...]   [# comment]

Lexing, in order:

1. Drop one leading BOM; every line must decode as UTF-8.
2. Split on LF and drop one CR at the end of each line; any other CR is a "stray carriage return".
   A line may hold at most 4096 bytes (EOL excluded).
3. The first ``#`` at line start or right after a space or tab starts a comment; ``#`` inside a token is
   literal (``20#note`` is one token).
4. Split the rest on runs of spaces and tabs. No tokens: a blank line, never a job.
5. A token "looks like a field" if it matches ``^[a-z_]+=``. Tokens 1 and 2 (config path and task) must not.
   Token 3 is a field if it looks like one, otherwise the epochs value; every later token must be a field.

Fields: ``name`` ``gpus`` ``nodes`` ``est_min`` ``seed`` ``host`` ``retries``, each at most once, never empty.
Integers are ``0`` or a non-zero digit followed by digits (no sign, no leading zero). The job name is
``name=`` or the config file name without one trailing ``.yaml``/``.yml``; names compare case-insensitively.

Every problem of the whole file is collected, then raised at once as one :class:`QueueParseError`;
columns are 1-based character columns (a tab counts as one). With a workdir, config paths must name a
regular file inside it (symlinks resolved) and are hashed; a config whose top-level ``epochs:`` differs
from the line's epochs gives a warning, which never blocks.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.errors import QueueIssue, QueueParseError
from orchestrator.specs import DEFAULT_EPOCHS, JobSpec, ParsedQueue

MAX_LINE_BYTES = 4096
MAX_EPOCHS = 2**63 - 1  # what the ledger's SQLite INTEGER can hold
BOM = b"\xef\xbb\xbf"
WS = " \t"
ALLOWED_KEYS = ("name", "gpus", "nodes", "est_min", "seed", "host", "retries")
INT_RANGES: dict[str, tuple[int, int]] = {
    "gpus": (1, 64),
    "nodes": (1, 64),
    "seed": (0, 4294967295),
    "retries": (0, 10),
}

_FIELD_RE = re.compile(r"[a-z_]+=")
_TOKEN_RE = re.compile(r"[^ \t]+")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME_CHARS_RE = re.compile(r"[A-Za-z0-9._-]*")
_INT_RE = re.compile(r"0|[1-9][0-9]*")
_LEADING_ZERO_RE = re.compile(r"0[0-9]+")
_DECIMAL_RE = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class Token:
    """One whitespace-separated token and its 1-based character column."""

    text: str
    column: int


@dataclass
class _Draft:
    """What one job line says, before the file-wide checks."""

    number: int
    raw: str
    config: Token
    task: Token
    epochs: int = DEFAULT_EPOCHS
    ints: dict[str, int] = field(default_factory=dict)
    est_min: float | None = None
    host: Token | None = None
    name: str | None = None
    config_ok: bool = True
    sha256: str = ""


@dataclass(frozen=True)
class _ConfigInfo:
    """The environment's answer for one config path: an error, or its hash and YAML ``epochs:``."""

    error: str | None = None
    sha256: str = ""
    epochs: object = None


# ---------------------------------------------------------------- public API


def parse_queue(
    path: Path,
    *,
    known_hosts: Collection[str] | None = None,
    tasks: Collection[str] | None = None,
) -> ParsedQueue:
    """Read and validate the queue file at ``path``; its directory is the workdir."""
    label = str(path)
    try:
        data = Path(path).read_bytes()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise QueueParseError(label, [QueueIssue(0, None, f"cannot read queue file: {reason}")]) from exc
    workdir = Path(os.path.abspath(path)).parent
    return parse_bytes(data, label=label, workdir=workdir, known_hosts=known_hosts, tasks=tasks)


def parse_bytes(
    data: bytes,
    *,
    label: str,
    workdir: Path | None,
    known_hosts: Collection[str] | None = None,
    tasks: Collection[str] | None = None,
) -> ParsedQueue:
    """Validate queue-file bytes; ``workdir=None`` skips the config-file checks and hashing."""
    issues: list[QueueIssue] = []
    drafts, saw_job = _parse_lines(data, issues)
    _check_names(drafts, issues)
    _check_hosts_and_tasks(drafts, known_hosts, tasks, issues)
    warnings = _check_environment(drafts, workdir, label, issues) if workdir is not None else []
    if not saw_job and not issues:
        issues.append(QueueIssue(0, None, "no jobs"))
    if issues:
        raise QueueParseError(label, sorted(issues, key=_issue_order))
    jobs = tuple(_to_spec(draft) for draft in drafts)
    return ParsedQueue(
        path=label,
        workdir=str(workdir) if workdir is not None else "",
        jobs=jobs,
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------- lexing


def _parse_lines(data: bytes, issues: list[QueueIssue]) -> tuple[list[_Draft], bool]:
    """Parse every line; return the job drafts and whether any line held tokens."""
    drafts: list[_Draft] = []
    saw_job = False
    for number, text in _split_lines(data, issues):
        body = _strip_comment(text)
        tokens = [Token(m.group(), m.start() + 1) for m in _TOKEN_RE.finditer(body)]
        if not tokens:
            continue
        saw_job = True
        control = _CONTROL_RE.search(body)
        if control is not None:
            message = f"control character U+{ord(control.group()):04X} is not allowed"
            issues.append(QueueIssue(number, control.start() + 1, message))
            continue
        draft = _parse_job(number, text, tokens, issues)
        if draft is not None:
            drafts.append(draft)
    return drafts, saw_job


def _split_lines(data: bytes, issues: list[QueueIssue]) -> list[tuple[int, str]]:
    """Decode and split into (line number, text without EOL); bad lines become issues."""
    if data.startswith(BOM):
        data = data[len(BOM) :]
    segments = data.split(b"\n")
    if segments[-1] == b"":
        segments.pop()  # the file ended with LF (or is empty)
    lines: list[tuple[int, str]] = []
    for index, segment in enumerate(segments):
        number = index + 1
        if segment.endswith(b"\r"):
            segment = segment[:-1]
        if len(segment) > MAX_LINE_BYTES:
            issues.append(QueueIssue(number, None, f"line is longer than {MAX_LINE_BYTES} bytes"))
            continue
        text = _decode_line(number, segment, issues)
        if text is None:
            continue
        carriage = text.find("\r")
        if carriage >= 0:
            issues.append(QueueIssue(number, carriage + 1, "stray carriage return"))
            continue
        lines.append((number, text))
    return lines


def _decode_line(number: int, segment: bytes, issues: list[QueueIssue]) -> str | None:
    try:
        return segment.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = len(segment[: exc.start].decode("utf-8", errors="replace")) + 1
        message = f"invalid UTF-8 (byte 0x{segment[exc.start]:02x}); queue files must be UTF-8 text"
        issues.append(QueueIssue(number, column, message))
        return None


def _strip_comment(text: str) -> str:
    """Cut at the first ``#`` that is at line start or right after a space or tab."""
    for index, char in enumerate(text):
        if char == "#" and (index == 0 or text[index - 1] in WS):
            return text[:index]
    return text


def _looks_like_field(text: str) -> bool:
    return _FIELD_RE.match(text) is not None


# ---------------------------------------------------------------- one line


def _parse_job(number: int, raw: str, tokens: list[Token], issues: list[QueueIssue]) -> _Draft | None:
    """Check the positional tokens, epochs and fields of one job line."""
    first = tokens[0]
    if _looks_like_field(first.text):
        message = f'missing config path ("{first.text}" is a key=value field)'
        issues.append(QueueIssue(number, first.column, message))
        return None
    if len(tokens) == 1:
        issues.append(QueueIssue(number, None, "missing task"))
        return None
    second = tokens[1]
    if _looks_like_field(second.text):
        message = f'missing task ("{second.text}" is a key=value field)'
        issues.append(QueueIssue(number, second.column, message))
        return None
    draft = _Draft(number=number, raw=raw, config=first, task=second)
    rest = tokens[2:]
    has_epochs = bool(rest) and not _looks_like_field(rest[0].text)
    if has_epochs:
        draft.epochs = _parse_epochs(number, rest[0], issues) or DEFAULT_EPOCHS
        rest = rest[1:]
    _parse_fields(draft, rest, has_epochs, issues)
    _check_config_syntax(draft, issues)
    if draft.name is None and draft.config_ok and not _has_key(tokens, "name"):
        _derive_name(draft, issues)
    return draft


def _has_key(tokens: list[Token], key: str) -> bool:
    return any(token.text.startswith(key + "=") for token in tokens[2:])


def _parse_epochs(number: int, token: Token, issues: list[QueueIssue]) -> int | None:
    text = token.text
    if _LEADING_ZERO_RE.fullmatch(text) and int(text) > 0:
        message = f'epochs must not have leading zeros, got "{text}"'
    elif not _INT_RE.fullmatch(text) or text == "0":
        message = f'epochs must be a positive integer, got "{text}"'
    elif int(text) > MAX_EPOCHS:
        message = f'epochs must be at most {MAX_EPOCHS}, got "{text}"'
    else:
        return int(text)
    issues.append(QueueIssue(number, token.column, message))
    return None


def _parse_fields(draft: _Draft, tokens: list[Token], has_epochs: bool, issues: list[QueueIssue]) -> None:
    seen: set[str] = set()
    for token in tokens:
        if not _looks_like_field(token.text):
            after = "epochs" if has_epochs else "a key=value field (epochs goes right after the task)"
            message = f'unexpected token "{token.text}": only key=value fields may follow {after}'
            issues.append(QueueIssue(draft.number, token.column, message))
            continue
        key, _, value = token.text.partition("=")
        problem = _field_problem(key, value, seen)
        seen.add(key)
        if problem is None:
            problem = _apply_field(draft, token, key, value)
        if problem is not None:
            issues.append(QueueIssue(draft.number, token.column, problem))


def _field_problem(key: str, value: str, seen: set[str]) -> str | None:
    """Problems that do not depend on the key's value syntax."""
    if key not in ALLOWED_KEYS:
        hint = "; write epochs as the third token" if key == "epochs" else ""
        return f'unknown key "{key}" (allowed: {", ".join(ALLOWED_KEYS)}){hint}'
    if key in seen:
        return f'duplicate key "{key}"'
    if not value:
        return f'empty value for "{key}"; omit the field to use the default'
    return None


def _apply_field(draft: _Draft, token: Token, key: str, value: str) -> str | None:
    """Store one field's value on the draft; return an error message if the value is bad."""
    if key == "name":
        if not _NAME_RE.fullmatch(value):
            return (
                "name must be 1 to 64 characters from [A-Za-z0-9._-] starting with a letter or digit, "
                f'got "{value}"'
            )
        draft.name = value
    elif key == "est_min":
        minutes = _parse_decimal(value)
        if minutes is None:
            return f'est_min must be a number of minutes greater than 0 (like 90 or 37.5), got "{value}"'
        draft.est_min = minutes
    elif key == "host":
        draft.host = Token(value, token.column)
    else:
        low, high = INT_RANGES[key]
        number, problem = _parse_int(key, value, low, high)
        if number is None:
            return problem
        draft.ints[key] = number
    return None


def _parse_int(key: str, value: str, low: int, high: int) -> tuple[int | None, str]:
    if _LEADING_ZERO_RE.fullmatch(value) and int(value) > 0:
        return None, f'{key} must not have leading zeros, got "{value}"'
    if _INT_RE.fullmatch(value) and len(value) <= len(str(high)) and low <= int(value) <= high:
        return int(value), ""
    return None, f'{key} must be an integer from {low} to {high}, got "{value}"'


def _parse_decimal(value: str) -> float | None:
    if not _DECIMAL_RE.fullmatch(value):
        return None
    minutes = float(value)
    return minutes if minutes > 0 and math.isfinite(minutes) else None


def _check_config_syntax(draft: _Draft, issues: list[QueueIssue]) -> None:
    problem = _config_problem(draft.config.text)
    if problem is not None:
        draft.config_ok = False
        issues.append(QueueIssue(draft.number, draft.config.column, problem))


def _config_problem(path: str) -> str | None:
    if "\\" in path:
        return 'config path uses "\\"; write it with "/"'
    if path.startswith("/"):
        return "config path must be relative to the project root"
    if ".." in path.split("/"):
        return 'config path must not contain ".."; it must stay inside the project root'
    if path.endswith("/"):
        return f'config path must name a file, got "{path}"'
    return None


def _derive_name(draft: _Draft, issues: list[QueueIssue]) -> None:
    """Name the job after its config file (one trailing ``.yaml``/``.yml`` removed)."""
    base = draft.config.text.rsplit("/", 1)[-1]
    for suffix in (".yaml", ".yml"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    problem = _derived_name_problem(base)
    if problem is None:
        draft.name = base
    else:
        issues.append(QueueIssue(draft.number, draft.config.column, f"{problem}; add name="))


def _derived_name_problem(base: str) -> str | None:
    if not _NAME_CHARS_RE.fullmatch(base):
        return f'derived name "{base}" has characters outside [A-Za-z0-9._-]'
    if not base:
        return 'derived name "" is empty'
    if not base[0].isalnum():
        return f'derived name "{base}" must start with a letter or digit'
    if len(base) > 64:
        return f'derived name "{base}" is longer than 64 characters'
    return None


# ---------------------------------------------------------------- whole file


def _check_names(drafts: list[_Draft], issues: list[QueueIssue]) -> None:
    """Names compare case-insensitively; a duplicate is reported on the later line."""
    first_by_key: dict[str, _Draft] = {}
    for draft in drafts:
        if draft.name is None:
            continue
        first = first_by_key.setdefault(draft.name.casefold(), draft)
        if first is draft:
            continue
        if first.name == draft.name:
            detail = f"({first.config.text}); add name= to one of them"
        else:
            detail = f'("{first.name}"; names are case-insensitive)'
        message = f'job name "{draft.name}" collides with line {first.number} {detail}'
        issues.append(QueueIssue(draft.number, None, message))


def _check_hosts_and_tasks(
    drafts: list[_Draft],
    known_hosts: Collection[str] | None,
    tasks: Collection[str] | None,
    issues: list[QueueIssue],
) -> None:
    for draft in drafts:
        host = draft.host
        if known_hosts is not None and host is not None and host.text not in known_hosts:
            issues.append(QueueIssue(draft.number, host.column, f'unknown host "{host.text}"'))
        if tasks and draft.task.text not in tasks:
            declared = ", ".join(sorted(tasks))
            message = f'unknown task "{draft.task.text}" (the payload declares: {declared})'
            issues.append(QueueIssue(draft.number, draft.task.column, message))


def _check_environment(
    drafts: list[_Draft], workdir: Path, label: str, issues: list[QueueIssue]
) -> list[str]:
    """Check and hash every config file; return the epochs warnings."""
    root = os.path.realpath(workdir)
    cache: dict[str, _ConfigInfo] = {}
    warnings: list[str] = []
    for draft in drafts:
        if not draft.config_ok:
            continue
        rel = draft.config.text
        info = cache.get(rel)
        if info is None:
            info = cache[rel] = _inspect_config(root, rel)
        if info.error is not None:
            issues.append(QueueIssue(draft.number, draft.config.column, info.error))
            continue
        draft.sha256 = info.sha256
        if _epochs_differ(info.epochs, draft.epochs):
            warnings.append(
                f"{label}:{draft.number}: config {rel} sets epochs: {info.epochs} "
                f"but the queue line runs {draft.epochs}"
            )
    return warnings


def _inspect_config(root: str, rel: str) -> _ConfigInfo:
    """Resolve ``rel`` under ``root``; it must stay inside and be a readable regular file."""
    try:
        real = os.path.realpath(os.path.join(root, rel))
        inside = os.path.commonpath([root, real]) == root
    except (OSError, ValueError) as exc:
        return _ConfigInfo(error=f"cannot read config file {rel}: {_reason(exc)}")
    if not inside:
        return _ConfigInfo(error=f"config path {rel} leads outside the project root through a symlink")
    try:
        mode = os.stat(real).st_mode
        if not stat.S_ISREG(mode):
            return _ConfigInfo(error=f"config path is not a regular file: {rel}")
        with open(real, "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return _ConfigInfo(error=f"config file not found: {rel}")
    except OSError as exc:
        return _ConfigInfo(error=f"cannot read config file {rel}: {_reason(exc)}")
    return _ConfigInfo(sha256=hashlib.sha256(data).hexdigest(), epochs=_yaml_epochs(data))


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _yaml_epochs(data: bytes) -> object:
    """The config's top-level ``epochs:`` value, or None; YAML problems are the payload's business."""
    try:
        document = yaml.safe_load(data)
    except Exception:  # any YAML failure (syntax, recursion, bad keys) only means "no warning"
        return None
    if isinstance(document, dict):
        return document.get("epochs")
    return None


def _epochs_differ(value: object, epochs: int) -> bool:
    if value is None:
        return False
    return isinstance(value, bool) or value != epochs


def _issue_order(issue: QueueIssue) -> tuple[int, float]:
    return issue.line, issue.column if issue.column is not None else math.inf


def _to_spec(draft: _Draft) -> JobSpec:
    assert draft.name is not None, "a draft without a name always comes with an issue"
    return JobSpec(
        name=draft.name,
        config=draft.config.text,
        task=draft.task.text,
        epochs=draft.epochs,
        gpus=draft.ints.get("gpus", 1),
        nodes=draft.ints.get("nodes", 1),
        est_min=draft.est_min,
        seed=draft.ints.get("seed"),
        host=draft.host.text if draft.host is not None else None,
        retries=draft.ints.get("retries"),
        config_sha256=draft.sha256,
        line=draft.number,
        raw=draft.raw,
    )
