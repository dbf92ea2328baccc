"""The verbs of gpuq: submit, status, wait, logs, cancel, results.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import controller, protocol
from orchestrator.bundle import Bundle, build_bundle, payload_dir
from orchestrator.config import LOCAL_HOST, Settings, load_settings
from orchestrator.errors import GpuqError, HostError, JobNotFound, UsageError
from orchestrator.hosts.base import Host
from orchestrator.hosts.local import LocalHost
from orchestrator.launcher import agent_argv, launch
from orchestrator.ledger import Attempt, Job, Ledger, Sweep
from orchestrator.ledger import Host as HostRow
from orchestrator.queuefile import parse_queue
from orchestrator.scheduler import PlanJob, plan
from orchestrator.specs import HostSlots, job_id_for, new_queue_id, spec_hash_for
from orchestrator.states import JobState

DEFAULT_EST_S_PER_EPOCH = 60.0


@dataclass
class Context:
    settings: Settings
    ledger: Ledger

    def close(self) -> None:
        self.ledger.close()


def open_context(*, overrides: dict[str, Any] | None = None, project_dir: Path | None = None) -> Context:
    settings = load_settings(overrides=overrides, project_dir=project_dir)
    return Context(settings, Ledger(settings.ledger_path))


# --- hosts ------------------------------------------------------------------------


def _local(ctx: Context) -> LocalHost:
    root = ctx.settings.local_host_root
    host = LocalHost(root, python=ctx.settings.local_python)
    ctx.ledger.ensure_host(LOCAL_HOST, kind="local", root=str(root), python=host.python)
    return host


def host_for(ctx: Context, row: HostRow) -> Host:
    if row.kind == "local":
        return _local(ctx)
    raise HostError(row.name, f"host kind {row.kind!r} is not supported by this gpuq")


def _known_hosts(ctx: Context) -> set[str]:
    return {LOCAL_HOST} | {h.name for h in ctx.ledger.hosts()}


def _payload_tasks() -> list[str]:
    tasks_file = payload_dir() / "TASKS"
    if not tasks_file.is_file():
        return []
    lines = tasks_file.read_text(encoding="utf-8").splitlines()
    return [t.strip() for t in lines if t.strip() and not t.startswith("#")]


# --- submit -----------------------------------------------------------------------


@dataclass
class SubmitResult:
    sweep_id: str
    queue_path: str
    jobs: list[Job]
    bundle: Bundle
    placements: dict[str, str]
    warnings: list[str]
    dry_run: bool
    launch_error: str = ""


def _new_sweep_id(ctx: Context) -> str:
    taken = ctx.ledger.sweep_ids()
    while True:
        candidate = new_queue_id(os.urandom(4))
        if candidate not in taken:
            return candidate


def submit(ctx: Context, queue: Path, *, host: str | None = None, dry_run: bool = False) -> SubmitResult:
    """Validate the whole queue, record it in one transaction, place and start its jobs."""
    known = _known_hosts(ctx)
    if host is not None and host not in known:
        raise UsageError(f'unknown host "{host}"; known hosts: {", ".join(sorted(known))}')
    parsed = parse_queue(queue, known_hosts=known, tasks=_payload_tasks())
    multi = [j for j in parsed.jobs if j.nodes > 1]
    if multi:
        # the agent runs single-node `torchrun --standalone`: a 2-node job would silently train
        # with half its world size, so refuse it until multi-node rendezvous exists
        lines = [f"{queue}:{j.line}: nodes={j.nodes}: multi-node jobs are not supported yet; use nodes=1"
                 for j in multi]
        raise UsageError("\n".join([*lines, "nothing was submitted"]))
    workdir = Path(parsed.workdir)
    bundle = build_bundle(workdir, ctx.settings.bundle_cache, exclude=(ctx.settings.home,))
    warnings = list(parsed.warnings)
    hashes = {spec.name: spec_hash_for(spec) for spec in parsed.jobs}
    done = ctx.ledger.succeeded_with(hashes.values())
    for spec in parsed.jobs:
        twin = done.get(hashes[spec.name])
        if twin is not None:
            warnings.append(f"{queue}:{spec.line}: job {spec.name!r} is identical to {twin.id} of sweep "
                            f"{twin.sweep_id}, which already succeeded; it will run again")
    if bundle.skipped_secrets:
        warnings.append("left out of the bundle (secret-like names): " + ", ".join(bundle.skipped_secrets[:5]))
    slots = ctx.settings.local_cpu_slots or os.cpu_count() or 1
    target = host or LOCAL_HOST
    pins = [HostSlots(host=target, total=slots)]
    sweep_id = _new_sweep_id(ctx)
    plan_jobs = [
        PlanJob(job_id_for(sweep_id, j.name), j.gpus,
                (j.est_min * 60) if j.est_min else j.epochs * DEFAULT_EST_S_PER_EPOCH, j.host)
        for j in parsed.jobs
    ]
    decided = plan(plan_jobs, pins)
    if decided.unplaced:
        names = {job_id_for(sweep_id, j.name): (j.name, j.line) for j in parsed.jobs}
        lines = [f"{queue}:{names[jid][1]}: job {names[jid][0]!r} cannot be placed: {why}"
                 for jid, why in decided.unplaced]
        raise UsageError("\n".join([*lines, "nothing was submitted"]))
    placements = {a.job_id: a.host for a in decided.assignments}
    if dry_run:
        return SubmitResult(sweep_id, str(queue), [], bundle, placements, warnings, True)
    rows = ctx.ledger.add_sweep(
        sweep_id=sweep_id,
        queue_path=str(queue),
        workdir=str(workdir.resolve()),
        queue_text=queue.read_text(encoding="utf-8-sig", errors="replace"),
        jobs=parsed.jobs,
        default_retries=ctx.settings.retries,
        bundle_sha=bundle.sha256,
    )
    result = SubmitResult(sweep_id, str(queue), rows, bundle, placements, warnings, False)
    try:
        launch(ctx.ledger, _local(ctx), bundle, rows, ctx.settings)
    except GpuqError as exc:
        ctx.ledger.record_event("sweep", sweep_id, f"launch failed: {exc}")
        result.launch_error = str(exc)
    return result


# --- status -----------------------------------------------------------------------


@dataclass
class Snapshot:
    generated_at: float
    hosts: list[HostRow]
    probes: dict[str, controller.Probe]
    sweeps: list[Sweep]
    jobs: list[Job]
    attempts: dict[str, Attempt]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)


def tick(ctx: Context) -> dict[str, controller.Probe]:
    """Probe every host once, reconcile the ledger, collect results, dispatch leftovers."""
    pairs = [(host_for(ctx, row), row.agent_bundle) for row in ctx.ledger.hosts()]
    probes = controller.probe_all(pairs, ctx.settings)
    by_name = {h.name: (h, sha) for h, sha in pairs}
    for report in probes:
        host, sha = by_name[report.host]
        if not report.ok:
            if report.round_trips:
                row = ctx.ledger.host(report.host)
                if row is not None and row.unreachable_since is None:
                    ctx.ledger.update_host(report.host, unreachable_since=time.time())
                    ctx.ledger.record_event("host", report.host, f"unreachable: {report.error}")
            continue
        done = controller.reconcile(ctx.ledger, host, ctx.settings, report)
        try:
            controller.collect(ctx.ledger, host, sha, done)
        except GpuqError as exc:  # results are collected again by `gpuq results`; never fail a tick
            ctx.ledger.record_event("host", host.name, f"collecting results failed: {exc}")
    _dispatch_queued(ctx)
    return {p.host: p for p in probes}


def _dispatch_queued(ctx: Context) -> None:
    """Launch QUEUED jobs (e.g. a submit killed after its ledger write)."""
    queued = ctx.ledger.jobs(states=[JobState.QUEUED])
    if not queued:
        return
    local = _local(ctx)
    for sweep_id in sorted({j.sweep_id for j in queued}):
        sweep = ctx.ledger.sweep(sweep_id)
        if sweep is None:
            continue
        bundle_path = ctx.settings.bundle_cache / f"{sweep.bundle_sha}.tar"
        if not bundle_path.is_file():
            ctx.ledger.record_event("sweep", sweep_id, "bundle missing from the cache; cannot launch queued jobs")
            continue
        bundle = Bundle(sweep.bundle_sha, bundle_path, 0, bundle_path.stat().st_size)
        launch(ctx.ledger, local, bundle, [j for j in queued if j.sweep_id == sweep_id], ctx.settings)


def status(ctx: Context, *, sweep: str | None = None, probe: bool = True, all_jobs: bool = False) -> Snapshot:
    """Tick, then a snapshot: every sweep's counts, and the jobs worth showing.

    Jobs shown: the given sweep's; else every sweep with unfinished jobs (or the newest sweep
    when all are finished); ``all_jobs`` shows the whole history.
    """
    probes = tick(ctx) if probe else {}
    counts = ctx.ledger.state_counts()
    sweep_rows = ctx.ledger.sweeps()
    if sweep is not None:
        shown = {ctx.ledger.resolve_sweep(sweep).id}
    elif all_jobs:
        shown = {s.id for s in sweep_rows}
    else:
        shown = {sid for sid, states in counts.items() if any(not JobState(st).terminal for st in states)}
        if not shown and sweep_rows:
            shown = {sweep_rows[-1].id}
    order = {row.id: index for index, row in enumerate(sweep_rows)}
    jobs = [j for sid in sorted(shown, key=order.__getitem__) for j in ctx.ledger.jobs(sweep_id=sid)]
    latest = ctx.ledger.latest_attempts(j.id for j in jobs)
    return Snapshot(time.time(), ctx.ledger.hosts(), probes, sweep_rows, jobs, latest, counts=counts)


def wait(ctx: Context, *, sweep: str | None = None, interval_s: float = 2.0,
         timeout_s: float | None = None) -> Snapshot:
    """Tick until every job of the sweep is terminal (or LOST)."""
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        snap = status(ctx, sweep=sweep_id)
        if all(JobState(j.state).terminal or j.state == JobState.LOST.value for j in snap.jobs):
            return snap
        if deadline is not None and time.monotonic() > deadline:
            raise GpuqError(f"sweep {sweep_id} still running after {timeout_s:.0f} s; `gpuq status` to follow it")
        time.sleep(interval_s)


# --- logs, cancel, results --------------------------------------------------------


def _job_host(ctx: Context, job: Job) -> Host:
    if job.host is None:
        raise UsageError(f"job {job.id} ({job.name}) has not been placed on a host yet")
    row = ctx.ledger.host(job.host)
    if row is None:
        raise UsageError(f"job {job.id} ran on host {job.host!r}, which is no longer registered")
    return host_for(ctx, row)


def logs(ctx: Context, ref: str, *, follow: bool = False, poll_s: float = 1.0) -> Iterator[str]:
    """The job's log of its latest attempt; with ``follow``, until the job ends."""
    job = ctx.ledger.resolve_job(ref)
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


