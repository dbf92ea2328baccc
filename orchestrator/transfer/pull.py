"""Pull finished jobs' results home, verified by size and sha256 (docs/results.md).

For one host, :func:`pull_jobs`:

1. asks the host agent for every job's manifest in one round trip (``manifest JOB...``: the agent
   hashes the job's result files, and the attempt's log, exit record and end record);
2. per job, fetches ``MANIFEST.json`` into the staging dir ``results/<sweep>/<job>.incoming/``
   (as ``MANIFEST.json.incoming``, checked against the sha256 the agent printed, then renamed);
3. copies each listed file into the staging dir, resuming a partial file from its size (a file
   longer than the manifest says restarts from 0); a dropped link is retried with capped
   exponential backoff and jitter, at most ``tries`` times per job directory, after which the job is
   "incomplete" and its staging dir stays for the next pull to resume;
4. verifies the staging dir: its file set equals the manifest's exactly (missing and unexpected
   files both fail), then sizes, then sha256, then content (the best checkpoint is a sound torch
   zip archive holding a state dict, metrics and summary parse);
5. on success writes ``PULL_VERIFIED.json`` (bound to the manifest's sha256) atomically, renames
   the staging dir to ``results/<sweep>/<job>/`` and only then writes the ledger's verified mark;
   on failure moves the staging dir, never deleting it, to ``quarantine/<job>--a<n>--<reason>/``
   with a PROVENANCE.txt, and the next pull starts from a fresh staging dir.

The manifest also has to describe the attempt the ledger saw succeed, with the hashes the
controller recorded when it ended (``Artifact`` rows: the attempt's end record, ``outputs.json``):
a host file changed, added or removed since is refused, named, before a byte moves.

Crash safety: every step leaves a state the next pull picks up.  A controller killed mid-copy
leaves partial files that resume; one killed between the rename and the ledger write leaves a
verified dir that the next pull re-checks against a fresh manifest and records.  Verified
results are never overwritten.  What "verified" requires is in :mod:`orchestrator.transfer.verify`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import host_documents
from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError, HostError, HostUnreachable, TransferError
from orchestrator.host_documents import ManifestReply
from orchestrator.hosts.base import Host
from orchestrator.ledger import Artifact, Job, Ledger
from orchestrator.transfer import progress as transfer_progress
from orchestrator.transfer.verify import (
    MANIFEST_INCOMING,
    PROVENANCE,
    PULL_VERIFIED,
    PULL_VERIFIED_SCHEMA,
    SHOWN_CHANGES,
    Manifest,
    ManifestEntry,
    Problem,
    end_record_changes,
    parse_manifest,
    read_manifest,
    read_verified_record,
    required_files,
    verify_copy,
)

STAGING_SUFFIX = ".incoming"
MANIFEST_TIMEOUT_S = 900.0  # the agent hashes every result file and checkpoint in this call

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


def request_manifests(host: Host, agent: Sequence[str], job_ids: Sequence[str]) -> dict[str, ManifestReply]:
    """One round trip: the agent builds each job's MANIFEST.json; {job_id: reply entry}."""
    result = host.run([*agent, "manifest", *job_ids], timeout=MANIFEST_TIMEOUT_S)
    if result.exit_code == protocol.AGENT_EXIT_USAGE and "invalid choice: 'manifest'" in result.stderr:
        raise TransferError(host.name, "its host agent predates `gpuq pull` (no `manifest` verb); submit any "
                            "sweep to this host with this gpuq to place a newer agent, then pull again")
    try:
        doc = host_documents.read_manifest(host.name, result.stdout)
    except host_documents.ProtocolError as exc:
        detail = result.stderr.strip()[-300:] or exc.detail
        raise TransferError(host.name, f"the agent could not build manifests (exit {result.exit_code}): "
                            f"{detail}") from exc
    return dict(doc.root)


