"""One queue line's checks word for word (orchestrator/queue/queueline.py): every message, its column,
and the limits at their edges (scripts/mutation.py queuefile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import QueueIssue, QueueParseError
from orchestrator.core.specs import ParsedQueue
from orchestrator.queue.queuefile import ALLOWED_KEYS, parse_queue
from orchestrator.queue.queueline import MAX_EPOCHS

KEYS = ", ".join(ALLOWED_KEYS)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for rel in ("configs/a.yaml", "configs/sub/dir/b.yml", "c.yaml", "configs/.yaml", "configs/_a.yaml",
                "configs/a+b.yaml", "configs/" + "n" * 64 + ".yaml",
                "configs/" + "n" * 65 + ".yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("lr: 0.1\n")
    return tmp_path


def _parse(project: Path, text: str, **kw: object) -> ParsedQueue:
    queue = project / "q.txt"
    queue.write_text(text)
    return parse_queue(queue, **kw)  # type: ignore[arg-type]


def _issues(project: Path, text: str, **kw: object) -> list[tuple[int | None, str]]:
    with pytest.raises(QueueParseError) as info:
        _parse(project, text, **kw)
    return [(i.column, i.message) for i in info.value.issues]


@pytest.mark.parametrize(("line", "issues"), [
    ("configs/a.yaml classify 3 fast", [(27, 'unexpected token "fast": only key=value fields may follow epochs')]),
    ("configs/a.yaml classify gpus=1 fast", [
        (32, 'unexpected token "fast": only key=value fields may follow a key=value field (epochs goes right after '
             'the task)')]),
    ("configs/a.yaml classify 3 --lr", [
        (27, 'unexpected token "--lr": only key=value fields may follow epochs; trainer arguments go after a '
             'standalone "--"')]),
    ("configs/a.yaml classify epochs=3", [
        (25, f'unknown key "epochs" (allowed: {KEYS}); write epochs as the third token')]),
    ("configs/a.yaml classify lr=3", [
        (25, f'unknown key "lr" (allowed: {KEYS})')]),
    ("configs/a.yaml classify 3 gpus=1 gpus=2", [(34, 'duplicate key "gpus"')]),
    ("configs/a.yaml classify 3 seed=", [(27, 'empty value for "seed"; omit the field to use the default')]),
    ("configs/a.yaml classify 007", [(25, 'epochs must not have leading zeros, got "007"')]),
    ("configs/a.yaml classify 01", [(25, 'epochs must not have leading zeros, got "01"')]),
    ("configs/a.yaml classify 3 fast gpus=01", [
        (27, 'unexpected token "fast": only key=value fields may follow epochs'),
        (32, 'gpus must not have leading zeros, got "01"')]),  # every problem of the line, not the first
    ("configs/a.yaml classify 0", [(25, 'epochs must be a positive integer, got "0"')]),
    ("configs/a.yaml classify 00", [(25, 'epochs must be a positive integer, got "00"')]),
    ("configs/a.yaml classify 1x", [(25, 'epochs must be a positive integer, got "1x"')]),
    (f"configs/a.yaml classify {MAX_EPOCHS + 1}",
     [(25, f'epochs must be at most {MAX_EPOCHS}, got "{MAX_EPOCHS + 1}"')]),
    ("configs/a.yaml classify 3 gpus=01", [(27, 'gpus must not have leading zeros, got "01"')]),
    ("configs/a.yaml classify 3 seed=a=b", [(27, 'seed must be an integer from 0 to 4294967295, got "a=b"')]),
    ("configs/a.yaml classify 3 seed=1 seeds=2", [(None, "seed= and seeds= cannot both be set (seeds=N runs seeds 0 "
                                                         "to N-1)")]),
    ("configs/a.yaml classify 3 seeds=11 -- --x {1,2,3,4,5,6,7,8,9,10} --y {1,2,3,4,5,6,7,8,9,10}", [
        (None, "line expands to 1100 jobs, more than 1000; split it into several lines")]),
    ("name=x gpus=1", [(1, 'missing config path ("name=x" is a key=value field)')]),
    ("configs/a.yaml", [(None, "missing task")]),
    ("configs/a.yaml name=x", [(16, 'missing task ("name=x" is a key=value field)')]),
    ("configs/.yaml classify", [(1, 'derived name "" is empty; add name=')]),
    ("configs/_a.yaml classify", [(1, 'derived name "_a" must start with a letter or digit; add name=')]),
    ("configs/a+b.yaml classify", [(1, 'derived name "a+b" has characters outside [A-Za-z0-9._-]; add name=')]),
    ("configs/" + "n" * 65 + ".yaml classify", [
        (1, f'derived name "{"n" * 65}" is longer than 64 characters; add name=')]),
])
def test_line_messages_and_columns(project: Path, line: str, issues: list[tuple[int | None, str]]) -> None:
    assert _issues(project, line + "\n") == issues


def test_exactly_the_limits_pass(project: Path) -> None:
    parsed = _parse(project, f"configs/a.yaml classify {MAX_EPOCHS} seed=4294967295\n"
                             "configs/" + "n" * 64 + ".yaml classify 1\n"
                             "configs/a.yaml classify 1 name=s seeds=10 -- --x {1,2,3,4,5,6,7,8,9,10} "
                             "--y {1,2,3,4,5,6,7,8,9,10}\n")
    first, long = parsed.jobs[0], parsed.jobs[1]
    assert (first.epochs, first.seed, long.name) == (MAX_EPOCHS, 4294967295, "n" * 64)
    assert len(parsed.jobs) == 2 + 1000


def test_names_derive_from_the_file_after_the_last_slash(project: Path) -> None:
    parsed = _parse(project, "configs/sub/dir/b.yml classify\nc.yaml classify\nconfigs/a.yaml classify name=zz\n")
    assert [j.name for j in parsed.jobs] == ["b", "c", "zz"]


def test_a_bad_config_path_gets_no_derived_name_problem(project: Path) -> None:
    assert _issues(project, "../x/_y.yaml classify\n") == [
        (1, 'config path must not contain ".."; it must stay inside the project root')]


def test_a_name_field_anywhere_on_the_line_stops_the_derivation(project: Path) -> None:
    """The derived name "_a" would be invalid too, but the line has a name= (itself invalid): one
    error, about the field."""
    for line in ("configs/_a.yaml classify name=-x", "configs/_a.yaml classify 3 name=-x"):
        issues = _issues(project, line + "\n")
        assert [m for _, m in issues] == [
            'name must be 1 to 64 characters from [A-Za-z0-9._-] starting with a letter or digit, got "-x"'], line


@pytest.mark.parametrize(("line", "issues"), [
    ("gpus=1 -- --lr 1", [(None, "a line without a config path needs name= (job ids derive from names)")]),
    ("name=a gpus=1 fast -- x", [
        (15, 'unexpected token "fast": a line without a config path holds only key=value fields, then "--" and the '
             'trainer arguments')]),
    ("name=a --fast", [
        (8, 'unexpected token "--fast": a line without a config path holds only key=value fields, then "--" and the '
            'trainer arguments; trainer arguments go after a standalone "--"')]),
    ("name=a gpus=x", [(8, 'gpus must be an integer from 1 to 64, got "x"')]),
    ("name=1bad$ -- x", [(1, 'name must be 1 to 64 characters from [A-Za-z0-9._-] starting with a letter or digit, '
                             'got "1bad$"')]),
])
def test_lines_without_a_config_path(project: Path, line: str, issues: list[tuple[int | None, str]]) -> None:
    assert _issues(project, line + "\n", needs_config=False) == issues


def test_a_line_without_a_config_path_named_by_a_bad_name_field_is_one_error(project: Path) -> None:
    """name= is present though invalid: the line is not ALSO told it needs a name."""
    assert [m for _, m in _issues(project, "name=-x -- y\n", needs_config=False)] == [
        'name must be 1 to 64 characters from [A-Za-z0-9._-] starting with a letter or digit, got "-x"']


def test_an_issue_names_its_line(project: Path) -> None:
    with pytest.raises(QueueParseError) as info:
        _parse(project, "# c\nconfigs/a.yaml classify 3\nconfigs/a.yaml\n")
    assert info.value.issues == [QueueIssue(3, None, "missing task")]
