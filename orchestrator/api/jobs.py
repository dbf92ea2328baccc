"""Verbs on jobs that ran: ``logs``, ``cancel``, ``results``."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import transfer
from orchestrator.agent import client
from orchestrator.api.explaining import attempt_log
from orchestrator.api.snapshot import tick
from orchestrator.context import Context, gc_paused, host_for
from orchestrator.core import protocol, redact
from orchestrator.core.errors import GpuqError, IllegalTransition, JobNotFound, UsageError
from orchestrator.core.states import JobState
from orchestrator.health import observed
from orchestrator.host_documents import Provenance
from orchestrator.hosts.base import Host
from orchestrator.ledger import Attempt, Job
from orchestrator.money.cost import LOST_STATES, JobCost, job_cost
from orchestrator.tick.collect import collect
from orchestrator.tick.findings import FROM_SCRATCH


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


@dataclass
class ResultRow:
    job: Job
    final: dict[str, float]
    best: dict[str, float]  # each metric's own best by its direction (tick.collect.own_bests)
    attempt: Attempt | None
    pulled: str = ""  # "verified" (local copy in local_dir), "missing" (verified, copy gone), "" (not pulled)
    local_dir: str = ""
    cost: JobCost | None = None
    metric: str = observed.DEFAULT_METRIC[0]  # the sweep's headline metric ([run] metric) and its direction
    mode: str = observed.DEFAULT_METRIC[1]
    error: str = ""  # why this job's results could not be read from its host ("" = none failed)
    provenance: Provenance | None = None  # what the newest attempt ran with (None: its host has not said)
    git: tuple[str, bool | None] = ("", None)  # the project's commit at submit and whether it was dirty
    restarts_from_scratch: int = 0  # retries that found no checkpoint and trained again from the start
    best_row: dict[str, float] = field(default_factory=dict)  # every metric in the row where the headline was best
    joined: str = ""  # its part's line when it joined the sweep later (``submit --into``); "" for part 1
    joined_at: float | None = None  # when that part joined


@functools.lru_cache(maxsize=1024)
def ran_with(stored: str) -> Provenance | None:
    """``Provenance.from_stored``, parsed once per distinct text (a sweep's attempts mostly ran with
    the same few; the model is frozen, so rows may share it)."""
    return Provenance.from_stored(stored)


def cpu_slots(ctx: Context) -> Callable[[Attempt], bool]:
    """Whether an attempt ran on CPU slots (its hours are CPU-hours): its provenance says so, else its
    host's slots at the last probe."""
    kinds = {row.name: row.slots_kind for row in ctx.ledger.hosts()}

    def on_cpu(att: Attempt) -> bool:
        ran = ran_with(att.provenance)
        kind = ran.slot_kind if ran is not None and ran.slot_kind else kinds.get(att.host, "")
        return kind == "cpu"
    return on_cpu


def collect_missing(ctx: Context, jobs: Sequence[Job]) -> dict[str, str]:
    """Read the summaries of SUCCEEDED jobs the ledger has no metrics of yet from their hosts
    (one ``collect`` round trip per host).

    Errors are per host: a host that cannot be reached, or whose answer the ledger refuses (a
    non-finite metric), leaves its own jobs without metrics and the others are read all the same.
    Returns {job id: why its results are missing} for the jobs of the hosts that failed."""
    have = ctx.ledger.with_metrics(j.id for j in jobs)
    pending: dict[str, list[str]] = {}
    for job in jobs:
        if job.state == JobState.SUCCEEDED.value and job.id not in have and job.host:
            pending.setdefault(job.host, []).append(job.id)
    errors: dict[str, str] = {}
    for name, ids in pending.items():
        row = ctx.ledger.host(name)
        if row is None:
            continue
        try:
            collect(ctx.ledger, host_for(ctx, row), row.agent_bundle, ids)
        except GpuqError as exc:
            reason = " ".join(str(exc).split())[:300]
            why = reason if reason.startswith(f"host {name}") else f"host {name}: {reason}"
            done = ctx.ledger.with_metrics(ids)  # jobs recorded before the failure
            errors.update({jid: f"results not collected: {why}" for jid in ids if jid not in done})
    return errors


