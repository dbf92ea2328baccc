"""Trainer arguments of a queue line: shell-like splitting, grids, seeds, and expanded jobs' names.

Everything after a standalone ``--`` token is the line's trainer arguments (docs/queue.md). They are
split the way a POSIX shell splits words, and nothing is ever expanded or evaluated:

* spaces and tabs separate words; ``'...'`` keeps everything literal; ``"..."`` keeps everything
  literal except ``\\"``, ``\\\\``, ``\\$`` and ``\\``` (backslash escapes); outside quotes ``\\x`` is
  a literal ``x``.  An unterminated quote or a trailing backslash is an error at its column.
* a ``#`` starts a comment only at the start of a word and outside quotes (``a#b`` is one word).

Grids.  An unquoted, unescaped ``{a,b,c}`` group inside a word expands the line into the cartesian
product of all its groups (in the order they appear).  ``\\{`` and quoted braces are literal; a group
without a comma is a placeholder when it holds a name (``{seed}``: ``LINE_PLACEHOLDERS``, rendered on the
host by gpuq_argv.render_args; any other name is an error at its column), else literal (``{1}``);
``${...}`` (an OmegaConf/Hydra interpolation, even with commas
or nested braces inside) passes through untouched.  A group inside a group is an error.  The field
``seeds=N`` (1..1000) repeats every cell N times with seed 0..N-1 (``GPUQ_SEED``/``{seed}``).  A line
that expands to more than 1,000 jobs is an error.

Names of expanded jobs (stable: they depend only on the line's text).  The cell name (``name=``, or
the config file's name) is followed by one ``-<key><value>`` part per group, in order, then
``-seed<k>`` for ``seeds=``.  The key is:

1. for a group that is a whole word right after a word starting with ``-``: that flag with its
   leading dashes stripped (``--lr {1e-3,3e-4}`` -> ``lr1e-3``, ``lr3e-4``);
2. for a group after an ``=`` in its word: the text before the first ``=``, leading ``-+~`` stripped,
   its last dotted component (``optim.lr={0.1,0.2}`` -> ``lr0.1``; ``--lr={1,2}`` -> ``lr1``);
3. otherwise nothing: the part is just the value (``{small,large}`` -> ``small``).

Characters outside ``[A-Za-z0-9._-]`` become ``_``.  A name longer than 64 characters is cut to 55
and gets ``-`` plus the first 8 hex digits of the sha256 of the uncut name.  Example:
``name=lr -- --lr {1e-3,3e-4} --seed {1,2,3}`` gives ``lr-lr1e-3-seed1`` ... ``lr-lr3e-4-seed3``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass

MAX_JOBS_PER_LINE = 1000
MAX_NAME = 64
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]")
_DQ_ESCAPES = '"\\$`'
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The [run] command's placeholders that mean something per line (payload/agent/gpuq_base/gpuq_argv.py renders them
# on the host; tests/unit/test_queue_placeholders.py keeps the two lists equal), and those that do not.
LINE_PLACEHOLDERS = ("config", "task", "epochs", "name", "seed", "job_id", "attempt", "run_dir", "ckpt_dir",
                     "master_port")
NOT_IN_ARGS = {"checkpoint": "it is empty on a first attempt; put it in [run] resume_args",
               "args": "it stands for these arguments; it belongs in [run] command"}

# {checkpoint.NAME}: the verified checkpoint of the job NAME (a line's after= name) on this job's host; the
# controller renders it when it writes the spec (orchestrator/tick/handover.py), the host never sees it
CHECKPOINT_PREFIX = "checkpoint."
_CHECKPOINT_RE = re.compile(r"checkpoint\.[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_LITERAL_RE = re.compile(r"\{(" + "|".join(LINE_PLACEHOLDERS) + r"|checkpoint\.[A-Za-z0-9][A-Za-z0-9._-]{0,63})\}")

Char = tuple[str, bool, int]  # (character, literal: quoted or escaped, offset in the arguments' text)


@dataclass(frozen=True)
class Placeholder:
    """An unquoted ``{name}`` in an argument, rendered on the host; ``column`` is its brace's."""

    name: str
    column: int


Piece = str | tuple[str, ...] | Placeholder  # a literal run, a grid group's alternatives, or a placeholder


class ArgsError(ValueError):
    """A problem in the arguments at a 1-based column of the line."""

    def __init__(self, column: int, message: str) -> None:
        super().__init__(message)
        self.column = column
        self.message = message


