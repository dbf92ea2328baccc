"""Writes that survive a crash, for ``gpuq pull`` and the evidence it keeps: a file replaced atomically, a
tree and a directory fsynced, and the UTC time stamp their records carry."""

from __future__ import annotations

import os
import time
from pathlib import Path


def utc_stamp(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_tree(directory: Path) -> None:
    """Make the copy durable before anything claims it is verified."""
    for dirpath, _dirs, filenames in os.walk(directory):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_path(directory)


def fsync_path(directory: Path) -> None:
    """fsync a file or a directory (what a rename into it made durable)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
