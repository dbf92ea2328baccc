"""Which file names may travel between a host and this machine (the rule the agent shares,
``payload/agent/gpuq_records/gpuq_own.py``), and the hash of a checkpoint directory's tree of them."""

from __future__ import annotations

import hashlib

# --- the file-name rule, shared with the agent (payload/agent/gpuq_records/gpuq_own.py) --------------
# A name travels unless it is unsafe: empty, "." or "..", a path separator, a control character,
# over 255 bytes, not UTF-8.  "=", "+", "@", ",", spaces and leading dots are ordinary
# (Lightning's epoch=19-step=40.ckpt, HF's checkpoint-500/, a DCP dir's .metadata).
MAX_NAME_BYTES = 255
MAX_PATH_PARTS = 32


def name_problem(name: str) -> str | None:
    """Why one path component cannot travel, or None (the agent's gpuq_own.name_problem)."""
    if name in ("", ".", ".."):
        return "an empty, '.' or '..' name"
    if "/" in name or "\\" in name:
        return "a path separator in the name"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "a control character in the name"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if size > MAX_NAME_BYTES:
        return f"a name longer than {MAX_NAME_BYTES} bytes"
    return None


def path_problem(rel: str) -> str | None:
    """Why a relative POSIX path cannot travel, or None."""
    parts = rel.split("/")
    if len(parts) > MAX_PATH_PARTS:
        return f"more than {MAX_PATH_PARTS} levels deep"
    for part in parts:
        why = name_problem(part)
        if why is not None:
            return why
    return None


def tree_sha256(entries: list[tuple[str, int, str]]) -> str:
    """A checkpoint directory's hash from its (path, bytes, sha256) entries: the agent's
    gpuq_own.tree_sha256 (sha256 over "<sha256> <bytes> <path>\\n" lines sorted by path)."""
    lines = "".join(f"{sha} {size} {path}\n" for path, size, sha in sorted(entries))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
