"""The evidence of failed attempts, brought home verified before a rented host is terminated (docs/results.md).

``gpuq pull`` brings home the results of SUCCEEDED jobs (their manifest lists the final attempt's log
and exit record too).  A failed attempt has no results, but its ``job.log`` and ``exit.json`` (and,
for an attempt killed as stalled, ``stacks.txt``: where each process waited) are the only account of
what went wrong, and they live on the host: before the down-when-done stage (``tick/billing.py``)
gives a machine back, :func:`fetch_evidence` copies them to

    $GPUQ_HOME/results/<sweep>/evidence/<job>/attempts/<n>/{job.log, exit.json, stacks.txt, EVIDENCE_VERIFIED.json}

In one round trip the host hashes every file asked for (size and sha256, by its own Python, links
refused); each file is then copied, hashed here and compared, and the exit record must name the
job and attempt and say the exit code the ledger recorded.  Only then is ``EVIDENCE_VERIFIED.json``
written and the staging dir renamed into place.  A copy that does not match is moved to
``$GPUQ_HOME/quarantine/<job>--a<n>--evidence``, whose evidence copies are counted and pruned, oldest
first (``transfer/quarantine.py``).  A LOST attempt may have left neither file: that is recorded as such
(nothing to keep), not as a failure.  What is copied is bounded by the host's own hashes before a byte
moves: a log or stacks file at most ``MAX_FILE_BYTES``, an exit record (the one file parsed here) at most
``MAX_EXIT_BYTES``; and nothing is copied that would leave this machine less than ``KEEP_FREE_BYTES``
free (a passing failure: the next tick tries again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core import protocol
from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.core.states import AttemptState
from orchestrator.host_documents.framing import ProtocolError, validate
from orchestrator.host_documents.readers import read_file_hashes
from orchestrator.host_documents.results import FileHashes
from orchestrator.host_documents.status import ExitRecord
from orchestrator.hosts.base import Host
from orchestrator.ledger import Attempt, Job, Ledger
from orchestrator.transfer import quarantine
from orchestrator.transfer.durable import fsync_path

EVIDENCE_DIR = "evidence"
EVIDENCE_VERIFIED = "EVIDENCE_VERIFIED.json"
EVIDENCE_SCHEMA = "gpuq.evidence/1"
FILES = (protocol.JOB_LOG, protocol.EXIT_FILE, protocol.STACKS_FILE)  # each only when the host has it
MAX_FILE_BYTES = 1 << 30  # a log bigger than this is not copied (the host is kept, and says why)
MAX_EXIT_BYTES = 1 << 20  # an exit record is a few hundred bytes: a bigger one is not copied, nor parsed
KEEP_FREE_BYTES = 2 << 30  # free space on this machine evidence never copies into (its ledger lives here)
MAX_REPLY_BYTES = 4 << 20

VERIFIED = "verified"
ALREADY = "already verified"
INCOMPLETE = "incomplete"  # the link failed: the next try resumes
UNVERIFIED = "unverified"  # the copy or the host's files do not hold up: a person looks

# Run by the host's Python (-I): size and sha256 of each named regular file, never through a link.
HASH = r"""
import hashlib, json, os, stat, sys
out = {}
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        out[path] = None
        continue
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            out[path] = {"error": "not a regular file"}
            continue
        h, n = hashlib.sha256(), 0
        with os.fdopen(fd, "rb", closefd=False) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                n += len(chunk)
        out[path] = {"bytes": n, "sha256": h.hexdigest()}
    finally:
        os.close(fd)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class EvidenceOutcome:
    job_id: str
    attempt: int
    state: str  # VERIFIED | ALREADY | INCOMPLETE | UNVERIFIED
    reason: str = ""
    files: int = 0
    local_dir: str = ""

    @property
    def verified(self) -> bool:
        return self.state in (VERIFIED, ALREADY)


def failed_attempt(att: Attempt) -> bool:
    """An attempt whose log and exit record are evidence worth keeping: it exited non-zero, or vanished."""
    return att.state == AttemptState.LOST.value or (att.state == AttemptState.EXITED.value and att.exit_code != 0)


def local_dir(results_root: Path, job: Job, attempt: int) -> Path:
    return results_root / job.sweep_id / EVIDENCE_DIR / job.id / protocol.ATTEMPTS_DIR / str(attempt)


