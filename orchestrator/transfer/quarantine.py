"""The quarantine of failed attempts' evidence copies that did not verify (docs/results.md, "Quarantine").

A copy of a log and exit record that does not hold up is moved, not deleted, to
``$GPUQ_HOME/quarantine/<job>--a<n>--evidence[-k]``, for a person to look at.  A host decides how many
failed attempts it has and how big their logs are (up to ``evidence.MAX_FILE_BYTES`` each), so this part
of the quarantine is counted and pruned each time a copy is set aside: the newest copies are kept, at most
``MAX_COPIES`` of them and ``MAX_BYTES`` in all (the copy just set aside always stays), older ones are
deleted.  The quarantine of `gpuq pull` (``<job>--a<n>--<reason>``) is not touched here.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

EVIDENCE_TAG = "--evidence"  # in the name of every evidence copy set aside
MAX_COPIES = 50  # evidence copies the quarantine keeps
MAX_BYTES = 4 << 30  # bytes of evidence copies it keeps (the newest copy stays, whatever its size)


@dataclass(frozen=True)
class Held:
    """What the evidence quarantine holds after a copy was set aside, and how many older ones went."""

    copies: int
    bytes: int
    pruned: int

    def said(self) -> str:
        gone = f"; {self.pruned} older pruned" if self.pruned else ""
        return f"the quarantine keeps {self.copies} evidence copies, {self.bytes} bytes{gone}"


def set_aside(directory: Path, root: Path, base: str) -> tuple[Path, Held]:
    """Move ``directory`` into ``root`` as ``base`` (``base-2``, ... when taken), then prune the evidence
    copies there beyond the limits, oldest first; returns where it went and what the quarantine holds."""
    root.mkdir(parents=True, exist_ok=True)
    aside, n = root / base, 2
    while aside.exists():
        aside, n = root / f"{base}-{n}", n + 1
    shutil.move(str(directory), str(aside))
    os.utime(aside)  # its age here is when it was set aside
    return aside, prune(root, keep=aside)


def _size(path: Path) -> int:
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total


def prune(root: Path, *, keep: Path, max_copies: int | None = None, max_bytes: int | None = None) -> Held:
    """Delete the oldest evidence copies under ``root`` beyond ``max_copies`` and ``max_bytes`` (default
    ``MAX_COPIES``, ``MAX_BYTES``); ``keep`` is never deleted."""
    max_copies = MAX_COPIES if max_copies is None else max_copies
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    found = []
    for entry in os.scandir(root):
        try:
            if EVIDENCE_TAG in entry.name and entry.is_dir(follow_symlinks=False):
                path = Path(entry.path)
                found.append((path != keep, -entry.stat(follow_symlinks=False).st_mtime, entry.name, path))
        except OSError:  # another gpuq command pruned it meanwhile
            continue
    copies = total = pruned = 0
    for _, _, _, path in sorted(found):  # ``keep`` first, then newest first: past a limit, every older one goes
        size = _size(path) if not pruned else 0
        if path == keep or (not pruned and copies < max_copies and total + size <= max_bytes):
            copies, total = copies + 1, total + size
            continue
        shutil.rmtree(path, ignore_errors=True)
        pruned += 1
    return Held(copies, total, pruned)