def cancel(ctx: Context, *, ref: str | None = None, sweep: str | None = None) -> list[CancelOutcome]:
    """Cancel one job or a sweep's unfinished jobs: one agent call per host for all of them."""
    if (ref is None) == (sweep is None):
        raise UsageError("give a job or --sweep SWEEP, not both")
    if ref is not None:
        targets = [ctx.ledger.resolve_job(ref)]
    else:
        targets = ctx.ledger.jobs(sweep_id=ctx.ledger.resolve_sweep(sweep).id)
    out: list[CancelOutcome] = []
    by_host: dict[str, list[Job]] = {}
    for job in targets:
        if JobState(job.state).terminal:
            out.append(CancelOutcome(job, f"already {job.state}"))
        elif job.host is not None and job.attempt_count:
            by_host.setdefault(job.host, []).append(job)
        else:
            ctx.ledger.transition(job.id, JobState.CANCELLED, message="cancelled by user before placement")
            out.append(CancelOutcome(job, "cancelled before placement"))
    for host_name, jobs in by_host.items():
        row = ctx.ledger.host(host_name)
        host = _job_host(ctx, jobs[0])
        argv = agent_argv(host, row.agent_bundle if row else "", "cancel", *[j.id for j in jobs])
        result = host.run(argv, timeout=60 + ctx.settings.kill_grace_s * 2)
        lines = result.stdout.strip().splitlines()
        if len(jobs) == 1:
            verdicts = {jobs[0].id: lines[0] if lines else ""}
        else:
            verdicts = dict(line.split(" ", 1) for line in lines if " " in line)
        for job in jobs:
            verdict = verdicts.get(job.id) or result.stderr.strip() or f"agent exit {result.exit_code}"
            ctx.ledger.transition(job.id, JobState.CANCELLED, message=f"cancelled by user ({verdict})")
            out.append(CancelOutcome(job, verdict))
    return out


@dataclass
class ResultRow:
    job: Job
    final: dict[str, float]
    best: dict[str, float]
    attempt: Attempt | None


def results(ctx: Context, *, sweep: str | None = None) -> list[ResultRow]:
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    have = {m.job_id for m in ctx.ledger.metrics(j.id for j in jobs)}
    pending = [j for j in jobs if j.state == JobState.SUCCEEDED.value and j.id not in have]
    for job in pending:
        row = ctx.ledger.host(job.host or "")
        if row is not None:
            controller.collect(ctx.ledger, host_for(ctx, row), row.agent_bundle, [job.id])
    metrics = ctx.ledger.metrics(j.id for j in jobs)
    latest = {a.job_id: a for a in ctx.ledger.attempts()}
    rows = []
    for job in jobs:
        final = {m.name: m.value for m in metrics if m.job_id == job.id and m.scope == "final"}
        best = {m.name: m.value for m in metrics if m.job_id == job.id and m.scope == "best"}
        rows.append(ResultRow(job, final, best, latest.get(job.id)))
    if not rows:
        raise JobNotFound(f"sweep {sweep_id} has no jobs")
    return rows
