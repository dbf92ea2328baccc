"""One job's pull (steps 2-5 of ``pull.py``'s docstring): its manifest fetched and checked, each listed file
copied into the staging dir (resumed, retried within ``tries``), the copy checked against the ledger's end
record and verified, then sealed as the job's result dir or set aside in quarantine; and what came of it
(``PullOutcome``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core import protocol
from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.host_documents import ManifestReply
from orchestrator.hosts.base import Host
from orchestrator.ledger import Artifact, Job, Ledger
from orchestrator.transfer import progress as transfer_progress
from orchestrator.transfer.durable import atomic_write, fsync_path, fsync_tree, utc_stamp
from orchestrator.transfer.verify import (
    MANIFEST_INCOMING,
    PROVENANCE,
    PULL_VERIFIED,
    PULL_VERIFIED_SCHEMA,
    SHOWN_CHANGES,
    Manifest,
    ManifestEntry,
    Problem,
    Streamed,
    end_record_changes,
    parse_manifest,
    read_manifest,
    read_verified_record,
    required_files,
    verify_copy,
)

STAGING_SUFFIX = ".incoming"


VERIFIED = "verified"


ALREADY = "already verified"


INCOMPLETE = "incomplete"


QUARANTINED = "quarantined"


NOT_PULLED = "not pulled"


@dataclass
class PullOutcome:
    """What happened to one job; ``reason`` says why it is not verified (or how it was repaired)."""

    job_id: str
    name: str
    sweep_id: str
    host: str
    state: str
    reason: str = ""
    files: int = 0
    bytes: int = 0
    local_dir: str = ""
    transferred: int = 0

    @property
    def verified(self) -> bool:
        return self.state in (VERIFIED, ALREADY)


def backoff_delay(failures: int, backoff: tuple[float, float], jitter: float) -> float:
    """Seconds to wait after the ``failures``-th failure: base doubling up to cap, minus up to 20 % jitter."""
    base, cap = backoff
    return min(cap, base * 2.0 ** max(0, failures - 1)) * (1.0 - 0.2 * min(1.0, max(0.0, jitter)))


@dataclass
class PullRun:
    """The context shared by the jobs of one host."""

    ledger: Ledger
    host: Host
    results_root: Path
    quarantine_root: Path
    tries: int
    backoff: tuple[float, float]
    sleep: Callable[[float], None]
    jitter: Callable[[], float]

    def retrying(self, what: Callable[[], None], failures: list[str]) -> None:
        """Run ``what`` until it succeeds or ``tries`` transport failures (shared per job) are spent.

        ``failures`` collects the messages; HostUnreachable escapes once the budget is gone.
        """
        while True:
            try:
                what()
                return
            except HostUnreachable as exc:
                failures.append(str(exc))
                if len(failures) >= self.tries:
                    raise
                self.sleep(backoff_delay(len(failures), self.backoff, self.jitter()))

    def quarantine(self, src: Path, job: Job, attempt: int, problem: Problem, manifest_sha: str) -> Path:
        self.quarantine_root.mkdir(parents=True, exist_ok=True)
        base = f"{job.id}--a{attempt}--{problem.slug}"
        target, n = self.quarantine_root / base, 2
        while target.exists():
            target, n = self.quarantine_root / f"{base}-{n}", n + 1
        shutil.move(str(src), str(target))
        atomic_write(target / PROVENANCE, (
            "gpuq pull moved this copy here instead of marking it verified; nothing was deleted.\n"
            f"job:      {job.id} ({job.name}) of sweep {job.sweep_id}, attempt {attempt}\n"
            f"host:     {self.host.name}  {self.host.path(protocol.JOBS_DIR, job.id)}\n"
            f"manifest: sha256 {manifest_sha or '-'} (MANIFEST.json here, when it arrived)\n"
            f"failed:   {problem.slug}: {problem.detail}\n"
            f"time:     {utc_stamp()}\n"
            f"next:     `gpuq pull --sweep {job.sweep_id}` fetches a fresh copy; delete this directory only "
            "when you no longer need the evidence.\n"
        ))
        return target


def _remote(host: Host, job_id: str, rel: str) -> str:
    return host.path(protocol.JOBS_DIR, job_id, *rel.split("/"))


MANIFEST_MAX_BYTES = 16 << 20  # a manifest lists files; a host sending more is not trusted


def _fetch_manifest(run: PullRun, job: Job, staging: Path, reported_sha: str, failures: list[str]) -> Manifest:
    """Fetch ``MANIFEST.json.incoming`` into ``staging`` and check it against the sha the agent printed.

    The caller renames it to MANIFEST.json once it decided what to do with the staging dir.
    Raises HostUnreachable (budget spent), HostError, ValueError (a bad or changed manifest).
    """
    staging.mkdir(parents=True, exist_ok=True)
    incoming = staging / MANIFEST_INCOMING
    remote = _remote(run.host, job.id, protocol.JOB_MANIFEST_FILE)
    run.retrying(lambda: run.host.get(remote, incoming, size=MANIFEST_MAX_BYTES), failures)
    raw = incoming.read_bytes()
    if hashlib.sha256(raw).hexdigest() != reported_sha:
        raise ValueError("the manifest fetched differs from the one the agent just built (is another "
                         "`gpuq pull` running?); pull again")
    return parse_manifest(raw, job_id=job.id, required=_required(run, job))


def _required(run: PullRun, job: Job) -> tuple[str, ...]:
    """The result files the job's sweep checks at finalize (docs/results.md)."""
    sweep = run.ledger.sweep(job.sweep_id)
    return required_files(sweep.verify.split(",") if sweep is not None else ("metrics", "best_ckpt"))