def is_home(results_root: Path, job: Job, attempt: int) -> bool:
    """The attempt's evidence is here with its verification record, every file it lists of its size."""
    where = local_dir(results_root, job, attempt)
    try:
        record = json.loads((where / EVIDENCE_VERIFIED).read_text(encoding="utf-8"))
        files = record["files"]
        return (record.get("job_id") == job.id and record.get("attempt") == attempt
                and all((where / f["path"]).stat().st_size == f["bytes"] for f in files))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _remote(host: Host, job: Job, attempt: int, name: str) -> str:
    return host.path(protocol.JOBS_DIR, job.id, protocol.ATTEMPTS_DIR, str(attempt), name)


def _hashes(host: Host, paths: Sequence[str]) -> FileHashes:
    """{remote path: size and sha256, why not, or None (absent)}, checked; raises HostError (a
    ProtocolError when the host's answer is not such a document)."""
    result = host.run([host.python, "-I", "-c", HASH, *paths], timeout=300)
    if result.exit_code != 0 or len(result.stdout) > MAX_REPLY_BYTES:
        raise HostError(host.name, f"hashing the attempts' logs failed (exit {result.exit_code}): "
                        f"{result.stderr.strip()[-300:]}")
    return read_file_hashes(host.name, result.stdout)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _limit(name: str) -> int:
    return MAX_EXIT_BYTES if name == protocol.EXIT_FILE else MAX_FILE_BYTES


def _exit_problem(path: Path, host: str, job: Job, att: Attempt) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_EXIT_BYTES + 1)
        if len(data) > MAX_EXIT_BYTES:
            return f"{protocol.EXIT_FILE} is over the {MAX_EXIT_BYTES} bytes an exit record may be"
        record = validate(host, "exit record", ExitRecord, json.loads(data.decode("utf-8")))
    except OSError as exc:
        return f"{protocol.EXIT_FILE} cannot be read: {exc.strerror or exc}"
    except (ValueError, RecursionError) as exc:
        return f"{protocol.EXIT_FILE} is not JSON: {type(exc).__name__}"
    except ProtocolError as exc:
        return f"{protocol.EXIT_FILE}: {exc}"
    if record.job_id != job.id or record.attempt != att.number:
        return f"{protocol.EXIT_FILE} is not the record of {job.id} attempt {att.number}"
    code = record.code
    if att.exit_code is not None and code != att.exit_code:
        return f"{protocol.EXIT_FILE} says exit {code}, the ledger recorded {att.exit_code}"
    return None


def _set_aside(directory: Path, quarantine_root: Path, job: Job, attempt: int) -> str:
    """Move ``directory`` into the quarantine as ``<job>--a<n>--evidence[-k]`` (older evidence copies
    beyond its bounds are pruned); where it went and what the quarantine keeps, in words."""
    aside, held = quarantine.set_aside(directory, quarantine_root, f"{job.id}--a{attempt}{quarantine.EVIDENCE_TAG}")
    return f"{aside} ({held.said()})"


def _wanted(host: Host, job: Job, att: Attempt, hashes: FileHashes) -> tuple[list[tuple[str, int, str]], str]:
    """(name, size, sha256) of each file to copy, by the host's hashes, and "" or why none is copied."""
    wanted = []
    for name in FILES:
        info = hashes.root.get(_remote(host, job, att.number, name))
        if info is None:
            continue
        if info.bytes is None or info.sha256 is None:
            return [], f"{name} on {host.name}: {info.error or 'no hash'}"
        if info.bytes > _limit(name):
            return [], f"{name} on {host.name} is {info.bytes} bytes, over the {_limit(name)} this copies"
        wanted.append((name, info.bytes, info.sha256))
    if att.state == AttemptState.EXITED.value and protocol.EXIT_FILE not in {w[0] for w in wanted}:
        return [], f"its exit record is missing on {host.name}"
    return wanted, ""


def _short_of_disk(results_root: Path, size: int) -> str:
    """Why ``size`` bytes are not copied under ``results_root`` now ("" when they fit): this machine keeps
    ``KEEP_FREE_BYTES`` free (its ledger lives here too); the next try copies them once there is room."""
    where = results_root
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if size + KEEP_FREE_BYTES <= free:
        return ""
    return (f"this machine has {free} bytes free under {where}; the evidence is {size} bytes and "
            f"{KEEP_FREE_BYTES} stay free: not copied (free some space: the next tick tries again)")


