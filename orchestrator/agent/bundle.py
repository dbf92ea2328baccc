"""Deterministic, content-addressed bundle of the payload and the user's project (docs/host-protocol.md).

Layout inside the tarball (and under ``bundles/<sha>/`` on a host)::

    payload/   the training payload and the host agent (from gpuq itself: PAYLOAD_PARTS only)
    workdir/   the project: the queue file's directory, or ``[run] project``
    MANIFEST.json   every file's path, bytes, sha256

The tarball is byte-for-byte reproducible (sorted entries, zeroed times and owners, normalised
modes), so its sha256 names its content: submitting an unchanged project produces the same sha and
pushes nothing.  It is written to the cache as a stream (a large project never sits in memory).

What never travels (docs/security.md): VCS metadata and caches; credentials matched by path with
gitignore semantics (``DEFAULT_DENY``: ``.env``, keys, ``.git-credentials``, ``.docker/config.json``,
``.kube/config``, cloud and Hugging Face tokens, ``.ssh/``, shell histories, ...); and whatever the
project's ``.gpuqignore`` excludes (gitignore syntax through ``pathspec``: ``/data``, ``data/``,
``**/*.ckpt``, ``!keep.me``).  A ``!`` line in ``.gpuqignore`` opts a default-denied path back in.
Symlinks that leave the project never travel.  A bundle over ``warn_bytes`` is reported with its
biggest paths; one over ``max_bytes`` is refused before any byte is read.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pathspec

from orchestrator.core import protocol
from orchestrator.core.agent_modules import payload_dir
from orchestrator.core.errors import BundleError, UsageError

IGNORE_FILE = ".gpuqignore"
ALWAYS_EXCLUDED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                        ".venv", "venv", "node_modules", ".gpuq", "gpuq_run", ".ipynb_checkpoints"}
ALWAYS_EXCLUDED_FILES = ("*.pyc", "*.pyo", ".DS_Store", "*.tmp")
# credentials by path, gitignore syntax: a pattern without "/" matches at any depth
DEFAULT_DENY = (
    ".env", ".env.*", ".envrc", "*.pem", "*.key", "id_rsa*", "id_ed25519*", "id_ecdsa*", "id_dsa*", "keys.toml",
    ".netrc", "_netrc", "credentials*", "*.p12", "*.pfx", ".pypirc", "secrets.*", ".git-credentials", ".npmrc",
    ".pgpass", ".my.cnf", "application_default_credentials.json", "service-account*.json", "*-sa-key.json",
    ".ssh/", ".aws/", ".gnupg/", ".azure/", "**/.docker/config.json", "**/.kube/config",
    "**/.config/gcloud/", "**/.cache/huggingface/token", "**/.huggingface/token", "*_history", ".*_history",
    ".*history", "*.kdbx",
)
# what training frameworks write into the working directory: a project's stale local runs, never its code.
# Left out unless a `!name/` line of .gpuqignore asks for one (docs/your-project.md).  Top-level names,
# plus HF Trainer's checkpoint-<N>/ directories at any depth.
FRAMEWORK_OUTPUT_DIRS = ("lightning_logs", "wandb", "outputs", "multirun", "mlruns", "runs", "tb_logs",
                         ".neptune")
FRAMEWORK_OUTPUT_ANYWHERE = re.compile(r"checkpoint-[0-9]+")
WARN_BYTES = 200 * 1024 * 1024
CHUNK = 1 << 20


@dataclass(frozen=True)
class Bundle:
    sha256: str
    path: Path
    files: int
    bytes: int
    skipped_secrets: tuple[str, ...] = field(default_factory=tuple)
    biggest: tuple[tuple[str, int], ...] = field(default_factory=tuple)  # set when over warn_bytes
    skipped_outputs: tuple[str, ...] = field(default_factory=tuple)  # framework output dirs left out
    digests: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (archive name, sha256) of every file


@dataclass(frozen=True)
class _Entry:
    name: str  # archive name
    path: Path
    size: int
    mode: int


class _Filter:
    """Which paths of one tree travel: the default deny list, then ``.gpuqignore`` (its ``!`` lines
    may re-include a denied path)."""

    def __init__(self, root: Path, *, deny: bool) -> None:
        self.deny = pathspec.GitIgnoreSpec.from_lines(DEFAULT_DENY if deny else ())
        self.project = deny  # gpuq's own payload has no project rules
        path = root / IGNORE_FILE
        lines: list[str] = []
        if path.is_file():
            try:
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError as exc:
                raise BundleError(f"{path}: cannot read: {exc.strerror}") from exc
        try:
            self.user = pathspec.GitIgnoreSpec.from_lines(lines)
        except (ValueError, TypeError) as exc:
            raise BundleError(f"{path}: {exc}; fix the pattern (gitignore syntax)") from exc

    def verdict(self, rel: str) -> str:
        """"keep", "ignored" (the user's .gpuqignore), "secret" (the default deny list) or "output" (a
        framework's output directory: ``rel`` ends with "/")."""
        user = self.user.check_file(rel).include
        if user is True:
            return "ignored"
        if user is False:  # a "!" line: the user asked for this path
            return "keep"
        if self.deny.match_file(rel):
            return "secret"
        return "output" if self.project and rel.endswith("/") and framework_output(rel) else "keep"

    def denied(self, rel: str) -> bool:
        """Is ``rel`` credential-like by the deny list (and not opted back in by a ``!`` line)?  Unlike
        ``verdict``, a path the user's ignore lines leave out is still asked about."""
        return self.user.check_file(rel).include is not False and bool(self.deny.match_file(rel))

    def opted_in(self, rel: str) -> bool:
        """Is ``rel`` credential-like by the deny list but asked for by a ``!`` line (so it travels)?"""
        return self.user.check_file(rel).include is False and bool(self.deny.match_file(rel))

    def excluded_name(self, name: str, *, is_dir: bool) -> bool:
        return always_excluded(name, is_dir=is_dir)


def tree_rules(root: Path) -> _Filter:
    """The project rules for a tree rooted at ``root``: the default deny list and ``root/.gpuqignore``.
    ``[data]`` directories pass through these same rules as the bundle's workdir (``datasets.TreeRules``)."""
    return _Filter(root, deny=True)


def always_excluded(name: str, *, is_dir: bool) -> bool:
    """VCS metadata, caches and environments: never in a bundle nor a ``[data]`` tree, whatever the rules say."""
    if is_dir:
        return name in ALWAYS_EXCLUDED_DIRS
    return any(fnmatch.fnmatchcase(name, p) for p in ALWAYS_EXCLUDED_FILES)


def framework_output(rel: str) -> bool:
    """Is ``rel`` (a directory, ending with "/") a training framework's output directory?"""
    parts = rel.rstrip("/").split("/")
    top = len(parts) == 1 and parts[0] in FRAMEWORK_OUTPUT_DIRS
    return top or bool(FRAMEWORK_OUTPUT_ANYWHERE.fullmatch(parts[-1]))


def _walk(root: Path, prefix: str, exclude: set[Path], *, deny: bool,
          outputs: list[str] | None = None) -> tuple[list[_Entry], list[str]]:
    """Files under ``root`` that travel, plus the credential-looking paths left out (and, into
    ``outputs``, the framework output directories left out)."""
    rules = _Filter(root, deny=deny)
    real_root = root.resolve()
    found: list[_Entry] = []
    secrets: list[str] = []
    def unreadable(exc: OSError) -> None:  # a directory the walk cannot list: never left out in silence
        raise UsageError(f"{exc.filename}: cannot read this directory of the project ({exc.strerror}); "
                         f"make it readable or list it in {IGNORE_FILE}; nothing was submitted")

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=unreadable):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            full = here / d
            if always_excluded(d, is_dir=True) or full.is_symlink() or full.resolve() in exclude:
                continue
            verdict = rules.verdict(rel + "/")
            if verdict == "secret":
                secrets.append(f"{prefix}/{rel}/")
            elif verdict == "output" and outputs is not None:
                outputs.append(f"{rel}/")
            elif verdict == "keep":
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            full = here / name
            if always_excluded(name, is_dir=False):
                continue
            verdict = rules.verdict(rel)
            if verdict == "secret":
                secrets.append(f"{prefix}/{rel}")
                continue
            if verdict == "ignored":
                continue
            if full.is_symlink():
                try:
                    target = full.resolve(strict=True)
                except FileNotFoundError:
                    continue  # a dangling link: nothing to ship
                except (OSError, RuntimeError) as exc:  # a symlink loop (ELOOP / RuntimeError), EACCES
                    why = "a symlink loop" if isinstance(exc, RuntimeError) or getattr(exc, "errno", 0) == errno.ELOOP \
                        else f"a symlink that cannot be followed ({getattr(exc, 'strerror', '') or exc})"
                    raise UsageError(f"{full}: {why} in the project; remove it or list it in {IGNORE_FILE}; "
                                     "nothing was submitted") from exc
                if not target.is_file() or not target.is_relative_to(real_root):
                    continue  # symlinks leaving the project never travel
            try:
                st = full.stat()
            except OSError:
                continue
            if full.is_file():
                mode = 0o755 if os.access(full, os.X_OK) else 0o644
                found.append(_Entry(f"{prefix}/{rel}", full, st.st_size, mode))
    return found, secrets


