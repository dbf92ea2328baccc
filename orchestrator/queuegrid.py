"""Trainer arguments of a queue line: shell-like splitting, grids, seeds, and expanded jobs' names.

Everything after a standalone ``--`` token is the line's trainer arguments (docs/queue.md). They are
split the way a POSIX shell splits words, and nothing is ever expanded or evaluated:

* spaces and tabs separate words; ``'...'`` keeps everything literal; ``"..."`` keeps everything
  literal except ``\\"``, ``\\\\``, ``\\$`` and ``\\``` (backslash escapes); outside quotes ``\\x`` is
  a literal ``x``.  An unterminated quote or a trailing backslash is an error at its column.
* a ``#`` starts a comment only at the start of a word and outside quotes (``a#b`` is one word).

Grids.  An unquoted, unescaped ``{a,b,c}`` group inside a word expands the line into the cartesian
product of all its groups (in the order they appear).  ``\\{`` and quoted braces are literal; a group
without a comma (``{x}``) is literal; ``${...}`` (an OmegaConf/Hydra interpolation, even with commas
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

Piece = str | tuple[str, ...]  # a literal run, or a grid group's alternatives


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
        """The word's text when it holds no group."""
        if self.groups:
            return None
        return "".join(p for p in self.pieces if isinstance(p, str))


def split_args(text: str, column: int) -> list[Word]:
    """Split ``text`` (which starts at 1-based ``column`` of its line) into words; raise ArgsError."""
    words: list[Word] = []
    chars: list[tuple[str, bool]] = []  # (character, literal: quoted or escaped)
    start = 0
    in_word = False
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in " \t":
            if in_word:
                words.append(_word(chars, column + start))
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
            chars.extend((c, True) for c in text[i + 1 : end])
            i = end + 1
        elif ch == '"':
            i = _double_quoted(text, i, column, chars)
        elif ch == "\\":
            if i + 1 >= n:
                raise ArgsError(column + i, "trailing backslash; write \\\\ for a literal one")
            chars.append((text[i + 1], True))
            i += 2
        else:
            chars.append((ch, False))
            i += 1
    if in_word:
        words.append(_word(chars, column + start))
    return words


def _double_quoted(text: str, i: int, column: int, chars: list[tuple[str, bool]]) -> int:
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == '"':
            return j + 1
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in _DQ_ESCAPES:
            chars.append((text[j + 1], True))
            j += 2
            continue
        chars.append((ch, True))
        j += 1
    raise ArgsError(column + i, "unterminated double quote")


def _word(chars: list[tuple[str, bool]], column: int) -> Word:
    """Find the grid groups of one word (see the module docstring)."""
    pieces: list[Piece] = []
    lit: list[str] = []
    i, n = 0, len(chars)
    while i < n:
        ch, quoted = chars[i]
        if not quoted and ch == "$" and i + 1 < n and chars[i + 1] == ("{", False):
            end = _interpolation_end(chars, i + 1)
            lit.extend(c for c, _ in chars[i:end])
            i = end
            continue
        if not quoted and ch == "{":
            group, end = _group(chars, i, column)
            if group is not None:
                if lit:
                    pieces.append("".join(lit))
                    lit = []
                pieces.append(group)
                i = end
                continue
        lit.append(ch)
        i += 1
    if lit or not pieces:
        pieces.append("".join(lit))
    return Word(tuple(pieces), column)


def _interpolation_end(chars: list[tuple[str, bool]], open_index: int) -> int:
    """Index after the ``}`` closing the ``${`` at ``open_index`` (nested unquoted braces counted)."""
    depth = 0
    for j in range(open_index, len(chars)):
        ch, quoted = chars[j]
        if quoted:
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(chars)


def _group(chars: list[tuple[str, bool]], i: int, column: int) -> tuple[tuple[str, ...] | None, int]:
    """The alternatives of the group opening at ``i`` and the index after it; None when literal."""
    alternatives: list[str] = []
    current: list[str] = []
    for j in range(i + 1, len(chars)):
        ch, quoted = chars[j]
        if not quoted and ch == "{":
            raise ArgsError(column, "a grid group inside a grid group is not supported; "
                            "write \\{ for a literal brace")
        if not quoted and ch == "}":
            if not alternatives:
                return None, i + 1  # {x}: literal
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
                before += piece
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
            parts = []
            for piece in word.pieces:
                if isinstance(piece, tuple):
                    parts.append(combo[position])
                    position += 1
                else:
                    parts.append(piece)
            args.append("".join(parts))
        suffix = tuple(key + value for key, value in zip(keys, combo, strict=True))
        for seed in seed_values:
            extra = (f"seed{seed}",) if seed is not None else ()
            cells.append(Cell(suffix + extra, tuple(args), seed))
    return cells


def job_name(cell_name: str, suffix: tuple[str, ...]) -> str:
    """The expanded job's name (see the module docstring)."""
    if not suffix:
        return cell_name
    name = _UNSAFE_RE.sub("_", "-".join((cell_name, *suffix)))
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}-{digest}"
    return name