@dataclass(frozen=True)
class Word:
    """One trainer argument: its pieces (literal text and grid groups) and its column."""

    pieces: tuple[Piece, ...]
    column: int

    @property
    def groups(self) -> int:
        return sum(1 for p in self.pieces if isinstance(p, tuple))

    @property
    def literal(self) -> str | None:
        """The word's text when it holds no group and no placeholder."""
        if any(not isinstance(p, str) for p in self.pieces):
            return None
        return "".join(p for p in self.pieces if isinstance(p, str))

    @property
    def placeholders(self) -> tuple[Placeholder, ...]:
        return tuple(p for p in self.pieces if isinstance(p, Placeholder))


def split_args(text: str, column: int) -> list[Word]:
    """Split ``text`` (which starts at 1-based ``column`` of its line) into words; raise ArgsError."""
    words: list[Word] = []
    chars: list[Char] = []
    start = 0
    in_word = False
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in " \t":
            if in_word:
                words.append(_word(chars, column, start))
                chars, in_word = [], False
            i += 1
            continue
        if not in_word:
            if ch == "#":
                break
            in_word, start = True, i
        if ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ArgsError(column + i, "unterminated single quote")
            chars.extend((c, True, k) for k, c in enumerate(text[i + 1 : end], i + 1))
            i = end + 1
        elif ch == '"':
            i = _double_quoted(text, i, column, chars)
        elif ch == "\\":
            if i + 1 >= n:
                raise ArgsError(column + i, "trailing backslash; write \\\\ for a literal one")
            chars.append((text[i + 1], True, i + 1))
            i += 2
        else:
            chars.append((ch, False, i))
            i += 1
    if in_word:
        words.append(_word(chars, column, start))
    return words


def _double_quoted(text: str, i: int, column: int, chars: list[Char]) -> int:
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == '"':
            return j + 1
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in _DQ_ESCAPES:
            chars.append((text[j + 1], True, j + 1))
            j += 2
            continue
        chars.append((ch, True, j))
        j += 1
    raise ArgsError(column + i, "unterminated double quote")


def _word(chars: list[Char], column: int, start: int) -> Word:
    """Find the grid groups and placeholders of one word (see the module docstring); ``column`` is the
    line's column of the arguments' first character, ``start`` the word's offset in them."""
    pieces: list[Piece] = []
    lit: list[str] = []
    i, n = 0, len(chars)
    while i < n:
        ch, quoted, _ = chars[i]
        if not quoted and ch == "$" and i + 1 < n and chars[i + 1][:2] == ("{", False):
            end = _interpolation_end(chars, i + 1)
            lit.extend(c for c, _, _ in chars[i:end])
            i = end
            continue
        if not quoted and ch == "{":
            found: Piece | None
            found, end = _placeholder(chars, i, column)
            if found is None:
                found, end = _group(chars, i, column + start)
            if found is not None:
                if lit:
                    pieces.append("".join(lit))
                    lit = []
                pieces.append(found)
                i = end
                continue
        lit.append(ch)
        i += 1
    if lit or not pieces:
        pieces.append("".join(lit))
    return Word(tuple(pieces), column + start)


def _placeholder(chars: list[Char], i: int, column: int) -> tuple[Placeholder | None, int]:
    """The ``{name}`` placeholder opening at ``i`` (unquoted braces around a name) and the index after
    it; None when the brace opens something else.  An unknown name is an error at its column."""
    j = i + 1
    while j < len(chars) and not chars[j][1] and chars[j][0] != "}":
        j += 1
    if j >= len(chars) or chars[j][1]:
        return None, i + 1
    name = "".join(c for c, _, _ in chars[i + 1 : j])
    at = column + chars[i][2]
    if _CHECKPOINT_RE.fullmatch(name):
        return Placeholder(name, at), j + 1
    if not _NAME_RE.fullmatch(name):
        return None, i + 1
    if name in NOT_IN_ARGS:
        raise ArgsError(at, f"{{{name}}} is not available in a line's arguments ({NOT_IN_ARGS[name]})")
    if name not in LINE_PLACEHOLDERS:
        known = ", ".join(f"{{{p}}}" for p in LINE_PLACEHOLDERS)
        raise ArgsError(at, f"unknown placeholder {{{name}}} (known here: {known}); quote it ('{{{name}}}') "
                        "to pass it literally")
    return Placeholder(name, at), j + 1