def _one(ledger: Ledger, host: Host, job: Job, att: Attempt, hashes: FileHashes, results_root: Path,
         quarantine_root: Path) -> EvidenceOutcome:
    final = local_dir(results_root, job, att.number)
    staging = final.with_name(final.name + ".incoming")
    listed: list[dict[str, Any]] = []
    wanted, refused = _wanted(host, job, att, hashes)
    if refused:
        return EvidenceOutcome(job.id, att.number, UNVERIFIED, refused)
    short = _short_of_disk(results_root, sum(size for _, size, _ in wanted))
    if short:
        return EvidenceOutcome(job.id, att.number, INCOMPLETE, short)
    names = {w[0] for w in wanted}
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    problem = None
    for name, size, sha in wanted:
        try:
            host.get(_remote(host, job, att.number, name), staging / name, size=size)
        except HostUnreachable as exc:
            return EvidenceOutcome(job.id, att.number, INCOMPLETE, str(exc))
        except HostError as exc:
            problem = f"{name}: {exc}"
            break
        got = _sha256(staging / name)
        if got != sha or (staging / name).stat().st_size != size:
            problem = f"{name} copied with sha256 {got[:12]}, the host hashed {sha[:12]}"
            break
        listed.append({"path": name, "bytes": size, "sha256": sha})
    if problem is None and protocol.EXIT_FILE in names:
        problem = _exit_problem(staging / protocol.EXIT_FILE, host.name, job, att)
    if problem is not None:
        aside = _set_aside(staging, quarantine_root, job, att.number)
        return EvidenceOutcome(job.id, att.number, UNVERIFIED, f"{problem}; the copy is in {aside}")
    record = {"schema": EVIDENCE_SCHEMA, "job_id": job.id, "name": job.name, "attempt": att.number,
              "host": host.name, "exit_code": att.exit_code, "files": listed,
              "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for entry in listed:  # durable before anything calls it verified: the host may be gone next
        fsync_path(staging / entry["path"])
    tmp = staging / f"{EVIDENCE_VERIFIED}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    fsync_path(tmp)
    os.replace(tmp, staging / EVIDENCE_VERIFIED)
    if final.exists():
        _set_aside(final, quarantine_root, job, att.number)  # a copy whose record no longer held (is_home)
    os.rename(staging, final)
    fsync_path(final.parent)
    what = f"{len(listed)} file(s)" if listed else "neither a log nor an exit record (nothing to keep)"
    ledger.record_event("job", job.id, f"evidence of attempt {att.number} home from {host.name}: {what}, "
                                       f"verified, in {final}")
    return EvidenceOutcome(job.id, att.number, VERIFIED, files=len(listed), local_dir=str(final))


def fetch_evidence(ledger: Ledger, host: Host, items: Sequence[tuple[Job, Attempt]], results_root: Path,
                   quarantine_root: Path) -> list[EvidenceOutcome]:
    """Bring home, verified, the log and exit record of each failed attempt in ``items`` (all on ``host``);
    one outcome each, in order.  Attempts whose evidence is home already are not fetched again."""
    out: dict[tuple[str, int], EvidenceOutcome] = {}
    todo = []
    for job, att in items:
        if is_home(results_root, job, att.number):
            out[(job.id, att.number)] = EvidenceOutcome(job.id, att.number, ALREADY,
                                                        local_dir=str(local_dir(results_root, job, att.number)))
        else:
            todo.append((job, att))
    if todo:
        hashes = FileHashes({})
        failed: EvidenceOutcome | None = None
        try:
            hashes = _hashes(host, [_remote(host, j, a.number, name) for j, a in todo for name in FILES])
        except HostUnreachable as exc:
            failed = EvidenceOutcome("", 0, INCOMPLETE, str(exc))
        except (HostError, ProtocolError) as exc:
            failed = EvidenceOutcome("", 0, UNVERIFIED, str(exc))
        for job, att in todo:
            if failed is not None:
                out[(job.id, att.number)] = EvidenceOutcome(job.id, att.number, failed.state, failed.reason)
                continue
            try:
                out[(job.id, att.number)] = _one(ledger, host, job, att, hashes, results_root, quarantine_root)
            except OSError as exc:  # this machine's disk
                out[(job.id, att.number)] = EvidenceOutcome(job.id, att.number, INCOMPLETE,
                                                            f"local file error: {exc.strerror or exc}")
    return [out[(j.id, a.number)] for j, a in items]