def collect_notes(errors: dict[str, str]) -> list[str]:
    """One line per distinct failure of ``collect_missing`` (a host's), with how many jobs it hides."""
    counts: dict[str, int] = {}
    for why in errors.values():
        counts[why] = counts.get(why, 0) + 1
    return [f"{why} ({n} job{'s' if n != 1 else ''} without metrics)" for why, n in counts.items()]


def results(ctx: Context, *, sweep: str | None = None) -> list[ResultRow]:
    """One row per job of the sweep (the newest by default).  Every table is read once for the whole
    sweep and grouped by job: the time grows with the sweep, not with its square."""
    with gc_paused():
        return _results(ctx, sweep)


def _results(ctx: Context, sweep: str | None) -> list[ResultRow]:
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    errors = collect_missing(ctx, jobs)
    ids = [j.id for j in jobs]
    source = {j.id: j.reused_from or j.id for j in jobs}  # a reused job's results are its twin's (never its cost)
    values: dict[tuple[str, str], dict[str, float]] = {}  # (job id, "final" | "best" | "best_row") -> name -> value
    for job_id, scope, name, value, _ in ctx.ledger.metric_values(sorted(set(source.values())),
                                                                   ("final", "best", "best_row")):
        values.setdefault((job_id, scope), {})[name] = value
    tried: dict[str, list[Attempt]] = {}
    for att in ctx.ledger.attempts_of(ids):  # by job, then number: the last is the newest
        tried.setdefault(att.job_id, []).append(att)
    # checkpoints count only against work lost (cost.job_cost): read for the jobs that lost some
    saved = ctx.ledger.checkpoints_of(j for j, atts in tried.items() if any(a.state in LOST_STATES for a in atts))
    restarts = ctx.ledger.rule_counts(ids, FROM_SCRATCH)  # among each job's newest 200 events, as ever
    verified = ctx.ledger.verified_pulls(sorted(set(source.values())))
    sweep_row = ctx.ledger.sweep(sweep_id)
    metric, mode = observed.headline(sweep_row.run_config() if sweep_row is not None else None)
    git = (sweep_row.git_commit, sweep_row.git_dirty) if sweep_row is not None else ("", None)
    on_cpu = cpu_slots(ctx)
    parts = {p.number: p for p in ctx.ledger.parts_of(sweep_id) if p.number > 1}
    warned = ctx.ledger.open_findings(ids)  # a [run] metrics that gave no value says why
    for job in jobs:
        event = warned.get((job.id, observed.METRICS_RULE))
        if event is not None and job.id not in errors:
            errors[job.id] = event.reason
    now = time.time()
    rows = []
    for job in jobs:
        attempts = tried.get(job.id, [])
        newest = attempts[-1] if attempts else None
        entry = ResultRow(job, values.get((source[job.id], "final"), {}), values.get((source[job.id], "best"), {}),
                          newest,
                          metric=metric, mode=mode, error=errors.get(job.id, ""),
                          provenance=ran_with(newest.provenance) if newest is not None else None,
                          git=git, best_row=values.get((source[job.id], "best_row"), {}))
        entry.cost = job_cost(job.gpus * job.nodes, attempts, saved.get(job.id, []), now, on_cpu)
        entry.restarts_from_scratch = restarts.get(job.id, 0)
        if job.part in parts:
            entry.joined, entry.joined_at = parts[job.part].line, parts[job.part].created_at
        mark = verified.get(source[job.id])
        if mark is not None:
            present = (Path(mark.local_dir) / transfer.PULL_VERIFIED).is_file()
            entry.pulled, entry.local_dir = ("verified" if present else "missing"), mark.local_dir
        rows.append(entry)
    if not rows:
        raise JobNotFound(f"sweep {sweep_id} has no jobs")
    return rows
