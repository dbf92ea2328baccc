"""What in a job's run dir is the job's own (docs/checkpoints.md, docs/your-project.md): the files
and directories its ``checkpoint`` and ``outputs`` globs match, found without ever passing through a
link into the project or the bundle, and the one file-name rule the host and the controller share.

- A **real file** matching a glob is the job's.
- A **symlink** matching a glob is the job's when it resolves to a real file inside the run dir (as
  Lightning's ``save_last: link`` makes ``last.ckpt``); it counts as that file (its mtime, its bytes).
  A link into the project (the run dir links every top-level entry of the bundle) is never the job's
  and is skipped; a link to anywhere else outside the run dir is *refused* (pull says so).
- A **directory** matching a glob (HF's ``checkpoint-500/``, a DCP dir) is one checkpoint: every real
  file under it belongs to it.  It is *complete* (:func:`dir_problem`) when it is not empty, holds no
  partial file (``*.tmp``, ``*.part``, ...), holds a completion marker at its top (``trainer_state.json``:
  HF's Trainer writes it after the weights, optimizer and RNG state, and it must parse; ``.metadata``: torch.distributed
  .checkpoint writes it after every shard), and, while the job may still be writing, nothing in it
  changed for ``SETTLE_S``.  A directory killed mid-save lacks its marker and is never chosen.
- Directories reached through a symlink are never walked.

Names (:func:`name_problem`) are refused only for what is unsafe: empty, ``.`` or ``..``, a path
separator, a control character, more than 255 bytes, not UTF-8.  ``=``, ``+``, ``@``, ``,``, spaces
and leading dots are ordinary.  ``orchestrator/core/protocol.py`` holds the same rule for the controller.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any, NamedTuple

from gpuq_base.gpuq_lazyre import lazy
from gpuq_records.gpuq_observe import MAX_WALK_ENTRIES, glob_regex, safe_globs

MAX_NAME_BYTES = 255
MAX_PATH_PARTS = 32
SETTLE_S = 2.0  # a checkpoint dir whose newest file is younger may still be being written
DIR_MARKERS = ("trainer_state.json", ".metadata")
PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".incomplete")
_CONTROL = lazy("[\x00-\x1f\x7f-\x9f]")


def name_problem(name: str) -> str | None:
    """Why one path component cannot travel, or None: the rule shared with the controller."""
    if name in ("", ".", ".."):
        return "an empty, '.' or '..' name"
    if "/" in name or "\\" in name:
        return "a path separator in the name"
    if _CONTROL.search(name):
        return "a control character in the name"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if size > MAX_NAME_BYTES:
        return "a name longer than %d bytes" % MAX_NAME_BYTES
    return None


def path_problem(rel: str) -> str | None:
    """Why a relative POSIX path cannot travel, or None."""
    parts = rel.split("/")
    if len(parts) > MAX_PATH_PARTS:
        return "more than %d levels deep" % MAX_PATH_PARTS
    for part in parts:
        why = name_problem(part)
        if why is not None:
            return why
    return None


class Found(NamedTuple):
    rel: str  # POSIX, relative to the run dir
    kind: str  # "file", "link" (to a file of the run dir) or "dir"
    mtime: float  # the file's (a link: its target's); a dir: its newest file's
    real: str  # absolute path of the bytes (a link: its target)


def _inside(path: str, top: str) -> bool:
    return path.startswith(top.rstrip(os.sep) + os.sep)


def _entries(run_dir: str, descend: bool, limit: int) -> list[tuple[str, Any]]:
    """(rel, DirEntry) of everything under ``run_dir``, never through a symlinked dir, sorted."""
    out: list[tuple[str, Any]] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(run_dir, rel_dir) if rel_dir else run_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            if len(out) >= limit:
                return out
            rel = rel_dir + "/" + entry.name if rel_dir else entry.name
            out.append((rel, entry))
            if descend and entry.is_dir(follow_symlinks=False):
                subdirs.append(rel)
        stack.extend(reversed(subdirs))
    return out


def _newest_file_mtime(path: str) -> float:
    newest = 0.0
    for _rel, full in dir_files(path):
        try:
            newest = max(newest, os.lstat(full).st_mtime)
        except OSError:
            continue
    return newest


def dir_files(path: str, limit: int = MAX_WALK_ENTRIES) -> list[tuple[str, str]]:
    """(rel inside ``path``, absolute) of every real file under a checkpoint dir, sorted by rel."""
    out = []
    for rel, entry in _entries(path, True, limit):
        if entry.is_file(follow_symlinks=False):
            out.append((rel, entry.path))
    return sorted(out)


def dir_problem(path: str, settle_s: float = 0.0, now: float | None = None) -> str | None:
    """Why a checkpoint directory is not complete (see the module's text), or None."""
    files = dir_files(path)
    if not files:
        return "it is empty"
    partial = [rel for rel, _ in files if rel.endswith(PARTIAL_SUFFIXES)]
    if partial:
        return "it holds a partial file %s" % partial[0]
    if not any(rel in DIR_MARKERS for rel, _ in files):
        return "it has no completion marker (%s)" % ", ".join(DIR_MARKERS)
    state = os.path.join(path, DIR_MARKERS[0])
    if os.path.isfile(state):  # HF writes it in place: a kill mid-write leaves it cut short
        try:
            with open(state, "rb") as f:
                json.loads(f.read(4 * 1024 * 1024).decode("utf-8"))
        except (OSError, ValueError):
            return "its %s is cut short" % DIR_MARKERS[0]
    if settle_s > 0:
        age = (time.time() if now is None else now) - _newest_file_mtime(path)
        if age < settle_s:
            return "it was written %.1fs ago" % max(0.0, age)
    return None


def scan(run_dir: str, globs: Any, *, bundles: str = "",
         limit: int = MAX_WALK_ENTRIES) -> tuple[list[Found], list[tuple[str, str]]]:
    """What ``globs`` match in ``run_dir`` that is the job's own, and what they match that is refused
    ((rel, why): an unsafe name, a link leaving the run dir, not a regular file).  A link whose target
    lies under ``bundles`` (the project) is skipped without a word.  Files inside a matched directory
    are reported with it, not on their own."""
    pats = safe_globs(globs)
    if not pats or os.path.islink(run_dir) or not os.path.isdir(run_dir):
        return [], []
    rxs = [glob_regex(g) for g in pats]
    dir_rxs = [glob_regex(g) for g in pats if not g.endswith("**")]  # "a/**" asks for the files under a/
    deep = any("/" in g or "**" in g for g in pats)
    top = os.path.realpath(run_dir)
    bundles = os.path.realpath(bundles) if bundles else ""
    found: list[Found] = []
    refused: list[tuple[str, str]] = []
    taken: list[str] = []  # matched dirs: their files go with them
    for rel, entry in _entries(run_dir, deep, limit):
        if any(rel.startswith(d + "/") for d in taken):
            continue
        is_dir = entry.is_dir(follow_symlinks=False)
        if not any(rx.match(rel) for rx in (dir_rxs if is_dir else rxs)):
            continue
        why = path_problem(rel)
        if entry.is_symlink():
            real = os.path.realpath(entry.path)
            if bundles and (_inside(real, bundles) or real == bundles):
                continue  # the project, linked in: never the job's
            if not _inside(real, top):
                refused.append((rel, "a link out of the job's run dir"))
            elif why is not None:
                refused.append((rel, why))
            elif os.path.isfile(real):
                found.append(Found(rel, "link", os.stat(real).st_mtime, real))
            continue  # a dangling link or one to a dir: nothing of its own to ship
        if why is not None:
            refused.append((rel, why))
        elif is_dir:
            taken.append(rel)
            found.append(Found(rel, "dir", _newest_file_mtime(entry.path), entry.path))
        elif entry.is_file(follow_symlinks=False):
            found.append(Found(rel, "file", entry.stat(follow_symlinks=False).st_mtime, entry.path))
        else:
            refused.append((rel, "not a regular file"))
    return found, refused


def _order(found: Found) -> tuple[Any, ...]:
    numbers = tuple(int(n) for n in re.findall(r"\d+", found.rel)[-3:])
    return (found.mtime, numbers, found.rel)


def newest_checkpoint(run_dir: str, globs: Any, settle_s: float = 0.0) -> Found | None:
    """The job's newest own checkpoint: a file, a link to one of its files, or a complete directory
    (mtime, then the numbers in its name, then its name)."""
    found, _refused = scan(run_dir, globs)
    now = time.time()
    usable = [f for f in found if f.kind != "dir" or dir_problem(f.real, settle_s, now) is None]
    return max(usable, key=_order) if usable else None


def tree_sha256(entries: list[dict[str, Any]]) -> str:
    """One hash for a checkpoint directory: sha256 over "<sha256> <bytes> <path>\n" lines sorted by path
    (the controller's ``orchestrator.core.protocol.tree_sha256`` computes the same over its copy)."""
    ordered = sorted(entries, key=lambda e: e["path"])
    lines = "".join("%s %d %s\n" % (e["sha256"], e["bytes"], e["path"]) for e in ordered)
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
