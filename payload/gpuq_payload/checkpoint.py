"""Atomic checkpoints and the LATEST pointer (docs/checkpoints.md).

Write order: ``latest-<step>.pt.tmp`` (flush + fsync) -> ``os.replace`` -> fsync dir; then ``LATEST.tmp`` =
``{file, step, epoch, sha256, bytes, written_at}`` (fsync) -> replace ``LATEST`` -> fsync dir; then the
older rolling files go.  A reader only ever follows ``LATEST`` and verifies the sha256, so a torn
``*.tmp`` is never selected, and the file ``LATEST`` names is never rewritten in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import time

import torch

from . import contract


class CheckpointError(Exception):
    """A checkpoint or pointer is missing, unreadable or does not match its recorded sha256."""


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def cleanup_tmp(ckpt_dir: str) -> list[str]:
    """Delete leftover ``*.tmp`` files (interrupted writes). Returns the names removed."""
    removed = []
    if not os.path.isdir(ckpt_dir):
        return removed
    for name in sorted(os.listdir(ckpt_dir)):
        if name.endswith(".tmp"):
            try:
                os.remove(os.path.join(ckpt_dir, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def _test_hook(step: int | None) -> tuple[str, float] | None:
    """TEST HOOK: GPUQ_TEST_HOOK_SAVE_PAUSE="<point>:<seconds>[:<from_step>]" holds each rolling save
    at ``step`` >= from_step for ``seconds`` at ``point`` (contract.TEST_HOOK_SAVE_POINTS), so a test
    can make saves slow or SIGKILL one there.  Unset in every real job: (point, seconds) or None."""
    raw = os.environ.get(contract.ENV_TEST_HOOK_SAVE_PAUSE)
    if not raw or step is None:
        return None
    point, seconds, from_step = ([*raw.split(":"), "", ""])[:3]
    if point not in contract.TEST_HOOK_SAVE_POINTS or step < int(from_step or 0):
        return None
    return point, float(seconds or 0)


def _test_hook_pause(hook: tuple[str, float] | None, point: str, path: str) -> None:
    if hook is None or hook[0] != point:
        return
    print(f"TEST HOOK: save paused at {point} file={os.path.basename(path)} for {hook[1]}s", flush=True)
    time.sleep(hook[1])


class _PauseMidWrite:
    """TEST HOOK: a file object that pauses once after its first write, leaving a torn tmp file."""

    def __init__(self, fh, path: str, hook: tuple[str, float]) -> None:
        self.fh, self.path, self.hook, self.paused = fh, path, hook, False

    def write(self, data) -> int:
        n = self.fh.write(data)
        if not self.paused and n:
            self.paused = True
            self.fh.flush()
            _test_hook_pause(self.hook, "write", self.path)
        return n

    def flush(self) -> None:
        self.fh.flush()


def _write_file_atomic(obj, path: str, hook_step: int | None = None) -> tuple[str, int]:
    """torch.save ``obj`` to ``path`` atomically; returns (sha256, bytes)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    hook = _test_hook(hook_step)
    with open(tmp, "wb") as fh:
        torch.save(obj, _PauseMidWrite(fh, tmp, hook) if hook is not None else fh)
        fh.flush()
        os.fsync(fh.fileno())
    _test_hook_pause(hook, "fsynced", tmp)
    sha = sha256_file(tmp)
    size = os.path.getsize(tmp)
    os.replace(tmp, path)
    fsync_dir(directory)
    _test_hook_pause(hook, "renamed", path)
    return sha, size


def write_pointer(ckpt_dir: str, doc: dict, hook_step: int | None = None) -> None:
    path = os.path.join(ckpt_dir, contract.LATEST_POINTER)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    _test_hook_pause(_test_hook(hook_step), "pointer", tmp)
    os.replace(tmp, path)
    fsync_dir(ckpt_dir)


def rolling_name(step: int, alternate: bool = False) -> str:
    """``latest-<step>.pt``: each rolling checkpoint gets a new name, so the file ``LATEST`` names
    is never overwritten in place (a kill between replacing the file and the pointer would leave a
    pointer whose sha256 no longer matches, and no good checkpoint at all).  A second save at the
    step ``LATEST`` already names (a periodic save at an epoch's last step, then a SIGTERM during
    the eval) goes to the alternate name ``latest-<step>-1.pt``."""
    stem, ext = os.path.splitext(contract.LATEST_CKPT)
    return f"{stem}-{int(step):09d}{'-1' if alternate else ''}{ext}"


def _pointed_file(ckpt_dir: str) -> str | None:
    try:
        doc = read_pointer(ckpt_dir)
    except CheckpointError:
        return None
    return doc["file"] if doc is not None else None