def _prefix_digest(local: Path, offset: int) -> Any:
    """A sha256 that has already read the first ``offset`` bytes of ``local`` (the part a resume keeps)."""
    digest = hashlib.sha256()
    if offset:
        with open(local, "rb") as f:
            left = offset
            while left and (block := f.read(min(1 << 20, left))):
                digest.update(block)
                left -= len(block)
    return digest


def _copy_files(run: PullRun, job: Job, staging: Path, manifest: Manifest, failures: list[str],
                streamed: dict[str, Streamed]) -> int:
    """Copy every listed file into ``staging``, resuming partial files, each hashed as it is written (into
    ``streamed``: one pass over the bytes); returns bytes moved."""
    moved = 0
    for entry in manifest.files:
        local = staging / entry.path
        remote = _remote(run.host, job.id, entry.path)

        def attempt(entry: ManifestEntry = entry, local: Path = local, remote: str = remote) -> None:
            nonlocal moved
            have = local.stat().st_size if local.is_file() and not local.is_symlink() else 0
            if have == entry.size:
                return
            offset = have if have < entry.size else 0  # longer than the manifest: start over
            local.parent.mkdir(parents=True, exist_ok=True)
            digest = _prefix_digest(local, offset)
            try:
                with transfer_progress.track(f"pull {job.name}: {entry.path}", entry.size - offset) as shown:
                    run.host.get(remote, local, offset=offset, size=entry.size,  # never past the manifest's size
                                 progress=lambda done: shown(done - offset), digest=digest)
                streamed[entry.path] = Streamed.of(local, digest.hexdigest())
            finally:
                moved += max(0, (local.stat().st_size if local.is_file() else 0) - offset)

        run.retrying(attempt, failures)
    return moved


def outcome_of(job: Job, host: Host, state: str, reason: str = "", **kw: Any) -> PullOutcome:
    return PullOutcome(job.id, job.name, job.sweep_id, host.name, state, reason, **kw)


