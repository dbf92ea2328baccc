"""A ``[data]`` tree build that fails on the host (orchestrator/transfer/datasync.py's ``DATA`` script, run as
a host runs it: ``python -I -c DATA ROOT build``) leaves nothing it assembled: issue 43 #1 found the
verified files of a failed tree (``~/.gpuq/keys.toml`` among them) left in ``bundles/.data/files/``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.transfer.datasync import DATA


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_failed_build_removes_the_files_it_assembled_and_the_trees_chunks(tmp_path: Path) -> None:
    base = tmp_path / "bundles" / ".data"
    (base / "chunks").mkdir(parents=True)
    (base / "files").mkdir()
    shared = b"a file another tree already holds"
    (base / "files" / _sha(shared)).write_bytes(shared)
    secret, changed = b"[runpod]\napi_key = 'rp-0123456789'\n", b"bytes that changed while they were synced"
    entries = []
    for rel, data, claimed in (("keys.toml", secret, _sha(secret)), ("ledger.db-shm", changed, _sha(b"before")),
                               ("shared.txt", shared, _sha(shared))):
        (base / "chunks" / _sha(data)).write_bytes(data)
        entries.append({"rel": rel, "size": len(data), "sha256": claimed, "chunks": [_sha(data)]})
    doc = {"name": "h", "tree": "f" * 64, "kind": "dir", "entries": entries}
    got = subprocess.run([sys.executable, "-I", "-c", DATA, str(tmp_path), "build"], input=json.dumps(doc),
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]}, timeout=60, check=False)
    assert got.returncode != 0 and "changed while they were synced: ledger.db-shm" in got.stderr, got.stderr
    assert sorted(p.name for p in (base / "files").iterdir()) == [_sha(shared)]  # only what was there before
    assert list((base / "chunks").iterdir()) == [] and list((base / "trees").iterdir()) == []
    # the same build with every file sound links the tree and keeps the files
    (base / "chunks" / _sha(secret)).write_bytes(secret)
    entries[1] = {**entries[1], "sha256": _sha(changed)}
    (base / "chunks" / _sha(changed)).write_bytes(changed)
    got = subprocess.run([sys.executable, "-I", "-c", DATA, str(tmp_path), "build"],
                         input=json.dumps({**doc, "entries": entries}), capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"]}, timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    assert (base / "trees" / ("f" * 64) / "keys.toml").read_bytes() == secret
