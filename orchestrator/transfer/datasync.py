"""Move ``[data]`` trees to a host once, resumably, verified (docs/your-project.md, "Data").

On the host, under ``bundles/.data/`` (inside the read-only mount a root trainer sees, so no job can
change what another reads)::

    chunks/<sha256>     uploaded 16 MiB pieces (an upload is renamed into place whole: present = complete)
    files/<sha256>      verified files, assembled from their chunks (content-addressed, shared by trees)
    trees/<tree>/       the dataset as the jobs see it: hard links to files/, read-only
    fetch/<sha256>.part an https download in progress (resumed with a Range request)

``sync(host, manifest)``: ``DATA`` ``need`` says whether the tree is there and which chunks are
missing; only those are uploaded (a sync killed halfway resumes with the chunks already there); then
``DATA`` ``build`` assembles and verifies every file by its sha256, links the tree and drops the
chunks; a build that fails (a file changed while it was synced) removes the files it assembled and the
tree's chunks, so nothing of a tree that was not built stays on the host.  A tree already there moves
0 bytes.  An https entry is fetched by the host itself and verified against the sha256 the gpuq.toml
gave.  Each sync is appended to
``$GPUQ_HOME/data/syncs.jsonl`` (host, name, tree, bytes moved) and what a host holds to
``$GPUQ_HOME/data/held/<host>.json`` (``gpuq hosts show``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core import protocol
from orchestrator.core.errors import HostError
from orchestrator.hosts.base import Host
from orchestrator.ledger.sweeprun import DataRef
from orchestrator.queue.datasets import CHUNK, Manifest, data_dir
from orchestrator.transfer import progress as transfer_progress

TIMEOUT_S = 3600.0

# stdlib only, Python >= 3.8, run with -I by the host's Python; argv: root, verb; stdin: the manifest JSON
DATA = r"""
import hashlib, json, os, shutil, sys
root, verb = sys.argv[1], sys.argv[2]
doc = json.load(sys.stdin)
base = os.path.join(root, "bundles", ".data")
chunks, files, trees = (os.path.join(base, d) for d in ("chunks", "files", "trees"))
for d in (chunks, files, trees, os.path.join(base, "fetch")):
    os.makedirs(d, exist_ok=True)
