"""What a pulled copy must be before gpuq calls it verified (docs/results.md).

Pure checks on local files; no host, no ledger.  A manifest (``MANIFEST.json``, schema
``gpuq.manifest/1``, written by the host agent's ``manifest`` verb) lists each file of a job's
results as a relative POSIX path, a size and a sha256.  :func:`verify_copy` holds a local copy to
it: the file set equals the manifest's exactly (missing and unexpected files both fail; the
manifest itself, the verification record and ``*.tmp`` are bookkeeping), then sizes, then sha256,
then content: metrics and summary parse, and the best checkpoint is a sound torch archive.

The controller never imports torch, so a checkpoint is checked with the stdlib, by the agent's own
``gpuq_ckptcheck.py`` (loaded by path, agent_modules.py): the zip archive opens, every member passes
its CRC, its ``data.pkl`` is a complete pickle of a dict whose globals are torch's tensor-rebuild and
storage names (what ``torch.load(weights_only=True)`` accepts for a state dict), and every storage
it names is in the archive.  The host's wrapper ran the same check on the same bytes (the agent
refuses to manifest a best.pt whose sha256 differs from the one the wrapper recorded).  Nothing is
ever unpickled here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import host_documents
from orchestrator.core import protocol
from orchestrator.core.agent_modules import ckptcheck_module

PULL_VERIFIED = "PULL_VERIFIED.json"
PULL_VERIFIED_SCHEMA = "gpuq.pull-verified/1"
PROVENANCE = "PROVENANCE.txt"
MANIFEST_INCOMING = protocol.JOB_MANIFEST_FILE + ".incoming"
IGNORED_TOP = frozenset({protocol.JOB_MANIFEST_FILE, MANIFEST_INCOMING, PULL_VERIFIED})  # bookkeeping, not results
CHUNK = 1 << 20

@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative to jobs/<job_id>/, POSIX
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    job_id: str
    attempt: int
    queue_id: str
    files: tuple[ManifestEntry, ...]
    sha256: str  # of the manifest bytes as fetched

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def same_files(self, other: Manifest) -> bool:
        return self.job_id == other.job_id and self.attempt == other.attempt and self.files == other.files


@dataclass(frozen=True)
class Streamed:
    """A file's sha256 taken from the bytes as they were written (``Host.get``'s digest), bound to the
    file's identity then: trusted only while the file is still that inode, size and mtime."""

    sha256: str
    size: int
    inode: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, sha256: str) -> Streamed:
        st = path.stat()
        return cls(sha256, st.st_size, st.st_ino, st.st_mtime_ns)

    def holds_for(self, path: Path) -> bool:
        st = path.stat()
        return (st.st_size, st.st_ino, st.st_mtime_ns) == (self.size, self.inode, self.mtime_ns)


@dataclass(frozen=True)
class Problem:
    """A verification failure: ``slug`` names the quarantine dir, ``detail`` is for people."""

    slug: str
    detail: str


def _bookkeeping(path: str) -> bool:
    """A path gpuq itself writes beside a pulled copy (never a result a manifest may list)."""
    return len(path.split("/")) == 1 and path in IGNORED_TOP | {PROVENANCE}


# the file each finalize check of a job (its sweep's ``verify``) makes part of its results
VERIFY_FILES = {"metrics": f"{protocol.RESULT_DIR}/{protocol.METRICS_FILE}",
                "best_ckpt": f"{protocol.CKPT_DIR}/{protocol.BEST_CKPT}"}
PAYLOAD_REQUIRED = tuple(VERIFY_FILES.values())


def required_files(verify: Sequence[str]) -> tuple[str, ...]:
    """What a manifest must list for a job whose sweep checks ``verify`` ("metrics", "best_ckpt"); a
    project's own trainer (docs/your-project.md) usually checks nothing beyond its exit record."""
    return tuple(VERIFY_FILES[v] for v in verify if v in VERIFY_FILES)


def parse_manifest(raw: bytes, *, job_id: str, required: Sequence[str] = PAYLOAD_REQUIRED) -> Manifest:
    """Validate a fetched MANIFEST.json (its shape: ``host_documents.JobManifest``); ValueError says what is
    wrong with it.  Besides ``required``, every manifest lists its attempt's exit record."""
    doc = host_documents.read_job_manifest(raw)
    if doc.job_id != job_id:
        raise ValueError(f"manifest is for job {doc.job_id!r}")
    entries = [ManifestEntry(f.path, f.bytes, f.sha256) for f in doc.files or ()]
    for entry in entries:
        if _bookkeeping(entry.path):
            raise ValueError(f"manifest lists an unsafe path: {entry.path!r}")
    paths = [e.path for e in entries]
    if not entries:
        raise ValueError("manifest lists no files")
    if len(set(paths)) != len(paths):
        raise ValueError("manifest lists a path twice")
    exit_record = f"{protocol.ATTEMPTS_DIR}/{doc.attempt}/{protocol.EXIT_FILE}"
    for need in (*required, exit_record):
        if need not in paths:
            raise ValueError(f"manifest lacks {need}")
    sha = hashlib.sha256(raw).hexdigest()
    return Manifest(job_id, doc.attempt, doc.queue_id or "", tuple(sorted(entries, key=lambda e: e.path)), sha)


