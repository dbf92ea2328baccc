"""Trainer-argument words exactly (orchestrator/queue/queuegrid.py): pieces, columns, quotes, escapes,
`${...}` interpolations and grid groups, and the naming key of each group.

tests/unit/test_queue_args.py checks the grammar through whole queue lines; this file pins each
splitting rule at its edges (scripts/mutation.py queuefile).
"""

from __future__ import annotations

import hashlib

import pytest

from orchestrator.queue.queuegrid import ArgsError, Word, expand, job_name, split_args


def _names(text: str, seeds: int | None = None) -> list[str]:
    return [job_name("c", cell.suffix) for cell in expand(split_args(text, 1), seeds)]


@pytest.mark.parametrize(("text", "column", "words"), [
    ("a  b", 10, [Word(("a",), 10), Word(("b",), 13)]),
    ("  x\ty ", 5, [Word(("x",), 7), Word(("y",), 9)]),
    ("'a b' c", 1, [Word(("a b",), 1), Word(("c",), 7)]),
    ("'a' 'b'", 1, [Word(("a",), 1), Word(("b",), 5)]),
    ("''", 1, [Word(("",), 1)]),
    ("x'' y", 1, [Word(("x",), 1), Word(("y",), 5)]),
    ("a\\b \\ c", 1, [Word(("ab",), 1), Word((" c",), 5)]),
    ('"a\\"b" "\\x" "\\$HOME"', 1, [Word(('a"b',), 1), Word(("\\x",), 8), Word(("$HOME",), 13)]),
    ('"\\$"{a,b}', 1, [Word(("$", ("a", "b")), 1)]),  # an escaped $ never opens an interpolation
    ("a#b #c d", 1, [Word(("a#b",), 1)]),
    ("a$", 1, [Word(("a$",), 1)]),
    ("${a,b}", 1, [Word(("${a,b}",), 1)]),
    ("x${a.{b,c}}y{1,2}", 1, [Word(("x${a.{b,c}}y", ("1", "2")), 1)]),
    ("{1,2}${a}", 1, [Word((("1", "2"), "${a}"), 1)]),
    ("${a'}'}{1,2}", 1, [Word(("${a}}", ("1", "2")), 1)]),  # a quoted brace inside is not counted
    ("${a{1,2}", 1, [Word(("${a{1,2}",), 1)]),  # never closed: all literal
    ("a{1,2}b{3,4}", 1, [Word(("a", ("1", "2"), "b", ("3", "4")), 1)]),
    ("{1}y {a,b", 1, [Word(("{1}y",), 1), Word(("{a,b",), 6)]),
    ("{,}", 1, [Word((("", ""),), 1)]),
    ("'{a,b}' \\{a,b}", 1, [Word(("{a,b}",), 1), Word(("{a,b}",), 9)]),
])
def test_words_pieces_and_columns(text: str, column: int, words: list[Word]) -> None:
    assert split_args(text, column) == words


@pytest.mark.parametrize(("text", "column", "message"), [
    ("ab 'cd", 4, "unterminated single quote"),
    ('x "a\\"', 3, "unterminated double quote"),  # the escaped quote does not close it
    ('"ab\\', 1, "unterminated double quote"),  # a backslash last inside quotes is kept, the quote stays open
    ("ab\\", 3, "trailing backslash; write \\\\ for a literal one"),
    ("z {a,{b,c}}", 3, "a grid group inside a grid group is not supported; write \\{ for a literal brace"),
])
def test_errors_name_their_column(text: str, column: int, message: str) -> None:
    with pytest.raises(ArgsError) as info:
        split_args(text, 1)
    assert (info.value.column, info.value.message, str(info.value)) == (column, message, message)


def test_a_literal_word_has_text_and_a_grid_word_has_none() -> None:
    plain, grid = split_args("ab {1,2}", 1)
    assert (plain.literal, plain.groups, grid.literal, grid.groups) == ("ab", 0, None, 1)


@pytest.mark.parametrize(("text", "names"), [
    ("--Xa {1,2}", ["c-Xa1", "c-Xa2"]),  # a flag's dashes stripped, nothing else
    ("{1,2} --x", ["c-1", "c-2"]),  # the first word has no flag before it
    ("optim.sub.lr={1,2}", ["c-lr1", "c-lr2"]),  # the last dotted component
    ("a=b={1,2}", ["c-a1", "c-a2"]),  # the text before the FIRST =
    ("+~Xa={1,2}", ["c-Xa1", "c-Xa2"]),
    ("a=1{2,3}b{4,5}", ["c-a2-a4", "c-a2-a5", "c-a3-a4", "c-a3-a5"]),  # text before a group accumulates
    ("-x v{1,2}", ["c-1", "c-2"]),  # not a whole word: no flag key
    ("{small,large}", ["c-small", "c-large"]),
])
def test_naming_keys(text: str, names: list[str]) -> None:
    assert _names(text) == names


def test_seeds_vary_fastest_and_names_are_cut_with_a_digest() -> None:
    assert _names("--lr {1,2}", seeds=2) == ["c-lr1-seed0", "c-lr1-seed1", "c-lr2-seed0", "c-lr2-seed1"]
    cells = expand(split_args("--lr {1,2}", 1), 2)
    assert [(c.args, c.seed) for c in cells[:2]] == [(("--lr", "1"), 0), (("--lr", "1"), 1)]
    long = job_name("n" * 70, ("x/y",))
    assert long == "n" * 55 + "-" + hashlib.sha256(("n" * 70 + "-x_y").encode()).hexdigest()[:8]
    assert job_name("n" * 60, ("x/y",)) == "n" * 60 + "-x_y"  # exactly 64: kept
    assert job_name("n", ("a b",)) == "n-a_b"
    assert job_name("n", ()) == "n"
