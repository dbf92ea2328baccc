"""``pull``: results come home verified by size and sha256 (transfer/ does the work)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import transfer
from orchestrator.agent import client
from orchestrator.context import Context, host_for
from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError, JobNotFound
from orchestrator.core.states import JobState
from orchestrator.ledger import Job, Pull


@dataclass
class PullReport:
    sweep_id: str
    results_dir: Path
    outcomes: list[transfer.PullOutcome]
    written_off: set[str] = field(default_factory=set)  # CANCELLED jobs: the user gave them up

    @property
    def verified(self) -> list[transfer.PullOutcome]:
        return [o for o in self.outcomes if o.verified]

    @property
    def ok(self) -> bool:
        """At least one job verified, and every job not written off is verified (docs/results.md)."""
        return bool(self.verified) and all(o.verified or o.job_id in self.written_off for o in self.outcomes)


def _not_pullable(job: Job) -> str:
    state = JobState(job.state)
    if state == JobState.CANCELLED:
        return "cancelled by the user: nothing to pull"
    if not state.terminal and state != JobState.LOST:
        return f"still {job.state}; pull once it has succeeded (`gpuq wait`)"
    return f"{job.state}: no results to pull (the log is evidence: `gpuq logs {job.id}`)"


def _settled(ctx: Context, jobs: list[Job]) -> bool:
    """Every job ended, and every one that succeeded is verified locally: a tick could change nothing here."""
    if not jobs or not all(JobState(j.state).terminal for j in jobs):
        return False
    succeeded = [j for j in jobs if j.state == JobState.SUCCEEDED.value]
    return len(transfer.still_verified(ctx.ledger, succeeded)) == len(succeeded)


def _already(job: Job, mark: Pull) -> transfer.PullOutcome:
    return transfer.PullOutcome(job.id, job.name, job.sweep_id, job.host or "-", transfer.ALREADY, files=mark.files,
                                bytes=mark.bytes, local_dir=mark.local_dir)


def pull(ctx: Context, *, sweep: str | None = None) -> PullReport:
    """Bring the results of the sweep's SUCCEEDED jobs (and STOPPED ones: early stopping keeps their files)
    home into ``$GPUQ_HOME/results/<sweep>/<job>/``.

    One tick first (a job that finished unwatched becomes SUCCEEDED), then per host one
    ``manifest`` round trip and the transfers; every copy is verified against its manifest before
    the ledger calls it verified (transfer.pull).  Verified jobs are not fetched again.  No tick when
    the sweep is settled: every job has ended and each that succeeded is verified here already
    (no host has anything new to say about it).
    """
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    settled = _settled(ctx, jobs)
    if not settled:
        from orchestrator.api.snapshot import tick

        tick(ctx)
        jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    if not jobs:
        raise JobNotFound(f"sweep {sweep_id} has no jobs")
    results_dir = ctx.settings.home / "results"
    quarantine_dir = ctx.settings.home / protocol.QUARANTINE_DIR
    outcomes: dict[str, transfer.PullOutcome] = {}
    by_host: dict[str, list[Job]] = {}
    marks = transfer.still_verified(ctx.ledger, jobs) if settled else {}
    for job in jobs:
        row = ctx.ledger.host(job.host) if job.host else None
        if job.state not in (JobState.SUCCEEDED.value, JobState.STOPPED.value):  # a stopped job keeps its files
            why = _not_pullable(job)
        elif row is None:
            why = f"it ran on host {job.host!r}, which is no longer registered"
        elif settled:  # verified here already: no host is asked (not even connected to)
            outcomes[job.id] = _already(job, marks[job.id])
            continue
        else:
            by_host.setdefault(row.name, []).append(job)
            continue
        outcomes[job.id] = transfer.PullOutcome(job.id, job.name, sweep_id, job.host or "-", transfer.NOT_PULLED,
                                                why)
    with transfer.sweep_lock(results_dir / sweep_id):
        for name, group in by_host.items():
            row = ctx.ledger.host(name)
            try:
                if row is None:
                    raise GpuqError(f"host {name} is no longer registered")
                host = host_for(ctx, row)
                got = transfer.pull_jobs(ctx.ledger, host, client.command(host, row.agent_bundle), group, results_dir,
                                         quarantine_dir)
            except GpuqError as exc:
                got = [transfer.PullOutcome(j.id, j.name, sweep_id, name, transfer.NOT_PULLED, str(exc))
                       for j in group]
            outcomes.update((o.job_id, o) for o in got)
    written_off = {j.id for j in jobs if j.state == JobState.CANCELLED.value}
    return PullReport(sweep_id, results_dir / sweep_id, [outcomes[j.id] for j in jobs], written_off)