def _interpolation_end(chars: list[Char], open_index: int) -> int:
    """Index after the ``}`` closing the ``${`` at ``open_index`` (nested unquoted braces counted)."""
    depth = 0
    for j in range(open_index, len(chars)):
        ch, quoted, _ = chars[j]
        if quoted:
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(chars)


def _group(chars: list[Char], i: int, column: int) -> tuple[tuple[str, ...] | None, int]:
    """The alternatives of the group opening at ``i`` and the index after it; None when literal."""
    alternatives: list[str] = []
    current: list[str] = []
    for j in range(i + 1, len(chars)):
        ch, quoted, _ = chars[j]
        if not quoted and ch == "{":
            raise ArgsError(column, "a grid group inside a grid group is not supported; "
                            "write \\{ for a literal brace")
        if not quoted and ch == "}":
            if not alternatives:
                return None, i + 1  # {1}: literal (a name was a placeholder, _placeholder)
            alternatives.append("".join(current))
            return tuple(alternatives), j + 1
        if not quoted and ch == ",":
            alternatives.append("".join(current))
            current = []
        else:
            current.append(ch)
    return None, i + 1  # no closing brace: literal


@dataclass(frozen=True)
class Cell:
    """One expanded job of a line: name suffix parts, arguments and seed."""

    suffix: tuple[str, ...]
    args: tuple[str, ...]
    seed: int | None


def count(words: list[Word], seeds: int | None) -> int:
    total = seeds or 1
    for word in words:
        for piece in word.pieces:
            if isinstance(piece, tuple):
                total *= len(piece)
    return total


def _keys(words: list[Word]) -> list[str]:
    """The naming key of every group, in order (see the module docstring)."""
    keys: list[str] = []
    for index, word in enumerate(words):
        before = ""
        for piece in word.pieces:
            if not isinstance(piece, tuple):
                before += piece if isinstance(piece, str) else f"{{{piece.name}}}"
                continue
            prev = words[index - 1].literal if index > 0 else None
            if len(word.pieces) == 1 and prev is not None and prev.startswith("-"):
                keys.append(prev.lstrip("-"))
            elif "=" in before:
                keys.append(before.split("=", 1)[0].lstrip("-+~").rsplit(".", 1)[-1])
            else:
                keys.append("")
    return keys


def expand(words: list[Word], seeds: int | None) -> list[Cell]:
    """Every job of the line, in a stable order (groups vary last-group-fastest, then seeds)."""
    keys = _keys(words)
    groups = [p for w in words for p in w.pieces if isinstance(p, tuple)]
    cells: list[Cell] = []
    seed_values: list[int | None] = list(range(seeds)) if seeds else [None]
    for combo in itertools.product(*groups):
        args: list[str] = []
        position = 0
        for word in words:
            parts: list[str | Placeholder] = []
            for piece in word.pieces:
                if isinstance(piece, tuple):
                    parts.append(combo[position])
                    position += 1
                else:
                    parts.append(piece)
            args.append(_encode(parts))
        suffix = tuple(key + value for key, value in zip(keys, combo, strict=True))
        for seed in seed_values:
            extra = (f"seed{seed}",) if seed is not None else ()
            cells.append(Cell(suffix + extra, tuple(args), seed))
    return cells


def _encode(parts: list[str | Placeholder]) -> str:
    """One argument as the host renders it (gpuq_argv.render_args): a placeholder as ``{name}``, a
    literal ``{name}`` of a known name doubled to ``{{name}}``, every other character as it is."""
    merged: list[str | Placeholder] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    out: list[str] = []
    for index, part in enumerate(merged):
        if isinstance(part, str):
            out.append(_LITERAL_RE.sub(r"{{\1}}", part))
            continue
        before = merged[index - 1] if index > 0 else ""
        after = merged[index + 1] if index + 1 < len(merged) else ""
        if isinstance(before, str) and before.endswith("{") and isinstance(after, str) and after.startswith("}"):
            raise ArgsError(part.column, f"{{{part.name}}} between literal braces is ambiguous; quote the "
                            "whole argument to pass it literally, or drop the braces")
        out.append(f"{{{part.name}}}")
    return "".join(out)


def job_name(cell_name: str, suffix: tuple[str, ...]) -> str:
    """The expanded job's name (see the module docstring)."""
    if not suffix:
        return cell_name
    name = _UNSAFE_RE.sub("_", "-".join((cell_name, *suffix)))
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}-{digest}"
    return name
