"""Parse and validate queue files, file level (docs/queue.md).

A queue file is UTF-8 text, one job line per line (queueline.py: tokens and fields; queuegrid.py:
trainer arguments after ``--``, grids, seeds and the names of expanded jobs)::

    <config_path> <task> [epochs] [key=value ...] [-- trainer arguments]   [# comment]

Lexing, in order:

1. Drop one leading BOM; every line must decode as UTF-8.
2. Split on LF and drop one CR at the end of each line; any other CR is a "stray carriage return".
   A line may hold at most 4096 bytes (EOL excluded).
3. Split on runs of spaces and tabs. A token starting with ``#`` starts a comment (``20#note`` is one
   token); a standalone ``--`` ends the tokens: the rest of the line is split like a shell would
   (queuegrid.py), where ``#`` starts a comment only at a word start outside quotes. No tokens: a
   blank line, never a job.

Every problem of the whole file is collected, then raised at once as one :class:`QueueParseError`;
columns are 1-based character columns (a tab counts as one). Names (after grid expansion) compare
case-insensitively and must be unique in the file. With a workdir, config paths must name a regular
file inside it (symlinks resolved) and are hashed; a config whose top-level ``epochs:`` differs from
the line's epochs gives a warning, which never blocks.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from orchestrator.core.errors import QueueIssue, QueueParseError
from orchestrator.core.specs import DEFAULT_EPOCHS, JobSpec, ParsedQueue
from orchestrator.queue import dependencies
from orchestrator.queue.queueconfig import ConfigInfo, epochs_differ, inspect_config
from orchestrator.queue.queuegrid import ArgsError, Cell, expand, job_name
from orchestrator.queue.queueline import ALLOWED_KEYS, ARGS_MARK, Draft, Token, check_auto_baseline, parse_line

__all__ = ["ALLOWED_KEYS", "PlacementCheck", "parse_bytes", "parse_queue"]

PlacementCheck = Callable[[Sequence[JobSpec]], Sequence[QueueIssue]]
"""Where the jobs of the lines that parsed could go: an issue for each that no host can take (``submit``
passes one, so a ``gpu=2`` meant as ``gpus=2`` is reported in the same pass as a typo on another line)."""

MAX_LINE_BYTES = 4096
MAX_QUEUE_BYTES = 8 * 1024 * 1024  # a bigger queue file is refused (`gpuq submit /dev/zero` must not eat memory)
BOM = b"\xef\xbb\xbf"
_TOKEN_RE = re.compile(r"[^ \t]+")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


# ---------------------------------------------------------------- public API


def parse_queue(
    path: Path,
    *,
    known_hosts: Collection[str] | None = None,
    tasks: Collection[str] | None = None,
    needs_config: bool = True,
    uses_epochs: bool = True,
    placement: PlacementCheck | None = None,
) -> ParsedQueue:
    """Read and validate the queue file at ``path``; its directory is the workdir.

    ``needs_config=False`` (the project's command uses neither ``{config}`` nor ``{task}``) lets a
    line be only fields and trainer arguments.  ``uses_epochs=False`` (the command has no ``{epochs}``):
    a line without epochs gets its config's ``epochs:``, else none (never the default 20)."""
    label = str(path)
    data = read_queue_bytes(path)
    workdir = Path(os.path.abspath(path)).parent
    return parse_bytes(data, label=label, workdir=workdir, known_hosts=known_hosts, tasks=tasks,
                       needs_config=needs_config, uses_epochs=uses_epochs, placement=placement)


def read_queue_bytes(path: Path) -> bytes:
    """The queue file's bytes: a regular file of at most MAX_QUEUE_BYTES, else QueueParseError (a FIFO,
    a device such as /dev/zero or a directory is refused before a byte is read; nothing waits on it)."""
    label = str(path)

    def refuse(why: str) -> QueueParseError:
        return QueueParseError(label, [QueueIssue(0, None, why)])

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise refuse(f"cannot read queue file: {reason}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise refuse(f"cannot read queue file: {os.strerror(errno.EISDIR)}")
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
            raise refuse(f"cannot read queue file: it is {kind}; give a regular text file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_QUEUE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_QUEUE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise refuse(f"cannot read queue file: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_QUEUE_BYTES:
        raise refuse(f"queue file is larger than {MAX_QUEUE_BYTES // (1024 * 1024)} MiB; split it into several "
                     "queue files")
    return data


def parse_bytes(
    data: bytes,
    *,
    label: str,
    workdir: Path | None,
    known_hosts: Collection[str] | None = None,
    tasks: Collection[str] | None = None,
    needs_config: bool = True,
    uses_epochs: bool = True,
    placement: PlacementCheck | None = None,
) -> ParsedQueue:
    """Validate queue-file bytes; ``workdir=None`` skips the config-file checks and hashing.  With
    ``placement``, the jobs of every line without a problem are also checked against the hosts."""
    issues: list[QueueIssue] = []
    drafts, saw_job = _parse_lines(data, issues, needs_config)
    jobs = _expand(drafts, issues)
    check_auto_baseline([(draft, name) for draft, name, _ in jobs], issues)
    edges = dependencies.edges_of(drafts, jobs, issues)
    _check_hosts_and_tasks(drafts, known_hosts, tasks, issues)
    warnings = _check_environment(drafts, workdir, label, issues, uses_epochs) if workdir is not None else []
    if placement is not None:
        bad = {issue.line for issue in issues}
        issues.extend(placement([_to_spec(draft, name, cell, uses_epochs) for draft, name, cell in jobs
                                 if draft.number not in bad]))
    if not saw_job and not issues:
        issues.append(QueueIssue(0, None, "no jobs"))
    if issues:
        raise QueueParseError(label, sorted(issues, key=_issue_order))
    return ParsedQueue(
        path=label,
        workdir=str(workdir) if workdir is not None else "",
        jobs=tuple(_to_spec(draft, name, cell, uses_epochs) for draft, name, cell in jobs),
        warnings=tuple(warnings),
        edges=tuple(edges),
    )


# ---------------------------------------------------------------- lexing


def _parse_lines(data: bytes, issues: list[QueueIssue], needs_config: bool) -> tuple[list[Draft], bool]:
    """Parse every line; return the job drafts and whether any line held tokens."""
    drafts: list[Draft] = []
    saw_job = False
    for number, text in _split_lines(data, issues):
        tokens, args_at = _tokens(text)
        if not tokens and args_at is None:
            continue
        saw_job = True
        body = text if args_at is not None else text[: tokens[-1].column - 1 + len(tokens[-1].text)]
        control = _CONTROL_RE.search(body)
        if control is not None:
            message = f"control character U+{ord(control.group()):04X} is not allowed"
            issues.append(QueueIssue(number, control.start() + 1, message))
            continue
        args_text = text[args_at:] if args_at is not None else None
        draft = parse_line(number, text, tokens, args_text, (args_at or 0) + 1, issues, needs_config=needs_config)
        if draft is not None:
            drafts.append(draft)
    return drafts, saw_job


def _tokens(text: str) -> tuple[list[Token], int | None]:
    """The tokens before a comment or a standalone ``--``, and the index right after that ``--``."""
    tokens: list[Token] = []
    for match in _TOKEN_RE.finditer(text):
        word = match.group()
        if word.startswith("#"):
            return tokens, None
        if word == ARGS_MARK:
            return tokens, match.end()
        tokens.append(Token(word, match.start() + 1))
    return tokens, None


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


# ---------------------------------------------------------------- whole file


def _expand(drafts: list[Draft], issues: list[QueueIssue]) -> list[tuple[Draft, str, Cell]]:
    """Every job of every line (grids and seeds expanded) with its name; names compare
    case-insensitively, and a duplicate is reported on the later line."""
    first_by_key: dict[str, tuple[Draft, str]] = {}
    jobs: list[tuple[Draft, str, Cell]] = []
    for draft in drafts:
        if draft.name is None:
            continue
        try:
            cells = expand(draft.words, draft.ints.get("seeds"))
        except ArgsError as exc:
            issues.append(QueueIssue(draft.number, exc.column, exc.message))
            continue
        for cell in cells:
            name = job_name(draft.name, cell.suffix)
            key = name.casefold()
            if key not in first_by_key:
                first_by_key[key] = (draft, name)
                jobs.append((draft, name, cell))
                continue
            first, first_name = first_by_key[key]
            issues.append(QueueIssue(draft.number, None, _collision(draft, name, first, first_name)))
    return jobs


def _collision(draft: Draft, name: str, first: Draft, first_name: str) -> str:
    if first is draft:
        return (f'the grid expands to two jobs named "{name}"; give the values distinct names '
                "(see docs/queue.md) or split the line")
    if first_name == name:
        what = first.config.text if first.config is not None else "no config"
        detail = f"({what}); add name= to one of them"
    else:
        detail = f'("{first_name}"; names are case-insensitive)'
    return f'job name "{name}" collides with line {first.number} {detail}'


def _check_hosts_and_tasks(
    drafts: list[Draft],
    known_hosts: Collection[str] | None,
    tasks: Collection[str] | None,
    issues: list[QueueIssue],
) -> None:
    for draft in drafts:
        host = draft.host
        if known_hosts is not None and host is not None and host.text not in known_hosts:
            issues.append(QueueIssue(draft.number, host.column, f'unknown host "{host.text}"'))
        if draft.task is not None and tasks and draft.task.text not in tasks:
            declared = ", ".join(sorted(tasks))
            message = f'unknown task "{draft.task.text}" (the payload declares: {declared})'
            issues.append(QueueIssue(draft.number, draft.task.column, message))


def _check_environment(
    drafts: list[Draft], workdir: Path, label: str, issues: list[QueueIssue], uses_epochs: bool = True
) -> list[str]:
    """Check and hash every config file; return the epochs warnings."""
    root = os.path.realpath(workdir)
    cache: dict[str, ConfigInfo] = {}
    warnings: list[str] = []
    for draft in drafts:
        if not draft.config_ok or draft.config is None:
            continue
        rel = draft.config.text
        info = cache.get(rel)
        if info is None:
            info = cache[rel] = inspect_config(root, rel)
        if info.error is not None:
            issues.append(QueueIssue(draft.number, draft.config.column, info.error))
            continue
        draft.sha256 = info.sha256
        given = info.epochs
        if isinstance(given, int) and not isinstance(given, bool) and given > 0:
            draft.config_epochs = given
        if draft.epochs is None and draft.config_epochs is not None:
            continue  # the line gives none: the config's own epochs run (``_epochs``)
        runs = draft.epochs if draft.epochs is not None else DEFAULT_EPOCHS
        if epochs_differ(info.epochs, runs) and (draft.epochs is not None or uses_epochs):
            who = "the queue line runs" if draft.epochs is not None else "gpuq runs the default"
            warnings.append(f"{label}:{draft.number}: config {rel} sets epochs: {info.epochs} but {who} {runs}")
    return warnings


def _issue_order(issue: QueueIssue) -> tuple[int, float]:
    return issue.line, issue.column if issue.column is not None else math.inf


def _epochs(draft: Draft, uses_epochs: bool) -> int | None:
    """The line's epochs; else the config's ``epochs:``; else, for a trainer that gets ``{epochs}``, the
    default; else None: gpuq does not know and never invents a number."""
    if draft.epochs is not None:
        return draft.epochs
    if draft.config_epochs is not None:
        return draft.config_epochs
    return DEFAULT_EPOCHS if uses_epochs else None


def _to_spec(draft: Draft, name: str, cell: Cell, uses_epochs: bool = True) -> JobSpec:
    assert draft.name is not None, "a draft without a name always comes with an issue"
    return JobSpec(
        name=name,
        cell=draft.name,
        seeds_max=draft.seeds_max,
        config=draft.config.text if draft.config is not None else "",
        task=draft.task.text if draft.task is not None else "",
        epochs=_epochs(draft, uses_epochs),
        gpus=draft.ints.get("gpus", 1),
        nodes=draft.ints.get("nodes", 1),
        est_min=draft.est_min,
        seed=cell.seed if cell.seed is not None else draft.ints.get("seed"),
        host=draft.host.text if draft.host is not None else None,
        retries=draft.ints.get("retries"),
        rerun=draft.rerun,
        after=tuple(t.text for t in draft.after),
        gpu=draft.gpu,
        gpu_mem=draft.gpu_mem,
        config_sha256=draft.sha256,
        args=cell.args,
        line=draft.number,
        raw=draft.raw,
    )