tree = os.path.join(trees, doc["tree"])
def digest(path, out=None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            if out is not None:
                out.write(block)
    return h.hexdigest()
if verb == "need":
    missing = []
    if not os.path.isdir(tree):
        for e in doc["entries"]:
            if not os.path.isfile(os.path.join(files, e["sha256"])):
                missing += [c for c in e["chunks"] if not os.path.isfile(os.path.join(chunks, c))]
    print(json.dumps({"tree": os.path.isdir(tree), "missing": sorted(set(missing))}))
    sys.exit(0)
if verb == "fetch":
    import urllib.error, urllib.request
    e = doc["entries"][0]
    final = os.path.join(files, e["sha256"])
    if not os.path.isfile(final):
        part = os.path.join(base, "fetch", e["sha256"] + ".part")
        have = os.path.getsize(part) if os.path.exists(part) else 0
        req = urllib.request.Request(doc["source"], headers={"Range": "bytes=%d-" % have} if have else {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r, \
                    open(part, "ab" if have and r.status == 206 else "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except urllib.error.HTTPError as err:
            if not (have and err.code == 416):  # 416: the part holds every byte (a fetch died before its check)
                raise
        if digest(part) != e["sha256"]:
            os.unlink(part)
            sys.exit("%s: the download's sha256 is not %s" % (doc["source"], e["sha256"]))
        os.chmod(part, 0o444)
        os.rename(part, final)
bad, made = [], []
def undo():  # a failed build leaves nothing it assembled, nor the chunks it was sent
    for path in made:
        os.unlink(path)
    for e in doc["entries"]:
        for c in e["chunks"]:
            if os.path.exists(os.path.join(chunks, c)):
                os.unlink(os.path.join(chunks, c))
try:
    for e in doc["entries"]:
        final = os.path.join(files, e["sha256"])
        if os.path.isfile(final) or verb == "fetch":
            continue
        tmp = "%s.tmp.%d" % (final, os.getpid())
        try:
            with open(tmp, "wb") as out:
                h = hashlib.sha256()
                for c in e["chunks"]:
                    with open(os.path.join(chunks, c), "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):
                            h.update(block)
                            out.write(block)
        except BaseException:
            os.unlink(tmp)
            raise
        if h.hexdigest() != e["sha256"]:
            os.unlink(tmp)
            bad.append(e["rel"])
            continue
        os.chmod(tmp, 0o444)
        os.rename(tmp, final)
        made.append(final)
except BaseException:
    undo()
    raise
if bad:
    undo()
    sys.exit("these files changed while they were synced: %s; submit again" % ", ".join(bad[:5]))
if not os.path.isdir(tree):
    tmp = "%s.tmp.%d" % (tree, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for e in doc["entries"]:
            dst = os.path.join(tmp, e["rel"])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.link(os.path.join(files, e["sha256"]), dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        undo()
        raise
    os.makedirs(tmp, exist_ok=True)
    for top, dirs, _ in os.walk(tmp, topdown=False):
        for d in dirs:
            os.chmod(os.path.join(top, d), 0o555)
    os.rename(tmp, tree)
    os.chmod(tree, 0o555)
for e in doc["entries"]:
    for c in e["chunks"]:
        if os.path.exists(os.path.join(chunks, c)):
            os.unlink(os.path.join(chunks, c))
print(json.dumps({"tree": True}))
"""


class Answer(BaseModel):
    """The host's answer to ``DATA``: is the tree there, which chunks does it lack (need)."""

    model_config = ConfigDict(extra="ignore")

    tree: bool = False
    missing: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(default_factory=list,
                                                                            max_length=10_000_000)


def _call(host: Host, verb: str, request: dict[str, Any]) -> Answer:
    name = request["name"]
    got = host.run([host.python, "-I", "-c", DATA, host.root, verb], stdin=json.dumps(request).encode(),
                   timeout=TIMEOUT_S)
    if got.exit_code != 0:
        why = clean_line(got.stderr.strip().splitlines()[-1] if got.stderr.strip() else f"exit {got.exit_code}")
        raise HostError(host.name, f"data {name}: {verb} failed: {why[:300]}")
    try:
        return Answer.model_validate_json((got.stdout.strip().splitlines() or ["{}"])[-1])
    except ValidationError as exc:
        raise HostError(host.name, f"data {name}: {verb}: unreadable answer") from exc


def clean_line(text: str) -> str:
    """Host text for a message: control characters out."""
    return "".join(c if c.isprintable() else " " for c in text)


def _pieces(m: Manifest) -> dict[str, tuple[str, int, int]]:
    """{chunk sha256: (local file, offset, size)}: where each chunk's bytes are here."""
    out: dict[str, tuple[str, int, int]] = {}
    for e in m.entries:
        path = Path(m.source) / e.rel if m.kind == "dir" else Path(m.source)
        for i, c in enumerate(e.chunks):
            out.setdefault(c, (str(path), i * CHUNK, min(CHUNK, e.size - i * CHUNK)))
    return out


def _upload(host: Host, m: Manifest, missing: list[str]) -> int:
    pieces = _pieces(m)
    moved = 0
    total = sum(pieces[c][2] for c in missing if c in pieces)
    with transfer_progress.track(f"data {m.name} -> {host.name}", total) as shown, \
            tempfile.TemporaryDirectory(prefix="gpuq-data-") as scratch:
        for c in missing:
            if c not in pieces:
                raise HostError(host.name, f"data {m.name}: the host asked for an unknown chunk {c[:12]}")
            path, offset, size = pieces[c]
            part = Path(scratch) / c
            with open(path, "rb") as src, open(part, "wb") as dst:
                src.seek(offset)
                dst.write(src.read(size))
            host.put(part, host.path(protocol.BUNDLES_DIR, ".data", "chunks", c))
            part.unlink()
            moved += size
            shown(moved)
    return moved


def sync(host: Host, m: Manifest, home: Path, *, record: bool = True) -> int:
    """Make tree ``m.tree`` present on ``host``; returns the bytes moved (0 when it was there).
    ``record``: log it in syncs.jsonl and held/<host>.json (not for a smoke run's private root)."""
    dumped = m.model_dump(mode="json")
    wire = {k: dumped[k] for k in ("name", "tree", "kind", "entries")}
    moved = 0
    if m.kind == "url":
        if not _call(host, "need", {**wire, "entries": []}).tree:
            _call(host, "fetch", {**wire, "source": m.source})
    else:
        need = _call(host, "need", wire)
        if not need.tree:
            moved = _upload(host, m, need.missing)
            _call(host, "build", wire)
    if record:
        _record(home, host.name, m, moved)
    return moved


def _record(home: Path, host: str, m: Manifest, moved: int) -> None:
    base = data_dir(home)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "syncs.jsonl", "a") as f:
        f.write(json.dumps({"host": host, "name": m.name, "tree": m.tree, "moved": moved,
                            "bytes": m.bytes, "at": time.time()}) + "\n")
    held_path = base / "held" / f"{host}.json"
    held_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        held = json.loads(held_path.read_text())
    except (OSError, ValueError):
        held = {}
    held = held if isinstance(held, dict) else {}
    held[m.tree] = {"name": m.name, "bytes": m.bytes, "files": len(m.entries), "kind": m.kind, "at": time.time()}
    tmp = held_path.with_name(f".{held_path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(held, sort_keys=True))
    os.replace(tmp, held_path)


def held(home: Path, host: str) -> list[dict[str, Any]]:
    """What ``host`` holds of ``[data]``, as recorded by the syncs: [{"tree", "name", "bytes", "files"}]."""
    try:
        doc = json.loads((data_dir(home) / "held" / f"{host}.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict):
        return []
    return [{"tree": k, **v} for k, v in sorted(doc.items(), key=lambda kv: str(kv[1].get("name")))
            if isinstance(v, dict)]


def sync_data(host: Host, refs: Sequence[Mapping[str, DataRef]], home: Path, *, record: bool = True) -> int:
    """Sync every tree the specs' ``run.data`` sections (``refs``) name to ``host`` (each once); the bytes moved."""
    from orchestrator.queue.datasets import manifest

    trees: dict[str, str] = {}
    for data in refs:
        for name, ref in data.items():
            trees.setdefault(ref.tree, name)
    moved = 0
    for tree, name in trees.items():
        m = manifest(home, tree)
        if m is None:
            raise HostError(host.name, f"data {name}: its manifest {tree[:12]} is not in "
                            f"{data_dir(home)}/manifests; submit the sweep again")
        moved += sync(host, m, home, record=record)
    return moved
