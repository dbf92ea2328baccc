"""Pull finished jobs' results home, verified by size and sha256 (docs/results.md).

For one host, :func:`pull_jobs` (steps 2-5 per job in ``job_copy.py``, durable writes in ``durable.py``):

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
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from orchestrator import host_documents
from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError, HostError, HostUnreachable, TransferError
from orchestrator.host_documents import ManifestReply
from orchestrator.hosts.base import Host
from orchestrator.ledger import Job, Ledger, Pull
from orchestrator.transfer.job_copy import ALREADY, INCOMPLETE, NOT_PULLED, PullOutcome, PullRun, outcome_of, pull_one
from orchestrator.transfer.verify import (
    read_verified_record,
)

MANIFEST_TIMEOUT_S = 900.0  # the agent hashes every result file and checkpoint in this call


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


def still_verified(ledger: Ledger, jobs: Sequence[Job]) -> dict[str, Pull]:
    """{job_id: its verified mark} for the jobs whose newest ledger pull is verified and whose local copy
    still carries that record (bound to the same manifest): nothing on a host can change them."""
    held: dict[str, Pull] = {}
    for job_id, mark in ledger.verified_pulls(j.id for j in jobs).items():
        record = read_verified_record(Path(mark.local_dir))
        if record is not None and record.get("manifest_sha256") == mark.manifest_sha256:
            held[job_id] = mark
    return held


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
    run = PullRun(ledger, host, results_root, quarantine_root, max(1, tries), backoff, sleep, jitter)
    outcomes: dict[str, PullOutcome] = {}
    verified = still_verified(ledger, jobs)
    todo: list[Job] = []
    for job in jobs:
        mark = verified.get(job.id)
        if mark is not None:
            outcomes[job.id] = outcome_of(job, host, ALREADY, files=mark.files, bytes=mark.bytes,
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
                outcomes[job.id] = outcome_of(job, host, INCOMPLETE, f"host unreachable after {len(failures)} "
                                            f"tries: {exc}")
            todo = []
        except HostError as exc:
            for job in todo:
                outcomes[job.id] = outcome_of(job, host, NOT_PULLED, str(exc))
            todo = []
        for job in todo:
            try:
                missing = ManifestReply(error="missing from the reply")
                outcomes[job.id] = pull_one(run, job, replies.get(job.id) or missing)
            except OSError as exc:  # this machine's disk: full, read-only, permissions
                where = f" ({exc.filename})" if exc.filename else ""
                outcomes[job.id] = outcome_of(job, host, INCOMPLETE, f"local file error: {exc.strerror or exc}{where}; "
                                            "nothing was marked verified, `gpuq pull` resumes")
    return [outcomes[j.id] for j in jobs]
