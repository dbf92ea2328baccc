"""One queue line: its positional tokens, ``key=value`` fields and trainer arguments (docs/queue.md).

    <config_path> <task> [epochs] [key=value ...] [-- trainer arguments]   [# comment]

A token "looks like a field" if it matches ``^[a-z_]+=``. Tokens 1 and 2 (config path and task) must
not. Token 3 is a field if it looks like one, otherwise the epochs value; every later token must be a
field, up to a standalone ``--``: the rest of the line is the trainer arguments (queuegrid.py). When the
project's command uses neither ``{config}`` nor ``{task}``, a line may be only fields and arguments
(``name=bs32 gpus=2 -- 50 10``); such a line needs ``name=``.

Fields: ``name`` ``gpus`` ``nodes`` ``est_min`` ``seed`` ``seeds`` ``host`` ``retries`` ``gpu``
``gpu_mem`` ``rerun`` ``after``, each at most once, never empty.  ``seeds=auto:MIN..MAX`` (``seeds=auto``:
3..8) runs MIN seeds, and the tick adds one at a time up to MAX while the cell's verdict against the baseline is
ambiguous (docs/stopping.md).  ``after=a,b`` names the cells or jobs the line's jobs wait for
(orchestrator/queue/dependencies.py resolves them over the whole file).  ``rerun=true`` runs the line even when
the result cache holds its verified success (orchestrator/api/resultcache.py); ``rerun=false`` is the default.
``gpu=`` is one GPU model or several joined by ``|`` (``gpu=A100|H100``), each ``[A-Za-z0-9._-]``
with a letter or digit; ``gpu_mem=`` GB per GPU, like ``est_min=`` (orchestrator/scheduling/gpumatch.py:
how they match a host).  Integers are ``0`` or a non-zero digit followed by digits (no sign, no leading
zero). The job name is ``name=`` or the config file name without one trailing ``.yaml``/``.yml``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from orchestrator.core.errors import QueueIssue
from orchestrator.core.specs import DEFAULT_EPOCHS
from orchestrator.queue.queuegrid import MAX_JOBS_PER_LINE, ArgsError, Word, count, split_args
from orchestrator.report.cells import cell_name

MAX_EPOCHS = 2**63 - 1  # what the ledger's SQLite INTEGER can hold
ARGS_MARK = "--"
ALLOWED_KEYS = ("name", "gpus", "nodes", "est_min", "seed", "seeds", "host", "retries", "gpu", "gpu_mem", "rerun",
                "after")
MAX_AFTER = 64
MAX_GPU_MODELS = 16
MAX_GPU_MEM_GB = 4096
INT_RANGES: dict[str, tuple[int, int]] = {
    "gpus": (1, 64),
    "nodes": (1, 64),
    "seed": (0, 4294967295),
    "seeds": (1, MAX_JOBS_PER_LINE),
    "retries": (0, 10),
}

AUTO_SEEDS = "auto"
AUTO_BOUNDS = (2, 64)  # stopping.seeds.AutoSeeds' own (a Welch test needs two seeds a side)
AUTO_DEFAULT = (3, 8)  # seeds=auto alone: AutoSeeds' defaults (tests/unit/test_queue_autoseeds.py keeps them equal)
_AUTO_RE = re.compile(r"auto(?::([^.]*)\.\.(.*))?")

_FIELD_RE = re.compile(r"[a-z_]+=")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME_CHARS_RE = re.compile(r"[A-Za-z0-9._-]*")
_INT_RE = re.compile(r"0|[1-9][0-9]*")
_LEADING_ZERO_RE = re.compile(r"0[0-9]+")
_DECIMAL_RE = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_MODEL_CHAR_RE = re.compile(r"[A-Za-z0-9._-]")
_ALNUM_RE = re.compile(r"[A-Za-z0-9]")


@dataclass(frozen=True)
class Token:
    """One whitespace-separated token and its 1-based character column."""

    text: str
    column: int


@dataclass
class Draft:
    """What one job line says, before the file-wide checks."""

    number: int
    raw: str
    config: Token | None
    task: Token | None
    epochs: int | None = None  # None: the line gives no epochs (queuefile decides what the job gets)
    config_epochs: int | None = None  # the config file's top-level ``epochs:`` (a positive integer), if any
    ints: dict[str, int] = field(default_factory=dict)
    est_min: float | None = None
    host: Token | None = None
    gpu: tuple[str, ...] = ()
    gpu_mem: float | None = None
    name: str | None = None
    seeds_max: int = 0  # seeds=auto:MIN..MAX: MAX (``ints["seeds"]`` holds MIN); 0 = a fixed number of seeds
    rerun: bool = False
    after: tuple[Token, ...] = ()  # `after=`: each name with its column
    config_ok: bool = True
    sha256: str = ""
    words: list[Word] = field(default_factory=list)


def looks_like_field(text: str) -> bool:
    return _FIELD_RE.match(text) is not None


def parse_line(number: int, raw: str, tokens: list[Token], args_text: str | None, args_column: int,
               issues: list[QueueIssue], *, needs_config: bool = True) -> Draft | None:
    """Check one job line: ``tokens`` are those before a ``--`` and ``args_text`` what follows it."""
    draft = _positional(number, raw, tokens, issues, needs_config)
    if draft is None:
        return None
    if args_text is not None:
        try:
            draft.words = split_args(args_text, args_column)
        except ArgsError as exc:
            issues.append(QueueIssue(number, exc.column, exc.message))
            return None
    _check_expansion(draft, issues)
    return draft


def _positional(number: int, raw: str, tokens: list[Token], issues: list[QueueIssue],
                needs_config: bool) -> Draft | None:
    if not tokens or looks_like_field(tokens[0].text):
        if not needs_config:
            draft = Draft(number=number, raw=raw, config=None, task=None)
            _parse_fields(draft, tokens, False, issues)
            if draft.name is None and not _has_key(tokens, "name"):
                issues.append(QueueIssue(number, None, "a line without a config path needs name= "
                                                       "(job ids derive from names)"))
            return draft
        if not tokens:
            issues.append(QueueIssue(number, None, 'missing config path ("--" starts the trainer arguments)'))
            return None
        first = tokens[0]
        message = f'missing config path ("{first.text}" is a key=value field)'
        issues.append(QueueIssue(number, first.column, message))
        return None
    first = tokens[0]
    if len(tokens) == 1:
        issues.append(QueueIssue(number, None, "missing task"))
        return None
    second = tokens[1]
    if looks_like_field(second.text):
        message = f'missing task ("{second.text}" is a key=value field)'
        issues.append(QueueIssue(number, second.column, message))
        return None
    draft = Draft(number=number, raw=raw, config=first, task=second)
    rest = tokens[2:]
    has_epochs = bool(rest) and not looks_like_field(rest[0].text)
    if has_epochs:
        draft.epochs = _parse_epochs(number, rest[0], issues) or DEFAULT_EPOCHS
        rest = rest[1:]
    _parse_fields(draft, rest, has_epochs, issues)
    _check_config_syntax(draft, first, issues)
    if draft.name is None and draft.config_ok and not _has_key(tokens[2:], "name"):
        _derive_name(draft, first, issues)
    return draft


def _check_expansion(draft: Draft, issues: list[QueueIssue]) -> None:
    seeds = draft.ints.get("seeds")
    if seeds is not None and "seed" in draft.ints:
        issues.append(QueueIssue(draft.number, None, "seed= and seeds= cannot both be set "
                                                     "(seeds=N runs seeds 0 to N-1)"))
    _check_placeholders(draft, issues)
    total = count(draft.words, seeds)
    if total > MAX_JOBS_PER_LINE:
        issues.append(QueueIssue(draft.number, None, f"line expands to {total} jobs, more than "
                                                     f"{MAX_JOBS_PER_LINE}; split it into several lines"))
        draft.words = []
        draft.ints.pop("seeds", None)


def _check_placeholders(draft: Draft, issues: list[QueueIssue]) -> None:
    """A placeholder in the arguments needs its value on every job of the line (as in [run] command)."""
    for word in draft.words:
        for ph in word.placeholders:
            if ph.name == "seed" and "seed" not in draft.ints and "seeds" not in draft.ints:
                issues.append(QueueIssue(draft.number, ph.column, "{seed} needs seed= or seeds= on the line"))
            elif ph.name in ("config", "task") and draft.config is None:
                issues.append(QueueIssue(draft.number, ph.column, f"{{{ph.name}}} needs a config path and task "
                                                                  "at the start of the line"))


def _has_key(tokens: list[Token], key: str) -> bool:
    return any(token.text.startswith(key + "=") for token in tokens)


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


def _parse_fields(draft: Draft, tokens: list[Token], has_epochs: bool, issues: list[QueueIssue]) -> None:
    seen: set[str] = set()
    for token in tokens:
        if not looks_like_field(token.text):
            after = "epochs" if has_epochs else "a key=value field (epochs goes right after the task)"
            message = f'unexpected token "{token.text}": only key=value fields may follow {after}'
            if draft.config is None:
                message = (f'unexpected token "{token.text}": a line without a config path holds only '
                           'key=value fields, then "--" and the trainer arguments')
            if token.text.startswith("-"):
                message += '; trainer arguments go after a standalone "--"'
            issues.append(QueueIssue(draft.number, token.column, message))
            continue
        key, _, value = token.text.partition("=")
        problem = _field_problem(key, value, seen)
        seen.add(key)
        column = token.column
        if problem is None and key == "gpu":
            column, problem = _apply_gpu(draft, token.column + len("gpu="), value)
        elif problem is None:
            problem = _apply_field(draft, token, key, value)
        if problem is not None:
            issues.append(QueueIssue(draft.number, column, problem))


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


def _apply_field(draft: Draft, token: Token, key: str, value: str) -> str | None:
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
    elif key == "after":
        return _apply_after(draft, token.column + len("after="), value)
    elif key == "rerun":
        if value not in ("true", "false"):
            return f'rerun must be true or false, got "{value}"'
        draft.rerun = value == "true"
    elif key == "gpu_mem":
        gib = _parse_decimal(value)
        if gib is None or gib > MAX_GPU_MEM_GB:
            return (f"gpu_mem must be GB of memory per GPU, greater than 0 and at most {MAX_GPU_MEM_GB} "
                    f'(like 24 or 80), got "{value}"')
        draft.gpu_mem = gib
    elif key == "seeds" and value.startswith(AUTO_SEEDS):
        return _apply_auto_seeds(draft, value)
    else:
        low, high = INT_RANGES[key]
        number, problem = _parse_int(key, value, low, high)
        if number is None:
            return problem
        draft.ints[key] = number
    return None


def _apply_after(draft: Draft, column: int, value: str) -> str | None:
    """``after=`` (its value starts at ``column``): names joined by ``,``, each a cell's or a job's name."""
    names, start = [], 0
    for part in value.split(","):
        at, start = column + start, start + len(part) + 1
        if not _NAME_RE.fullmatch(part):
            return (f'after= names cells or jobs joined by "," (after=train or after=a,b); "{part}" is not a name '
                    "of [A-Za-z0-9._-]")
        names.append(Token(part, at))
    draft.after = tuple(names)
    return f"after= names {len(names)} cells or jobs, more than {MAX_AFTER}" if len(names) > MAX_AFTER else None


def _apply_auto_seeds(draft: Draft, value: str) -> str | None:
    """``seeds=auto`` or ``seeds=auto:MIN..MAX``: MIN seeds now, at most MAX in all."""
    low, high = AUTO_BOUNDS
    usage = (f"seeds=auto takes its bounds as auto:MIN..MAX, MIN from {low}, MAX up to {high}, MIN <= MAX "
             f'(like auto:3..8; auto alone means auto:{AUTO_DEFAULT[0]}..{AUTO_DEFAULT[1]}), got "{value}"')
    match = _AUTO_RE.fullmatch(value)
    if match is None:
        return usage
    first, last = AUTO_DEFAULT
    if match.group(1) is not None:
        given, problem = _parse_int("seeds=auto's MIN", match.group(1), low, high)
        most, problem_max = _parse_int("seeds=auto's MAX", match.group(2), low, high)
        if given is None or most is None:
            return f"{problem or problem_max} (seeds=auto:MIN..MAX, like auto:3..8)"
        if most < given:
            return f'seeds=auto:MIN..MAX needs MIN <= MAX, got "{value}"'
        first, last = given, most
    draft.ints["seeds"] = first
    draft.seeds_max = last
    return None


def check_auto_baseline(jobs: list[tuple[Draft, str]], issues: list[QueueIssue]) -> None:
    """``seeds=auto`` judges each cell against the baseline: the queue's expanded jobs (draft, name) must
    hold a cell named baseline, as `gpuq report` finds it by itself (the tick judges against that one)."""
    auto = next((draft for draft, _ in jobs if draft.seeds_max), None)
    if auto is None or any(cell_name(name, draft.name or "").lower() == "baseline" for draft, name in jobs):
        return
    issues.append(QueueIssue(auto.number, None, "seeds=auto compares each cell with the baseline, and no cell is "
                                                "named baseline; add a line with name=baseline"))


def _apply_gpu(draft: Draft, column: int, value: str) -> tuple[int, str | None]:
    """``gpu=`` (its value starts at ``column``): one model or several joined by ``|``; a problem is
    reported at the column of the model (or the character) at fault."""
    models: list[str] = []
    start = 0
    for part in value.split("|"):
        at = column + start
        start += len(part) + 1
        if not part:
            return at, 'empty GPU model in gpu=; join models with one "|" (gpu=A100|H100)'
        bad = next((i for i, c in enumerate(part) if not _MODEL_CHAR_RE.fullmatch(c)), None)
        if bad is not None:
            return at + bad, f'GPU model "{part}" has "{part[bad]}"; a model is letters, digits and "._-"'
        if not _ALNUM_RE.search(part):
            return at, f'GPU model "{part}" has no letter or digit'
        if len(part) > 64:
            return at, f'GPU model "{part[:20]}..." is longer than 64 characters'
        models.append(part)
    if len(models) > MAX_GPU_MODELS:
        return column - len("gpu="), f"gpu= lists {len(models)} models, more than {MAX_GPU_MODELS}"
    draft.gpu = tuple(models)
    return column, None


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


def _check_config_syntax(draft: Draft, config: Token, issues: list[QueueIssue]) -> None:
    problem = _config_problem(config.text)
    if problem is not None:
        draft.config_ok = False
        issues.append(QueueIssue(draft.number, config.column, problem))


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


def _derive_name(draft: Draft, config: Token, issues: list[QueueIssue]) -> None:
    """Name the job after its config file (one trailing ``.yaml``/``.yml`` removed)."""
    base = config.text.rsplit("/", 1)[-1]
    for suffix in (".yaml", ".yml"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    problem = _derived_name_problem(base)
    if problem is None:
        draft.name = base
    else:
        issues.append(QueueIssue(draft.number, config.column, f"{problem}; add name="))


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
