"""``[data]`` in gpuq.toml: named datasets synced once per host, content-addressed, outside the bundle
(docs/your-project.md, "Data").

```toml
[data]
shakespeare = "data/shakespeare"                                  # a directory or file of the repository
weights = { url = "https://example.org/w.bin", sha256 = "<hex>" }  # fetched by the host, verified
```

A local entry must stay inside the repository that holds gpuq.toml (as ``[run] project``): a cloned
project's gpuq.toml cannot choose your other files.  Symlinks inside it are refused (one could
point anywhere).  An https entry must carry the file's sha256; the host fetches and verifies it.

Each entry becomes a *tree*: a manifest of (path, size, sha256, chunk sha256s) whose digest is the
tree id, stored in ``$GPUQ_HOME/data/manifests/<tree>.json`` with where its bytes are here.  Hashes
are cached by (path, size, mtime, inode) in ``$GPUQ_HOME/data/hashes.json`` so a second sweep with
the same data hashes nothing.  The sweep's ``[run]`` JSON carries ``data: {NAME: {"tree", "file"}}``;
the hosts never see a local path.  ``transfer/datasync.py`` moves the bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.core.config import tomllib
from orchestrator.core.errors import ConfigError

TABLE = "data"
CHUNK = 16 << 20  # bytes: the unit of transfer and of resuming a sync
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHA_RE = re.compile(r"[0-9a-f]{64}")
MAX_URL = 2000


class Entry(BaseModel):
    """One file of a tree."""

    model_config = ConfigDict(frozen=True)

    rel: str
    size: int
    sha256: str
    chunks: tuple[str, ...] = ()


class Manifest(BaseModel):
    """One ``[data]`` entry as synced: its tree id, its files, and (here only) where they are."""

    model_config = ConfigDict(frozen=True)

    name: str
    tree: str
    kind: str  # "dir" | "file" | "url"
    source: str  # the local path (never sent to a host) or the URL
    entries: tuple[Entry, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def file(self) -> str:
        """The file's name inside its tree for a single file or URL; "" for a directory."""
        return self.entries[0].rel if self.kind != "dir" and self.entries else ""


def data_dir(home: Path) -> Path:
    return home / "data"


def load_data(toml_path: Path, repo: Path, home: Path) -> list[Manifest]:
    """The ``[data]`` table of ``toml_path`` hashed into manifests (saved under ``$GPUQ_HOME/data``);
    [] without one.  ConfigError (one line naming the file and the key) for any problem."""
    try:
        table = tomllib.loads(toml_path.read_text(encoding="utf-8")).get(TABLE)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []  # load_run reports an unreadable gpuq.toml
    if table is None:
        return []
    if not isinstance(table, dict):
        raise ConfigError(f"{toml_path}: [data] must be a table of NAME = \"path\" or NAME = {{url, sha256}}")
    cache = _HashCache(data_dir(home) / "hashes.json")
    out = []
    for name, value in table.items():
        if not NAME_RE.fullmatch(name):
            raise ConfigError(f"{toml_path}: [data] {name!r}: a name is letters, digits and _ (it becomes "
                              "GPUQ_DATA_<NAME> and {data.<name>})")
        if isinstance(value, str):
            out.append(_local(toml_path, repo, name, value, cache))
        elif isinstance(value, dict):
            out.append(_url(toml_path, name, value))
        else:
            raise ConfigError(f"{toml_path}: [data] {name}: give a path inside the repository or "
                              "{ url = \"https://...\", sha256 = \"...\" }")
    cache.save()
    manifests = data_dir(home) / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    for m in out:
        path = manifests / f"{m.tree}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(m.model_dump_json())
        os.replace(tmp, path)
    return out


def wire(manifests: list[Manifest]) -> dict[str, dict[str, str]]:
    """What the sweep records and the hosts get: {NAME: {"tree", "file"}}; never a local path."""
    return {m.name: {"tree": m.tree, "file": m.file} for m in manifests}


def manifest(home: Path, tree: str) -> Manifest | None:
    if not SHA_RE.fullmatch(tree):
        return None
    try:
        return Manifest.model_validate_json((data_dir(home) / "manifests" / f"{tree}.json").read_text())
    except (OSError, ValueError):
        return None