def _info(name: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _HashingReader(io.RawIOBase):
    """Reads a file once for the tarball while hashing it for the manifest."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        self.count += len(data)
        return data


class _HashingWriter(io.RawIOBase):
    """Hashes the tarball as it is written (tarfile asks where it is, never seeks)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.position = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        self.handle.write(data)
        self.position += len(data)
        return len(data)


def _biggest(entries: Iterable[_Entry], n: int = 5) -> tuple[tuple[str, int], ...]:
    ranked = sorted(entries, key=lambda e: (-e.size, e.name))[:n]
    return tuple((e.name.split("/", 1)[1], e.size) for e in ranked)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


PAYLOAD_PARTS = ("agent/", "gpuq_payload/", "train.py")  # what hosts run of gpuq's own payload/ directory


def carried_from_gpuq(name: str) -> bool:
    """Whether a file of gpuq's ``payload/`` goes into ``payload/`` of the bundle: the agent, the trainer
    and its package only; the example's configs, queue.txt and any scratch file there travel only as a
    project's own files (in ``workdir/``, when the example is the project), so editing the demo queue
    never changes another project's bundle."""
    rel = name[len(protocol.BUNDLE_PAYLOAD) + 1:]
    return any(rel == part or (part.endswith("/") and rel.startswith(part)) for part in PAYLOAD_PARTS)


def build_bundle(workdir: Path, cache_dir: Path, *, exclude: tuple[Path, ...] = (),
                 max_bytes: int | None = None, warn_bytes: int = WARN_BYTES) -> Bundle:
    """Build (or reuse) the bundle for the project ``workdir``; returns its sha and cached tarball.
    Raises BundleError naming the biggest paths when the project exceeds ``max_bytes``."""
    excluded = {p.resolve() for p in exclude}
    entries, secrets = _walk(payload_dir(), protocol.BUNDLE_PAYLOAD, excluded, deny=False)
    entries = [e for e in entries if carried_from_gpuq(e.name)]
    outputs: list[str] = []
    work_entries, work_secrets = _walk(workdir, protocol.BUNDLE_WORKDIR, excluded, deny=True, outputs=outputs)
    secrets += work_secrets
    total = sum(e.size for e in work_entries)
    if max_bytes is not None and total > max_bytes:
        listed = ", ".join(f"{rel} ({_mb(size)})" for rel, size in _biggest(work_entries))
        raise BundleError(f"the project {workdir} is {_mb(total)}, over the bundle limit of {_mb(max_bytes)} "
                          f"(bundle_max_mb); biggest: {listed}. Leave data out with {IGNORE_FILE} (gitignore "
                          "syntax, e.g. /data/) and read it on the host, or raise bundle_max_mb")
    entries += work_entries
    entries.sort(key=lambda e: e.name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".bundle.{os.getpid()}.{id(entries)}.tmp"
    manifest: list[dict[str, object]] = []
    try:
        with tmp.open("wb") as out:
            writer = _HashingWriter(out)
            with tarfile.open(fileobj=writer, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for entry in entries:
                    with entry.path.open("rb") as handle:
                        reader = _HashingReader(handle)
                        tar.addfile(_info(entry.name, entry.size, entry.mode), reader)
                        if reader.count != entry.size or handle.read(1):
                            raise BundleError(f"{entry.path} changed while it was being bundled; submit again")
                    manifest.append({"path": entry.name, "bytes": entry.size, "sha256": reader.digest.hexdigest()})
                doc = json.dumps({"files": manifest}, sort_keys=True, indent=1).encode()
                tar.addfile(_info(protocol.BUNDLE_MANIFEST, len(doc), 0o644), io.BytesIO(doc))
        sha = writer.digest.hexdigest()
        target = cache_dir / f"{sha}.tar"
        if target.is_file() and target.stat().st_size == tmp.stat().st_size:
            tmp.unlink()
        else:
            os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot bundle {exc.filename or workdir}: {exc.strerror}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    biggest = _biggest(work_entries) if total > warn_bytes else ()
    return Bundle(sha, target, len(manifest), sum(e.size for e in entries), tuple(secrets), biggest,
                  tuple(outputs), tuple((str(m["path"]), str(m["sha256"])) for m in manifest))