def _utc(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_tree(directory: Path) -> None:
    """Make the copy durable before anything claims it is verified."""
    for dirpath, _dirs, filenames in os.walk(directory):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_path(directory)


def fsync_path(directory: Path) -> None:
    """fsync a file or a directory (what a rename into it made durable)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Pull:
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
        _atomic_write(target / PROVENANCE, (
            "gpuq pull moved this copy here instead of marking it verified; nothing was deleted.\n"
            f"job:      {job.id} ({job.name}) of sweep {job.sweep_id}, attempt {attempt}\n"
            f"host:     {self.host.name}  {self.host.path(protocol.JOBS_DIR, job.id)}\n"
            f"manifest: sha256 {manifest_sha or '-'} (MANIFEST.json here, when it arrived)\n"
            f"failed:   {problem.slug}: {problem.detail}\n"
            f"time:     {_utc()}\n"
            f"next:     `gpuq pull --sweep {job.sweep_id}` fetches a fresh copy; delete this directory only "
            "when you no longer need the evidence.\n"
        ))
        return target


def _remote(host: Host, job_id: str, rel: str) -> str:
    return host.path(protocol.JOBS_DIR, job_id, *rel.split("/"))


MANIFEST_MAX_BYTES = 16 << 20  # a manifest lists files; a host sending more is not trusted


def _fetch_manifest(run: _Pull, job: Job, staging: Path, reported_sha: str, failures: list[str]) -> Manifest:
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


def _required(run: _Pull, job: Job) -> tuple[str, ...]:
    """The result files the job's sweep checks at finalize (docs/results.md)."""
    sweep = run.ledger.sweep(job.sweep_id)
    return required_files(sweep.verify.split(",") if sweep is not None else ("metrics", "best_ckpt"))


def _copy_files(run: _Pull, job: Job, staging: Path, manifest: Manifest, failures: list[str]) -> int:
    """Copy every listed file into ``staging``, resuming partial files; returns bytes moved."""
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
            try:
                with transfer_progress.track(f"pull {job.name}: {entry.path}", entry.size - offset) as shown:
                    run.host.get(remote, local, offset=offset, size=entry.size,  # never past the manifest's size
                                 progress=lambda done: shown(done - offset))
            finally:
                moved += max(0, (local.stat().st_size if local.is_file() else 0) - offset)

        run.retrying(attempt, failures)
    return moved


def _outcome(job: Job, host: Host, state: str, reason: str = "", **kw: Any) -> PullOutcome:
    return PullOutcome(job.id, job.name, job.sweep_id, host.name, state, reason, **kw)


def _existing_final(run: _Pull, job: Job, final: Path, manifest: Manifest) -> PullOutcome:
    """A final dir exists though the ledger has no verified mark for it: repair or refuse, never overwrite."""
    record = read_verified_record(final)
    kept = read_manifest(final / protocol.JOB_MANIFEST_FILE, job.id, _required(run, job))
    keep = f"{final} is kept (verified results are never overwritten); move it away and pull again"
    if record is None or kept is None or record.get("manifest_sha256") != kept.sha256:
        return _outcome(job, run.host, NOT_PULLED, f"{final} exists without a valid verification record; {keep}")
    if not kept.same_files(manifest):
        return _outcome(job, run.host, NOT_PULLED, f"{final} holds a verified copy of a different manifest; {keep}")
    problem = verify_copy(final, kept)
    if problem is not None:
        return _outcome(job, run.host, NOT_PULLED, f"{final} no longer matches its manifest ({problem.detail}); "
                        f"{keep}")
    run.ledger.record_pull(job.id, attempt=kept.attempt, host=run.host.name, state=VERIFIED,
                           manifest_sha256=kept.sha256, files=len(kept.files), total_bytes=kept.total_bytes,
                           local_dir=str(final), reason="recorded by a later pull (the ledger write was lost)")
    return _outcome(job, run.host, ALREADY, "the ledger mark was missing and is now recorded",
                    files=len(kept.files), bytes=kept.total_bytes, local_dir=str(final))


def _check_against_ledger(run: _Pull, job: Job, manifest: Manifest) -> str | None:
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


def _differs_from_end_record(run: _Pull, job: Job, manifest: Manifest, recorded: dict[str, Artifact]) -> str | None:
    """Why the host's files are not what attempt n left when it ended, naming each file; None when they are."""
    changes = end_record_changes(manifest, {path: (a.bytes, a.sha256) for path, a in recorded.items()})
    if not changes:
        return None
    more = f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
    return (f"{len(changes)} file(s) on {run.host.name} differ from what attempt {manifest.attempt} left when it "
            f"ended: {', '.join(changes[:SHOWN_CHANGES])}{more}; nothing was copied; inspect "
            f"{run.host.path(protocol.JOBS_DIR, job.id)}")


def _pull_one(run: _Pull, job: Job, reply: ManifestReply) -> PullOutcome:
    sweep_dir = run.results_root / job.sweep_id
    final = sweep_dir / job.id
    staging = sweep_dir / f"{job.id}{STAGING_SUFFIX}"
    if "error" in reply.model_fields_set or reply.sha256 is None:
        why = reply.error or "no manifest in the agent's reply"
        return _outcome(job, run.host, NOT_PULLED, f"{run.host.name} refused to manifest it: {why}")
    failures: list[str] = []  # one transport budget per job directory: manifest and files
    stale = read_manifest(staging / protocol.JOB_MANIFEST_FILE, job.id, _required(run, job))
    try:
        manifest = _fetch_manifest(run, job, staging, reply.sha256, failures)
    except HostUnreachable as exc:
        return _outcome(job, run.host, INCOMPLETE, f"manifest not fetched after {len(failures)} tries: {exc}")
    except (HostError, ValueError, OSError) as exc:
        return _outcome(job, run.host, NOT_PULLED, f"manifest from {run.host.name} unusable: {exc}")
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
        return _outcome(job, run.host, NOT_PULLED, mismatch, files=files, bytes=size)
    moved = 0
    try:
        moved = _copy_files(run, job, staging, manifest, failures)
    except HostError as exc:  # HostUnreachable after the budget, or a file that vanished on the host
        if isinstance(exc, HostUnreachable):
            reason = (f"transfer failed {len(failures)} times, last: {exc}; partial copy kept in {staging}, "
                      "`gpuq pull` resumes it")
        else:
            reason = f"{exc}; partial copy kept in {staging}; `gpuq pull` rebuilds the manifest and resumes"
        run.ledger.record_pull(job.id, attempt=manifest.attempt, host=run.host.name, state=INCOMPLETE,
                               manifest_sha256=manifest.sha256, files=len(manifest.files),
                               total_bytes=manifest.total_bytes, local_dir=str(staging), reason=reason)
        return _outcome(job, run.host, INCOMPLETE, reason, local_dir=str(staging), files=files, bytes=size)
    problem = verify_copy(staging, manifest)
    if problem is not None:
        where = run.quarantine(staging, job, manifest.attempt, problem, manifest.sha256)
        reason = f"{problem.detail}; moved to {where}"
        run.ledger.record_pull(job.id, attempt=manifest.attempt, host=run.host.name, state=QUARANTINED,
                               manifest_sha256=manifest.sha256, files=len(manifest.files),
                               total_bytes=manifest.total_bytes, local_dir=str(where), reason=problem.detail)
        return _outcome(job, run.host, QUARANTINED, reason, local_dir=str(where), transferred=moved, files=files,
                        bytes=size)
    _seal(run, job, staging, final, manifest)
    return _outcome(job, run.host, VERIFIED, local_dir=str(final), transferred=moved, files=files, bytes=size)


def _set_aside(run: _Pull, job: Job, staging: Path, stale: Manifest) -> None:
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


def _seal(run: _Pull, job: Job, staging: Path, final: Path, manifest: Manifest) -> None:
    """A verified copy made final: its record written and synced, the directory renamed into place, the pull
    recorded."""
    record = {"schema": PULL_VERIFIED_SCHEMA, "queue_id": job.sweep_id, "job_id": job.id, "name": job.name,
              "attempt": manifest.attempt, "host": run.host.name, "manifest_sha256": manifest.sha256,
              "files": len(manifest.files), "bytes": manifest.total_bytes, "verified_at": _utc()}
    _fsync_tree(staging)
    _atomic_write(staging / PULL_VERIFIED, json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.rename(staging, final)  # final is absent: checked by the caller, and only pulls create it
    fsync_path(final.parent)
    run.ledger.record_pull(job.id, attempt=manifest.attempt, host=run.host.name, state=VERIFIED,
                           manifest_sha256=manifest.sha256, files=len(manifest.files),
                           total_bytes=manifest.total_bytes, local_dir=str(final))


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Hold ``<sweep_dir>/.pull.lock`` (flock): two pulls of one sweep would share staging dirs."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / ".pull.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise GpuqError(f"another `gpuq pull` of sweep {sweep_dir.name} is running (it holds {path}); "
                            "wait for it to finish, then pull again") from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # something is in it: keep it
        directory.rmdir()


def pull_jobs(
    ledger: Ledger,
    host: Host,
    agent: Sequence[str],
    jobs: Sequence[Job],
    results_root: Path,
    quarantine_root: Path,
    *,
    tries: int = 5,
    backoff: tuple[float, float] = (10.0, 120.0),
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
) -> list[PullOutcome]:
    """Pull and verify the results of ``jobs`` (SUCCEEDED, all on ``host``); one outcome per job.

    ``agent`` is the host agent's command prefix (``agent.client.command(host, sha)``).  Jobs whose
    newest ledger pull is verified and whose local copy still carries that record are "already
    verified" without touching the host.  ``tries`` bounds transport failures per job directory
    (and for the manifest round trip); ``sleep`` and ``jitter`` are injectable for tests.
    """
    run = _Pull(ledger, host, results_root, quarantine_root, max(1, tries), backoff, sleep, jitter)
    outcomes: dict[str, PullOutcome] = {}
    verified = ledger.verified_pulls(j.id for j in jobs)
    todo: list[Job] = []
    for job in jobs:
        mark = verified.get(job.id)
        record = read_verified_record(Path(mark.local_dir)) if mark is not None else None
        if mark is not None and record is not None and record.get("manifest_sha256") == mark.manifest_sha256:
            outcomes[job.id] = _outcome(job, host, ALREADY, files=mark.files, bytes=mark.bytes,
                                        local_dir=mark.local_dir)
        else:
            todo.append(job)
    if todo:
        replies: dict[str, ManifestReply] = {}
        failures: list[str] = []
        try:
            def ask() -> None:
                replies.update(request_manifests(host, agent, [j.id for j in todo]))

            run.retrying(ask, failures)
        except HostUnreachable as exc:
            ledger.record_event("host", host.name, f"pull: unreachable after {len(failures)} tries: {exc}")
            for job in todo:
                outcomes[job.id] = _outcome(job, host, INCOMPLETE, f"host unreachable after {len(failures)} "
                                            f"tries: {exc}")
            todo = []
        except HostError as exc:
            for job in todo:
                outcomes[job.id] = _outcome(job, host, NOT_PULLED, str(exc))
            todo = []
        for job in todo:
            try:
                missing = ManifestReply(error="missing from the reply")
                outcomes[job.id] = _pull_one(run, job, replies.get(job.id) or missing)
            except OSError as exc:  # this machine's disk: full, read-only, permissions
                where = f" ({exc.filename})" if exc.filename else ""
                outcomes[job.id] = _outcome(job, host, INCOMPLETE, f"local file error: {exc.strerror or exc}{where}; "
                                            "nothing was marked verified, `gpuq pull` resumes")
    return [outcomes[j.id] for j in jobs]