def _url(toml_path: Path, name: str, value: dict[str, Any]) -> Manifest:
    url, sha = value.get("url"), value.get("sha256")
    extra = sorted(set(value) - {"url", "sha256"})
    if extra:
        raise ConfigError(f"{toml_path}: [data] {name}: unknown key {extra[0]!r} (allowed: url, sha256)")
    if not isinstance(url, str) or not url.startswith("https://") or len(url) > MAX_URL \
            or any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigError(f"{toml_path}: [data] {name}: url must be an https:// URL")
    if not isinstance(sha, str) or not SHA_RE.fullmatch(sha.lower()):
        raise ConfigError(f"{toml_path}: [data] {name}: an https URL needs sha256 = \"<64 hex>\" of the file "
                          "(the host verifies what it fetched against it)")
    base = re.sub(r"[^A-Za-z0-9._-]", "_", url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]) or name
    base = base if base not in (".", "..") else name
    entry = Entry(rel=base[:200], size=0, sha256=sha.lower())
    tree = _digest({"kind": "url", "url": url, "entries": [[entry.rel, entry.sha256]]})
    return Manifest(name=name, tree=tree, kind="url", source=url, entries=(entry,))


def _local(toml_path: Path, repo: Path, name: str, value: str, cache: _HashCache) -> Manifest:
    raw = (toml_path.parent / value)
    if raw.is_symlink():
        raise ConfigError(f"{toml_path}: [data] {name}: {value!r} is a symlink; name the real path inside "
                          "the repository")
    path = raw.resolve()
    if not path.is_relative_to(repo.resolve()):
        raise ConfigError(f"{toml_path}: [data] {name}: {value!r} is {path}, outside the repository {repo}; "
                          "data must stay inside the repository that holds gpuq.toml")
    if not path.exists():
        raise ConfigError(f"{toml_path}: [data] {name}: {path} does not exist")
    if path.is_file():
        entries = [_entry(path, path.name, cache)]
        kind = "file"
    else:
        entries = []
        for top, dirs, files in os.walk(path):
            dirs.sort()
            for leaf in sorted(dirs + files):
                full = Path(top) / leaf
                rel = full.relative_to(path).as_posix()
                if full.is_symlink():
                    raise ConfigError(f"{toml_path}: [data] {name}: {rel} is a symlink inside {path}; gpuq syncs "
                                      "real files only")
                if leaf in files:
                    if not full.is_file():
                        raise ConfigError(f"{toml_path}: [data] {name}: {rel} is not a regular file")
                    entries.append(_entry(full, rel, cache))
        kind = "dir"
    tree = _digest({"kind": kind, "entries": [[e.rel, e.size, e.sha256] for e in entries]})
    return Manifest(name=name, tree=tree, kind=kind, source=str(path), entries=tuple(entries))


def _digest(content: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _entry(path: Path, rel: str, cache: _HashCache) -> Entry:
    st = path.stat()
    key = [st.st_size, st.st_mtime_ns, st.st_ino]
    hit = cache.get(str(path), key)
    if hit is None:
        whole = hashlib.sha256()
        chunks = []
        with open(path, "rb") as f:
            while True:
                block = f.read(CHUNK)
                if not block:
                    break
                whole.update(block)
                chunks.append(hashlib.sha256(block).hexdigest())
        hit = (whole.hexdigest(), chunks)
        cache.put(str(path), key, hit)
    return Entry(rel=rel, size=st.st_size, sha256=hit[0], chunks=tuple(hit[1]))


class _HashCache:
    """{path: [size, mtime_ns, inode, sha256, [chunk sha256s]]}: a file unchanged since is not read again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dirty = False
        try:
            table = json.loads(path.read_text())
            self.table: dict[str, Any] = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            self.table = {}

    def get(self, key: str, stat: list[int]) -> tuple[str, list[str]] | None:
        got = self.table.get(key)
        if isinstance(got, list) and len(got) == 5 and got[:3] == stat:
            return str(got[3]), [str(c) for c in got[4]]
        return None

    def put(self, key: str, stat: list[int], value: tuple[str, list[str]]) -> None:
        self.table[key] = [*stat, value[0], value[1]]
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.table))
        os.replace(tmp, self.path)
