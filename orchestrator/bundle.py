"""Deterministic, content-addressed bundle of the payload and the user's workdir.

Layout inside the tarball (and under ``bundles/<sha>/`` on a host)::

    payload/   the training payload and the host agent (from gpuq itself)
    workdir/   the directory of the queue file: configs and the user's code
    MANIFEST.json   every file's path, bytes, sha256

The tarball is byte-for-byte reproducible (sorted entries, zeroed times and
owners, normalised modes), so its sha256 names its content: submitting an
unchanged project produces the same sha and pushes nothing.  Secrets and VCS
metadata never enter a bundle; ``.gpuqignore`` (gitignore-like globs, one per
line, in the workdir) excludes more.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import protocol
from orchestrator.errors import BundleError

IGNORE_FILE = ".gpuqignore"
ALWAYS_EXCLUDED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                        ".venv", "venv", "node_modules", ".gpuq", "gpuq_run", ".ipynb_checkpoints"}
SECRET_PATTERNS = (".env", ".env.*", "*.pem", "*.key", "id_rsa*", "id_ed25519*", "id_ecdsa*", "keys.toml",
                   ".netrc", "credentials*", "*.p12", "*.pfx", ".pypirc", "secrets.*")
ALWAYS_EXCLUDED_FILES = ("*.pyc", "*.pyo", ".DS_Store", "*.tmp")
WARN_BYTES = 200 * 1024 * 1024


@dataclass(frozen=True)
class Bundle:
    sha256: str
    path: Path
    files: int
    bytes: int
    skipped_secrets: tuple[str, ...] = field(default_factory=tuple)


def payload_dir() -> Path:
    """The payload shipped with gpuq: a wheel's copy, else the source checkout's."""
    override = os.environ.get("GPUQ_PAYLOAD_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    for candidate in (here / "_payload", here.parent / "payload"):
        if (candidate / protocol.AGENT_ENTRY.split("/", 1)[1]).is_file():
            return candidate
    raise BundleError("the gpuq payload is missing from this installation; reinstall gpuq")


def _ignore_patterns(root: Path) -> list[str]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _matches(rel: str, name: str, patterns: list[str], is_dir: bool) -> bool:
    for pattern in patterns:
        pat = pattern.rstrip("/")
        if pattern.endswith("/") and not is_dir:
            continue
        if "/" in pat.strip("/"):
            if fnmatch.fnmatchcase(rel, pat.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pat):
            return True
    return False


def _walk(root: Path, prefix: str, exclude: set[Path]) -> tuple[list[tuple[str, Path]], list[str]]:
    """Files under ``root`` as (archive name, path), plus the secret-looking names skipped."""
    patterns = _ignore_patterns(root)
    found: list[tuple[str, Path]] = []
    secrets: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            full = here / d
            if d in ALWAYS_EXCLUDED_DIRS or full.resolve() in exclude or full.is_symlink():
                continue
            if _matches(rel, d, patterns, True):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            full = here / name
            if any(fnmatch.fnmatchcase(name, p) for p in SECRET_PATTERNS):
                secrets.append(f"{prefix}/{rel}")
                continue
            if any(fnmatch.fnmatchcase(name, p) for p in ALWAYS_EXCLUDED_FILES) or _matches(rel, name, patterns, False):
                continue
            if full.is_symlink():
                target = full.resolve()
                if not target.is_file() or not target.is_relative_to(root.resolve()):
                    continue  # symlinks leaving the workdir never travel
            if full.is_file():
                found.append((f"{prefix}/{rel}", full))
    return found, secrets


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def build_bundle(workdir: Path, cache_dir: Path, *, exclude: tuple[Path, ...] = ()) -> Bundle:
    """Build (or reuse) the bundle for ``workdir``; returns its sha and cached tarball path."""
    excluded = {p.resolve() for p in exclude}
    entries, secrets = _walk(payload_dir(), protocol.BUNDLE_PAYLOAD, excluded)
    work_entries, work_secrets = _walk(workdir, protocol.BUNDLE_WORKDIR, excluded)
    entries += work_entries
    secrets += work_secrets
    entries.sort(key=lambda item: item[0])
    manifest: list[dict[str, object]] = []
    buffer = io.BytesIO()
    total = 0
    try:
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, path in entries:
                data = path.read_bytes()
                mode = 0o755 if os.access(path, os.X_OK) else 0o644
                _add(tar, name, data, mode)
                manifest.append({"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
                total += len(data)
            doc = json.dumps({"files": manifest}, sort_keys=True, indent=1).encode()
            _add(tar, protocol.BUNDLE_MANIFEST, doc, 0o644)
    except OSError as exc:
        raise BundleError(f"cannot read {exc.filename}: {exc.strerror}") from exc
    blob = buffer.getvalue()
    sha = hashlib.sha256(blob).hexdigest()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"{sha}.tar"
    if not target.is_file() or target.stat().st_size != len(blob):
        tmp = cache_dir / f".{sha}.tar.{os.getpid()}.tmp"
        tmp.write_bytes(blob)
        os.replace(tmp, target)
    return Bundle(sha, target, len(manifest), total, tuple(secrets))