def _existing_final(run: PullRun, job: Job, final: Path, manifest: Manifest) -> PullOutcome:
    """A final dir exists though the ledger has no verified mark for it: repair or refuse, never overwrite."""
    record = read_verified_record(final)
    kept = read_manifest(final / protocol.JOB_MANIFEST_FILE, job.id, _required(run, job))
    keep = f"{final} is kept (verified results are never overwritten); move it away and pull again"
    if record is None or kept is None or record.get("manifest_sha256") != kept.sha256:
        return outcome_of(job, run.host, NOT_PULLED, f"{final} exists without a valid verification record; {keep}")
    if not kept.same_files(manifest):
        return outcome_of(job, run.host, NOT_PULLED, f"{final} holds a verified copy of a different manifest; {keep}")
    problem = verify_copy(final, kept)
    if problem is not None:
        return outcome_of(job, run.host, NOT_PULLED, f"{final} no longer matches its manifest ({problem.detail}); "
                        f"{keep}")
    run.ledger.record_pull(job.id, attempt=kept.attempt, host=run.host.name, state=VERIFIED,
                           manifest_sha256=kept.sha256, files=len(kept.files), total_bytes=kept.total_bytes,
                           local_dir=str(final), reason="recorded by a later pull (the ledger write was lost)")
    return outcome_of(job, run.host, ALREADY, "the ledger mark was missing and is now recorded",
                    files=len(kept.files), bytes=kept.total_bytes, local_dir=str(final))


def _check_against_ledger(run: PullRun, job: Job, manifest: Manifest) -> str | None:
    """The manifest must describe the attempt the ledger saw succeed, with the hashes recorded then:
    its end record when the ledger holds one (every file, none more, none fewer), else the hashes an
    older agent's ``collect`` gave."""
    if manifest.attempt != job.attempt_count:
        return (f"the host's manifest is of attempt {manifest.attempt} but the ledger's latest attempt is "
                f"{job.attempt_count}; `gpuq status` reconciles, then pull again")
    recorded = {a.path: a for a in run.ledger.artifacts(job.id) if a.attempt == manifest.attempt}
    ended = protocol.end_record_path(manifest.attempt)
    if ended in recorded:
        return _differs_from_end_record(run, job, manifest, recorded)
    if any(e.path == ended for e in manifest.files):  # never a weaker check for a record the ledger missed
        return (f"the ledger holds no end record of attempt {manifest.attempt} (its results were not collected "
                f"when it ended); `gpuq results --sweep {job.sweep_id}` collects them, then pull again")
    by_path = {e.path: e for e in manifest.files}
    for art in recorded.values():
        entry = by_path.get(art.path)
        if entry is not None and (entry.sha256, entry.size) != (art.sha256, art.bytes):
            return (f"{art.path} on {run.host.name} changed after the job finished (sha256 {entry.sha256[:12]}, "
                    f"collected {art.sha256[:12]}); inspect {_remote(run.host, job.id, art.path)}")
    return None


def _differs_from_end_record(run: PullRun, job: Job, manifest: Manifest, recorded: dict[str, Artifact]) -> str | None:
    """Why the host's files are not what attempt n left when it ended, naming each file; None when they are."""
    changes = end_record_changes(manifest, {path: (a.bytes, a.sha256) for path, a in recorded.items()})
    if not changes:
        return None
    more = f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
    return (f"{len(changes)} file(s) on {run.host.name} differ from what attempt {manifest.attempt} left when it "
            f"ended: {', '.join(changes[:SHOWN_CHANGES])}{more}; nothing was copied; inspect "
            f"{run.host.path(protocol.JOBS_DIR, job.id)}")