def save_checkpoint(state: dict, ckpt_dir: str, *, step: int, epoch: int) -> dict:
    """Atomically write ``latest-<step>.pt``, then the ``LATEST`` pointer, then drop older rolling
    files.  At every instant ``LATEST`` names a complete file with its sha256.  Returns the pointer."""
    name = rolling_name(step)
    if name == _pointed_file(ckpt_dir):
        name = rolling_name(step, alternate=True)
    sha, size = _write_file_atomic(state, os.path.join(ckpt_dir, name), hook_step=step)
    doc = {"file": name, "step": int(step), "epoch": int(epoch), "sha256": sha,
           "bytes": size, "written_at": time.time()}
    write_pointer(ckpt_dir, doc, hook_step=step)
    stem, ext = os.path.splitext(contract.LATEST_CKPT)
    for old in os.listdir(ckpt_dir):
        if old != name and old.endswith(ext) and (old == contract.LATEST_CKPT or old.startswith(stem + "-")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(ckpt_dir, old))
    return doc


def save_best(obj: dict, ckpt_dir: str) -> tuple[str, int]:
    """Atomically write ``best.pt`` (tensors and plain values only: loads with weights_only=True)."""
    return _write_file_atomic(obj, os.path.join(ckpt_dir, contract.BEST_CKPT))


def read_pointer(ckpt_dir: str) -> dict | None:
    """The parsed ``LATEST`` pointer, or None when there is none."""
    path = os.path.join(ckpt_dir, contract.LATEST_POINTER)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"unreadable pointer {path}: {exc}") from exc
    for key in ("file", "step", "sha256"):
        if key not in doc:
            raise CheckpointError(f"pointer {path} lacks '{key}'")
    if os.path.basename(doc["file"]) != doc["file"] or doc["file"].endswith(".tmp"):
        raise CheckpointError(f"pointer {path} names an invalid file {doc['file']!r}")
    return doc


def resolve_resume(ckpt_dir: str, resume_from: str | None) -> tuple[str, str | None] | None:
    """Pick the checkpoint to resume from: (path, expected sha256 or None), or None for a fresh start.

    ``resume_from`` (GPUQ_RESUME_FROM) may name a checkpoint file, a LATEST pointer or a checkpoint
    directory; when it is unset or empty, ``ckpt_dir/LATEST`` is followed if present.
    """
    if resume_from:
        target = resume_from
        if os.path.isdir(target):
            target = os.path.join(target, contract.LATEST_POINTER)
        if os.path.basename(target) == contract.LATEST_POINTER:
            doc = read_pointer(os.path.dirname(target) or ".")
            if doc is None:
                raise CheckpointError(f"resume pointer not found: {target}")
            return os.path.join(os.path.dirname(target), doc["file"]), doc["sha256"]
        if not os.path.isfile(target):
            raise CheckpointError(f"resume checkpoint not found: {target}")
        expected = None
        doc = read_pointer(os.path.dirname(os.path.abspath(target)))
        if doc is not None and doc["file"] == os.path.basename(target):
            expected = doc["sha256"]
        return target, expected
    doc = read_pointer(ckpt_dir)
    if doc is None:
        return None
    return os.path.join(ckpt_dir, doc["file"]), doc["sha256"]


def verify(path: str, expected_sha: str | None) -> str:
    """Return the file's sha256; raise CheckpointError if missing or not ``expected_sha``."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    sha = sha256_file(path)
    if expected_sha is not None and sha != expected_sha:
        raise CheckpointError(f"sha256 mismatch for {path}: pointer says {expected_sha}, file has {sha}")
    return sha


def load_checkpoint(path: str, expected_sha: str | None = None, *, check: bool = True) -> dict:
    """Load a full training checkpoint with ``weights_only=True``: tensors and plain values only.  A
    checkpoint shipped home from one host may be pushed to another on resume; the sha256 it is checked
    against comes from the same host, so the file itself must never be able to run code."""
    if check:
        verify(path, expected_sha)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot load checkpoint {path}: {exc}") from exc


def unwrap_state_dict(model: torch.nn.Module) -> dict:
    """State dict without DDP ``module.`` or torch.compile ``_orig_mod.`` prefixes, on CPU."""
    while hasattr(model, "module"):
        model = model.module
    model = getattr(model, "_orig_mod", model)
    out = {}
    for key, value in model.state_dict().items():
        for prefix in ("module.", "_orig_mod."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value.detach().cpu().clone()
    return out


def weights_sha256(state_dict: dict) -> str:
    """sha256 over the tensors' raw bytes in sorted key order (no numpy needed)."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        t = state_dict[key].detach().cpu().contiguous()
        n = t.numel() * t.element_size()
        if n:
            h.update(ctypes.string_at(t.data_ptr(), n))
    return h.hexdigest()
