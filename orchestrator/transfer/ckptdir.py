"""A checkpoint directory between a host and this machine (docs/checkpoints.md).

HF's ``checkpoint-500/``, a DCP or DeepSpeed directory: the agent's ``snapshot`` copies a complete one
file by file to ``ckpt/.ship.d/`` and lists every file with its size and sha256 (the pointer's
``files``; its ``sha256`` is their tree hash, :func:`orchestrator.core.filenames.tree_sha256`).  Here it is

- fetched file by file into a fresh local directory, each file checked by size and sha256, then the
  tree hash over the whole: one file short, extra or changed and nothing is kept;
- placed back as a unit: pushed beside its place in the job's run dir (``<dir>.gpuq-incoming``), then
  swapped in with one rename, so a host never holds half of it under the checkpoint's name.

Everything a host says is untrusted: every path is checked with the shared file-name rule before a
byte moves.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from orchestrator.core import filenames, protocol
from orchestrator.core.errors import GpuqError
from orchestrator.host_documents import SnapshotPointer
from orchestrator.transfer.verify import file_sha256

INCOMING = ".gpuq-incoming"


def local_entries(directory: Path) -> list[tuple[str, int, str]]:
    """(path, bytes, sha256) of every regular file under a local checkpoint directory, sorted."""
    out = []
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            full = Path(dirpath) / name
            if full.is_file() and not full.is_symlink():
                out.append((full.relative_to(directory).as_posix(), full.stat().st_size, file_sha256(full)))
    return sorted(out)


def fetch_dir(host: Any, job_id: str, pointer: SnapshotPointer, part: Path) -> str | None:
    """Copy the directory the agent pinned into ``part`` (made fresh); None when every file and the
    tree hash match the pointer, else why (``part`` is then removed).  HostError passes through."""
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    why: str | None = "the copy broke off"
    try:
        why = _fetch_files(host, job_id, pointer, part)
    finally:
        if why is not None:
            shutil.rmtree(part, ignore_errors=True)
    return why


def _fetch_files(host: Any, job_id: str, pointer: SnapshotPointer, part: Path) -> str | None:
    entries = []
    for item in pointer.files:
        why = filenames.path_problem(item.path)
        if why is not None:
            return f"the directory lists an unsafe path {item.path[:80]!r}: {why}"
        local = part.joinpath(*item.path.split("/"))
        host.get(host.path(protocol.JOBS_DIR, job_id, *pointer.snapshot.split("/"), *item.path.split("/")),
                 local, size=item.bytes)
        if local.stat().st_size != item.bytes or file_sha256(local) != item.sha256:
            return f"{pointer.file}/{item.path} did not match its listing (torn or replaced)"
        entries.append((item.path, item.bytes, item.sha256))
    if not entries or filenames.tree_sha256(entries) != pointer.sha256:
        return f"{pointer.file} did not match its tree hash"
    if local_entries(part) != sorted(entries):
        return f"{pointer.file}: the copy holds other files than its listing"
    return None


def swap_in(part: Path, final: Path) -> None:
    """Put the verified directory ``part`` at ``final`` (replacing a file or directory there)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = final.with_name(f".{final.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    if final.is_dir() and not final.is_symlink():
        os.replace(final, aside)
    elif final.exists() or final.is_symlink():
        final.unlink()
    os.replace(part, final)
    shutil.rmtree(aside, ignore_errors=True)


def remove(path: Path) -> None:
    """A superseded local copy, file or directory."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remote_entries(host: Any, remote: str) -> set[tuple[str, str]]:
    probe = host.run(["sh", "-c", 'cd "$1" 2>/dev/null && find . -type f -exec sha256sum {} +; true', "sh", remote],
                     timeout=300)
    found = set()
    for line in (probe.stdout or "").splitlines():
        sha, _, path = line.partition("  ")
        if len(sha) == 64 and path.startswith("./"):
            found.add((path[2:], sha))
    return found


def place_dir(host: Any, host_name: str, local_dir: Path, remote: str) -> bool:
    """Make ``remote`` hold exactly the files of ``local_dir``: kept when it already does (False), else
    pushed to ``<remote>.gpuq-incoming`` and swapped in with one rename (True)."""
    want = local_entries(local_dir)
    if _remote_entries(host, remote) == {(path, sha) for path, _size, sha in want}:
        return False
    incoming = remote + INCOMING
    _run(host, host_name, ["rm", "-rf", incoming])
    for path, _size, _sha in want:
        host.put(local_dir.joinpath(*path.split("/")), f"{incoming}/{path}")
    _run(host, host_name, ["sh", "-c", 'rm -rf "$2" && mv "$1" "$2"', "sh", incoming, remote])
    return True


def _run(host: Any, host_name: str, argv: list[str]) -> None:
    done = host.run(argv, timeout=300)
    if done.exit_code != 0:
        raise GpuqError(f"host {host_name}: {argv[0]} failed: {done.stderr.strip()[:200]}")