def pull_one(run: PullRun, job: Job, reply: ManifestReply) -> PullOutcome:
    sweep_dir = run.results_root / job.sweep_id
    final = sweep_dir / job.id
    staging = sweep_dir / f"{job.id}{STAGING_SUFFIX}"
    if "error" in reply.model_fields_set or reply.sha256 is None:
        why = reply.error or "no manifest in the agent's reply"
        return outcome_of(job, run.host, NOT_PULLED, f"{run.host.name} refused to manifest it: {why}")
    failures: list[str] = []  # one transport budget per job directory: manifest and files
    stale = read_manifest(staging / protocol.JOB_MANIFEST_FILE, job.id, _required(run, job))
    try:
        manifest = _fetch_manifest(run, job, staging, reply.sha256, failures)
    except HostUnreachable as exc:
        return outcome_of(job, run.host, INCOMPLETE, f"manifest not fetched after {len(failures)} tries: {exc}")
    except (HostError, ValueError, OSError) as exc:
        return outcome_of(job, run.host, NOT_PULLED, f"manifest from {run.host.name} unusable: {exc}")
    files, size = len(manifest.files), manifest.total_bytes
    if final.exists():
        (staging / MANIFEST_INCOMING).unlink()  # our own transient copy; nothing else is touched
        _remove_if_empty(staging)
        return _existing_final(run, job, final, manifest)
    if stale is not None and not stale.same_files(manifest):
        _set_aside(run, job, staging, stale)
    os.replace(staging / MANIFEST_INCOMING, staging / protocol.JOB_MANIFEST_FILE)
    mismatch = _check_against_ledger(run, job, manifest)
    if mismatch:
        return outcome_of(job, run.host, NOT_PULLED, mismatch, files=files, bytes=size)
    moved = 0
    streamed: dict[str, Streamed] = {}
    try:
        moved = _copy_files(run, job, staging, manifest, failures, streamed)
    except HostError as exc:  # HostUnreachable after the budget, or a file that vanished on the host
        if isinstance(exc, HostUnreachable):
            reason = (f"transfer failed {len(failures)} times, last: {exc}; partial copy kept in {staging}, "
                      "`gpuq pull` resumes it")
        else:
            reason = f"{exc}; partial copy kept in {staging}; `gpuq pull` rebuilds the manifest and resumes"
        run.ledger.record_pull(job.id, attempt=manifest.attempt, host=run.host.name, state=INCOMPLETE,
                               manifest_sha256=manifest.sha256, files=len(manifest.files),
                               total_bytes=manifest.total_bytes, local_dir=str(staging), reason=reason)
        return outcome_of(job, run.host, INCOMPLETE, reason, local_dir=str(staging), files=files, bytes=size)
    problem = verify_copy(staging, manifest, streamed)
    if problem is not None:
        where = run.quarantine(staging, job, manifest.attempt, problem, manifest.sha256)
        reason = f"{problem.detail}; moved to {where}"
        run.ledger.record_pull(job.id, attempt=manifest.attempt, host=run.host.name, state=QUARANTINED,
                               manifest_sha256=manifest.sha256, files=len(manifest.files),
                               total_bytes=manifest.total_bytes, local_dir=str(where), reason=problem.detail)
        return outcome_of(job, run.host, QUARANTINED, reason, local_dir=str(where), transferred=moved, files=files,
                        bytes=size)
    _seal(run, job, staging, final, manifest)
    return outcome_of(job, run.host, VERIFIED, local_dir=str(final), transferred=moved, files=files, bytes=size)


def _set_aside(run: PullRun, job: Job, staging: Path, stale: Manifest) -> None:
    """An interrupted pull of other bytes: kept as evidence in quarantine, and a fresh staging dir begun with
    the manifest just fetched."""
    aside = staging.parent / f".{job.id}.{MANIFEST_INCOMING}"
    os.replace(staging / MANIFEST_INCOMING, aside)
    moved_to = run.quarantine(staging, job, stale.attempt, Problem(
        "superseded", "an interrupted pull of an earlier manifest; the host now lists other files"),
        stale.sha256)
    run.ledger.record_event("job", job.id, f"pull: stale staging dir moved to {moved_to}")
    staging.mkdir()
    os.replace(aside, staging / MANIFEST_INCOMING)


def _seal(run: PullRun, job: Job, staging: Path, final: Path, manifest: Manifest) -> None:
    """A verified copy made final: its record written and synced, the directory renamed into place, the pull
    recorded."""
    record = {"schema": PULL_VERIFIED_SCHEMA, "queue_id": job.sweep_id, "job_id": job.id, "name": job.name,
              "attempt": manifest.attempt, "host": run.host.name, "manifest_sha256": manifest.sha256,
              "files": len(manifest.files), "bytes": manifest.total_bytes, "verified_at": utc_stamp()}
    fsync_tree(staging)
    atomic_write(staging / PULL_VERIFIED, json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.rename(staging, final)  # final is absent: checked by the caller, and only pulls create it
    fsync_path(final.parent)
    run.ledger.record_pull(job.id, attempt=manifest.attempt, host=run.host.name, state=VERIFIED,
                           manifest_sha256=manifest.sha256, files=len(manifest.files),
                           total_bytes=manifest.total_bytes, local_dir=str(final))


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # something is in it: keep it
        directory.rmdir()
