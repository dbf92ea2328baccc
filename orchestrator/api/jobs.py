"""Verbs on jobs that ran: ``logs``, ``cancel``, ``results``."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orchestrator.agent import client
from orchestrator.api.explaining import attempt_log
from orchestrator.api.resultrows import (  # results lives there (the read path without the ORM); found here too
    ResultRow,
    collect_missing,
    collect_notes,
    cpu_slots,
    ran_with,
    results,
)
from orchestrator.api.snapshot import tick
from orchestrator.context import Context, host_for
from orchestrator.core import protocol, redact
from orchestrator.core.errors import GpuqError, IllegalTransition, UsageError
from orchestrator.core.states import JobState
from orchestrator.hosts.base import Host
from orchestrator.ledger import Job

__all__ = ["CancelOutcome", "ResultRow", "cancel", "cancel_targets", "collect_missing", "collect_notes",
           "cpu_slots", "logs", "ran_with", "results"]


def _job_host(ctx: Context, job: Job) -> Host:
    if job.host is None:
        raise UsageError(f"job {job.id} ({job.name}) has not been placed on a host yet")
    row = ctx.ledger.host(job.host)
    if row is None:
        raise UsageError(f"job {job.id} ran on host {job.host!r}, which is no longer registered")
    return host_for(ctx, row)


def logs(ctx: Context, ref: str | Job, *, follow: bool = False, poll_s: float = 1.0,
         attempt: int | None = None) -> Iterator[str]:
    """The job's log of its latest attempt; with ``follow``, until the job ends.  ``attempt``: that
    attempt's log instead (from its copy at home, else its host: ``explaining.attempt_log``); following
    it makes sense only for the current attempt.  The log is host text: the values of the variables
    sweeps forward are redacted from it, and common token shapes (``redact.stream``; docs/security.md)."""
    job = ref if isinstance(ref, Job) else ctx.ledger.resolve_job(ref)
    yield from redact.stream(_log(ctx, job, follow, poll_s, attempt), lambda text: str(ctx.ledger.redact(text)))


def _log(ctx: Context, job: Job, follow: bool, poll_s: float, attempt: int | None) -> Iterator[str]:
    if attempt is not None and not (follow and attempt == job.attempt_count):
        yield from attempt_log(ctx, job, attempt)
        return
    if job.attempt_count == 0:
        raise UsageError(f"job {job.id} ({job.name}) has not started yet; no log")
    host = _job_host(ctx, job)
    path = host.path(protocol.JOBS_DIR, job.id, protocol.ATTEMPTS_DIR, str(job.attempt_count), protocol.JOB_LOG)
    offset = 0
    while True:
        result = host.run(["tail", "-c", f"+{offset + 1}", path], timeout=30)
        if result.exit_code == 0 and result.stdout:
            offset += len(result.stdout.encode())
            yield result.stdout
        if not follow:
            if result.exit_code != 0 and offset == 0:
                raise GpuqError(f"job {job.id} ({job.name}) has no log yet: it is {job.state} on {host.name} "
                                "and has not started; `gpuq logs -f` waits for it")
            return
        tick(ctx)
        if JobState(ctx.ledger.job(job.id).state).terminal:
            final = host.run(["tail", "-c", f"+{offset + 1}", path], timeout=30)
            if final.exit_code == 0 and final.stdout:
                yield final.stdout
            return
        time.sleep(poll_s)


@dataclass
class CancelOutcome:
    job: Job
    outcome: str
    ok: bool = True  # False: the job could not be cancelled (its host did not answer); it was left as it was


def cancel_targets(ctx: Context, *, refs: Sequence[str] = (), sweeps: Sequence[str] = (),
                   all_sweeps: bool = False) -> tuple[list[Job], list[str]]:
    """The jobs ``gpuq cancel`` would touch, in order, each once, and the notes on bare names.

    Jobs named by reference are listed whatever their state (a finished one is reported as such);
    ``sweeps`` and ``all_sweeps`` add only unfinished jobs.  Every reference is resolved before
    anything is cancelled, so a typo cancels nothing.
    """
    if not refs and not sweeps and not all_sweeps:
        raise UsageError("give one or more JOBs, --sweep SWEEP or --all; `gpuq status` lists them")
    if all_sweeps and (refs or sweeps):
        raise UsageError("--all cancels every unfinished job: give it alone, without JOBs or --sweep")
    targets: dict[str, Job] = {}
    notes: list[str] = []
    for ref in refs:
        found = ctx.ledger.resolve_job_ref(ref)
        targets.setdefault(found.job.id, found.job)
        if found.note:
            notes.append(found.note)
    sweep_ids = [s.id for s in ctx.ledger.sweeps()] if all_sweeps else [ctx.ledger.resolve_sweep(s).id for s in sweeps]
    for sweep_id in sweep_ids:
        for job in ctx.ledger.jobs(sweep_id=sweep_id):
            if not JobState(job.state).terminal:
                targets.setdefault(job.id, job)
    return list(targets.values()), notes


def cancel(ctx: Context, *, ref: str | None = None, sweep: str | None = None,
           jobs: Sequence[Job] | None = None) -> list[CancelOutcome]:
    """Cancel ``jobs`` (or one job ``ref``, or a sweep's unfinished jobs): one agent call per host.

    A host that cannot be reached leaves its jobs as they were (``ok`` False)."""
    if jobs is None:
        if (ref is None) == (sweep is None):
            raise UsageError("give a job or --sweep SWEEP, not both")
        jobs, _ = cancel_targets(ctx, refs=[ref] if ref else [], sweeps=[sweep] if sweep else [])
    out: list[CancelOutcome] = []
    by_host: dict[str, list[Job]] = {}
    for job in jobs:
        if JobState(job.state).terminal:
            out.append(CancelOutcome(job, f"already {job.state}"))
        elif job.host is not None and job.attempt_count:
            by_host.setdefault(job.host, []).append(job)
        else:
            ctx.ledger.transition(job.id, JobState.CANCELLED, message="cancelled by user before placement")
            out.append(CancelOutcome(job, "cancelled before placement"))
    for host_name, held in by_host.items():
        row = ctx.ledger.host(host_name)
        try:
            host = _job_host(ctx, held[0])
            from orchestrator.tick import host_retries  # cancel only: results and logs stay light

            host_retries.before_cancel(ctx.ledger, host, held, ctx.settings)  # a host's own retry: recorded first
            verdicts = client.cancel(host, row.agent_bundle if row else "", [j.id for j in held],
                                     timeout=60 + ctx.settings.kill_grace_s * 2)
        except GpuqError as exc:
            reason = " ".join(str(exc).split())
            out += [CancelOutcome(job, f"not cancelled: {reason}", ok=False) for job in held]
            continue
        for job in held:
            verdict = verdicts[job.id]
            try:
                ctx.ledger.transition(job.id, JobState.CANCELLED, message=f"cancelled by user ({verdict})")
            except IllegalTransition:  # another gpuq command recorded its end meanwhile: nothing to cancel
                out.append(CancelOutcome(job, f"already {ctx.ledger.job(job.id).state}"))
                continue
            out.append(CancelOutcome(job, verdict))
            _stop_other_nodes(ctx, job)
    order = {job.id: i for i, job in enumerate(jobs)}
    return sorted(out, key=lambda o: order[o.job.id])


def _stop_other_nodes(ctx: Context, job: Job) -> None:
    """A cancelled multi-node job: its parts on the other node hosts are stopped too."""
    attempt = ctx.ledger.attempt(job.id, job.attempt_count)
    if attempt is not None and attempt.nodes:
        from orchestrator.tick import gangs  # the fleet and the ORM behind it: cancel only

        parts = [gangs.Part(rank, name, False, None)  # not probed: withdrawn if waiting, killed if running
                 for rank, name in enumerate(attempt.node_hosts()) if rank > 0]
        gangs.stop_parts(ctx.ledger, ctx.fleet, job, attempt, parts, "it was cancelled")
