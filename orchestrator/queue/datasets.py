"""``[data]`` in gpuq.toml: named datasets synced once per host, content-addressed, outside the bundle
(docs/your-project.md, "Data").

```toml
[data]
shakespeare = "data/shakespeare"                                  # a directory or file of the repository
weights = { url = "https://example.org/w.bin", sha256 = "<hex>" }  # fetched by the host, verified
```

A local entry must stay inside the repository that holds gpuq.toml and is held to ``[run] project``'s
containment (``config.refused_root``: never ``/``, your home directory, nor a directory holding
``$GPUQ_HOME`` or inside it): a cloned project's gpuq.toml cannot choose your other files.  It goes
through the bundle's own rules (``TreeRules``: the caller passes ``bundle.tree_rules``): an entry in VCS
metadata or credential-like by path is refused, and inside a directory the bundle's filter leaves out
what it leaves out of a project (VCS metadata and caches, credential-like paths, named in ``left_out``,
and what the directory's own .gpuqignore excludes).  Symlinks inside it are refused (one could point
anywhere).  An https entry must carry the file's sha256; the host fetches and verifies it.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from orchestrator.core.config import refused_root, tomllib
from orchestrator.core.errors import ConfigError

TABLE = "data"
CHUNK = 16 << 20  # bytes: the unit of transfer and of resuming a sync
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHA_RE = re.compile(r"[0-9a-f]{64}")
MAX_URL = 2000


class TreeRules(Protocol):
    """The bundle's rules for one tree (``bundle.tree_rules``, which the caller passes in: the bundle is
    the controller's side of the agent, a layer above ``[data]``).  ``verdict`` says "keep", "ignored",
    "secret" or "output" of a path (a directory's ends with "/")."""

    def verdict(self, rel: str) -> str: ...

    def denied(self, rel: str) -> bool: ...

    def opted_in(self, rel: str) -> bool: ...

    def excluded_name(self, name: str, *, is_dir: bool) -> bool: ...


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
    left_out: tuple[str, ...] = ()  # credential-like paths of a directory that stay here (the bundle's rules)
    opted_in: tuple[str, ...] = ()  # credential-like paths that travel because a `!` line of .gpuqignore asks

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def file(self) -> str:
        """The file's name inside its tree for a single file or URL; "" for a directory."""
        return self.entries[0].rel if self.kind != "dir" and self.entries else ""


def data_dir(home: Path) -> Path:
    return home / "data"


def load_data(toml_path: Path, repo: Path, home: Path, rules: Callable[[Path], TreeRules]) -> list[Manifest]:
    """The ``[data]`` table of ``toml_path`` hashed into manifests (saved under ``$GPUQ_HOME/data``), each
    local entry through ``rules`` (``bundle.tree_rules``) of its repository and of its directory; [] without
    one.  ConfigError (one line naming the file and the key) for any problem."""
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
            out.append(_local(toml_path, repo, home, name, value, cache, rules))
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


def leaving(manifests: list[Manifest], toml_path: Path) -> list[str]:
    """Lines for ``submit`` and ``--dry-run``: the trees that leave this machine, the credential-like paths
    their directories hold that stay here, and any that a ``!`` line of .gpuqignore sends anyway."""
    if not manifests:
        return []
    trees = ", ".join(f"{m.name} = {m.source} ({len(m.entries)} file(s), {m.bytes / 1e6:.1f} MB)" if m.kind != "url"
                      else f"{m.name} = {m.source} (fetched by the host)" for m in manifests)
    lines = [f"sending these [data] trees to the hosts ([data] in {toml_path}): {trees}"]
    for m in manifests:
        if m.left_out:
            lines.append(f"left out of [data] {m.name} (credential-like paths; a `!path` line in {m.source}/"
                         ".gpuqignore ships one): " + _some(m.left_out))
        if m.opted_in:
            lines.append(f"sending credential-like paths in [data] {m.name}, because a `!` line of .gpuqignore "
                         f"opts them in: {_some(m.opted_in)}")
    return lines


def _some(paths: tuple[str, ...]) -> str:
    more = len(paths) - 5
    return ", ".join(paths[:5]) + (f" and {more} more" if more > 0 else "")


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


def _local(toml_path: Path, repo: Path, home: Path, name: str, value: str, cache: _HashCache,
           rules: Callable[[Path], TreeRules]) -> Manifest:
    raw = (toml_path.parent / value)
    if raw.is_symlink():
        raise ConfigError(f"{toml_path}: [data] {name}: {value!r} is a symlink; name the real path inside "
                          "the repository")
    path = raw.resolve()
    repo = repo.resolve()
    if not path.is_relative_to(repo):
        raise ConfigError(f"{toml_path}: [data] {name}: {value!r} is {path}, outside the repository {repo}; "
                          "data must stay inside the repository that holds gpuq.toml")
    why = refused_root(path, home)
    if why:
        raise ConfigError(f"{toml_path}: [data] {name}: {value!r} ({path}) {why}; name the data's own "
                          "directory or file")
    if not path.exists():
        raise ConfigError(f"{toml_path}: [data] {name}: {path} does not exist")
    rel = path.relative_to(repo).as_posix()
    left_out: list[str] = []
    opted_in = [rel] if _check_place(toml_path, name, value, rel, rules(repo), path.is_dir()) else []
    if path.is_file():
        entries = [_entry(path, path.name, cache)]
        kind = "file"
    else:
        entries = _walk(toml_path, name, path, cache, rules(path), left_out, opted_in)
        kind = "dir"
    tree = _digest({"kind": kind, "entries": [[e.rel, e.size, e.sha256] for e in entries]})
    return Manifest(name=name, tree=tree, kind=kind, source=str(path), entries=tuple(entries),
                    left_out=tuple(left_out), opted_in=tuple(opted_in))


def _check_place(toml_path: Path, name: str, value: str, rel: str, rules: TreeRules, is_dir: bool) -> bool:
    """The entry itself (``rel``, from the repository root) and every directory above it pass the bundle's
    rules: no VCS metadata, cache or environment, nothing credential-like (a ``!`` line of the repository's
    .gpuqignore opts one in: True then).  Being ignored by .gpuqignore is fine: that is how data stays out of
    the bundle."""
    if rel == ".":
        return False
    opted = False
    parts = rel.split("/")
    for i, part in enumerate(parts):
        sub = "/".join(parts[:i + 1])
        folder = is_dir or i < len(parts) - 1
        if folder and rules.excluded_name(part, is_dir=True):
            raise ConfigError(f"{toml_path}: [data] {name}: {value!r} is in {sub}/, which gpuq never sends "
                              "(VCS metadata, caches, environments)")
        if rules.denied(sub + "/" if folder else sub):
            raise ConfigError(f"{toml_path}: [data] {name}: {value!r} is credential-like ({sub}); gpuq never "
                              f"sends it (a `!{sub}` line in the repository's .gpuqignore ships it)")
        opted = opted or rules.opted_in(sub + "/" if folder else sub)
    return opted


def _walk(toml_path: Path, name: str, path: Path, cache: _HashCache, rules: TreeRules, left_out: list[str],
          opted_in: list[str]) -> list[Entry]:
    """The files of the directory ``path`` that travel, through the bundle's rules for a tree rooted there
    (its own .gpuqignore); the credential-like paths left out go into ``left_out``, the credential-like
    files a ``!`` line sends anyway into ``opted_in``."""
    entries = []
    for top, dirs, files in os.walk(path):
        here = Path(top)
        rel_dir = here.relative_to(path).as_posix()
        kept = []
        for leaf in sorted(dirs + files):
            full = here / leaf
            rel = leaf if rel_dir == "." else f"{rel_dir}/{leaf}"
            folder = leaf in dirs
            shown = rel + "/" if folder else rel
            verdict = "tool" if rules.excluded_name(leaf, is_dir=folder) else rules.verdict(shown)
            if verdict == "secret":
                left_out.append(shown)
            if verdict not in ("keep", "output"):  # a dataset may hold a directory named runs/ or outputs/
                continue
            if full.is_symlink():
                raise ConfigError(f"{toml_path}: [data] {name}: {rel} is a symlink inside {path}; gpuq syncs "
                                  "real files only")
            if folder:
                kept.append(leaf)
            elif not full.is_file():
                raise ConfigError(f"{toml_path}: [data] {name}: {rel} is not a regular file")
            else:
                entries.append(_entry(full, rel, cache))
                if rules.opted_in(rel):
                    opted_in.append(rel)
        dirs[:] = kept
    return entries


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