def read_manifest(path: Path, job_id: str, required: Sequence[str] = PAYLOAD_REQUIRED) -> Manifest | None:
    try:
        return parse_manifest(path.read_bytes(), job_id=job_id, required=required)
    except (OSError, ValueError):
        return None


def file_sha256(path: Path) -> str:
    """The sha256 of a local file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _local_files(directory: Path) -> tuple[dict[str, Path], list[str]]:
    """Regular files under ``directory`` by relative POSIX path (bookkeeping and *.tmp left out),
    and the relative paths of anything else (symlinks, devices) found there."""
    files: dict[str, Path] = {}
    odd: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                odd.append((base / name).relative_to(directory).as_posix())
        for name in sorted(filenames):
            full = base / name
            rel = full.relative_to(directory).as_posix()
            if name.endswith(".tmp") or rel in IGNORED_TOP:
                continue
            if full.is_symlink() or not full.is_file():
                odd.append(rel)
            else:
                files[rel] = full
    return files, odd


def pickle_problem(data: bytes) -> str | None:
    """Why a torch ``data.pkl`` would not load with weights_only=True as a dict; None when it would
    (opcodes only, nothing unpickled: the agent's gpuq_ckptcheck.py)."""
    why: str | None = ckptcheck_module().pickle_problem(data)
    return why


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a sound torch checkpoint (zip archive of a state dict); None when it is
    (the agent's gpuq_ckptcheck.py: the wrapper runs the same check on the host)."""
    why: str | None = ckptcheck_module().checkpoint_problem(str(path))
    return why


def _metrics_problem(path: Path, rel: str) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{rel} is unreadable: {exc}"
    if rel.endswith(".jsonl"):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            return f"{rel} is empty"
        for number, line in enumerate(lines, 1):
            try:
                json.loads(line)
            except json.JSONDecodeError:
                return f"{rel} line {number} is not JSON"
        return None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{rel} is not JSON: {exc}"
    return None


def _sha256_of(path: Path, streamed: Streamed | None) -> str:
    if streamed is not None and streamed.holds_for(path):
        return streamed.sha256
    return file_sha256(path)


def verify_copy(directory: Path, manifest: Manifest, streamed: Mapping[str, Streamed] | None = None) -> Problem | None:
    """Check a local copy against its manifest; the first failure, or None when everything matches.

    ``streamed``: sha256s taken as the copy was written (by relative path); a file not in it, or changed
    since, is read again."""
    files, odd = _local_files(directory)
    want = {e.path: e for e in manifest.files}
    if odd:
        return Problem("unexpected-file", f"not a regular file: {', '.join(odd[:3])}")
    missing = sorted(set(want) - set(files))
    if missing:
        return Problem("missing-file", f"missing {len(missing)} file(s): {', '.join(missing[:3])}")
    extra = sorted(set(files) - set(want))
    if extra:
        return Problem("unexpected-file", f"not in the manifest: {', '.join(extra[:3])}")
    for entry in manifest.files:
        size = files[entry.path].stat().st_size
        if size != entry.size:
            return Problem("size-mismatch", f"{entry.path} has {size} bytes, the manifest says {entry.size}")
    for entry in manifest.files:
        sha = _sha256_of(files[entry.path], (streamed or {}).get(entry.path))
        if sha != entry.sha256:
            return Problem("sha256-mismatch", f"{entry.path} has sha256 {sha[:12]}, the manifest says "
                           f"{entry.sha256[:12]}")
    for entry in manifest.files:
        if entry.path.startswith(f"{protocol.CKPT_DIR}/") and entry.path.endswith(".pt"):
            why = checkpoint_problem(files[entry.path])
            if why:
                return Problem("bad-checkpoint", f"{entry.path}: {why}")
        if entry.path in (f"{protocol.RESULT_DIR}/{protocol.METRICS_FILE}",
                          f"{protocol.RESULT_DIR}/{protocol.SUMMARY_FILE}"):
            why = _metrics_problem(files[entry.path], entry.path)
            if why:
                return Problem("bad-metrics", why)
    return None


SHOWN_CHANGES = 8  # files a refusal names (a count says how many more)


def end_record_changes(manifest: Manifest, recorded: Mapping[str, tuple[int, str]]) -> list[str]:
    """Each file that is not as the attempt's end record has it (``recorded``: path -> (bytes, sha256), as
    the ledger kept it when the attempt ended, the record itself among them), in path order:
    ``"<path> (sha256 <now>, recorded <then>)"``, ``"<path> (new)"`` or ``"<path> (gone)"``.  The
    attempt's log and exit record are evidence, not results: the end record is written before them."""
    evidence = {f"{protocol.ATTEMPTS_DIR}/{manifest.attempt}/{name}" for name in (protocol.JOB_LOG, protocol.EXIT_FILE)}
    listed = {e.path: (e.size, e.sha256) for e in manifest.files if e.path not in evidence}
    changes = []
    for path in sorted(set(listed) | set(recorded)):
        now, then = listed.get(path), recorded.get(path)
        if now is None:
            changes.append(f"{path} (gone)")
        elif then is None:
            changes.append(f"{path} (new)")
        elif now != then:
            changes.append(f"{path} (sha256 {now[1][:12]}, recorded {then[1][:12] or 'unreadable'})")
    return changes


def read_verified_record(directory: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((directory / PULL_VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
