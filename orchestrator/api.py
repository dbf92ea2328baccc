"""The verbs of gpuq: submit, status, wait, logs, cancel, results.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import controller, fleet, protocol, transfer
from orchestrator.bundle import Bundle, build_bundle, payload_dir
from orchestrator.config import LOCAL_HOST, Settings, load_settings
from orchestrator.errors import GpuqError, JobNotFound, UsageError
from orchestrator.fleet import Fleet
from orchestrator.hosts.base import Host
from orchestrator.launcher import agent_argv
from orchestrator.ledger import Attempt, Job, Ledger, Sweep
from orchestrator.ledger import Host as HostRow
from orchestrator.queuefile import parse_queue
from orchestrator.scheduler import EpochRates, epoch_rates, plan
from orchestrator.specs import job_id_for, new_queue_id, spec_hash_for
from orchestrator.states import JobState


@dataclass
class Context:
    settings: Settings
    ledger: Ledger
    fleet: Fleet

    def close(self) -> None:
        self.fleet.close()
        self.ledger.close()


def open_context(*, overrides: dict[str, Any] | None = None, project_dir: Path | None = None) -> Context:
    settings = load_settings(overrides=overrides, project_dir=project_dir)
    ledger = Ledger(settings.ledger_path)
    return Context(settings, ledger, Fleet(settings, ledger))


# --- hosts ------------------------------------------------------------------------


def _local(ctx: Context) -> Host:
    return ctx.fleet.local()


def host_for(ctx: Context, row: HostRow) -> Host:
    """The command's one Host object for ``row`` (its SSH connection is reused by every call)."""
    return ctx.fleet.host(row)


def hosts_add(ctx: Context, name: str, target: str, *, port: int | None = None, key: str = "",
              profile: str = fleet.DEFAULT_SSH_PROFILE, root: str = "", python: str = "",
              trust_new_host_key: bool = False) -> fleet.Registered:
    """Register an SSH host after a strictly verified connection and a one-round-trip audit."""
    return fleet.register(ctx.ledger, ctx.settings, name, target, port=port, key=key, profile=profile, root=root,
                          python=python, trust_new_host_key=trust_new_host_key)


def hosts_list(ctx: Context) -> list[HostRow]:
    return ctx.ledger.hosts()


@dataclass
class HostDetail:
    row: HostRow
    active: list[Job]
    unverified: list[Job]
    fingerprint: str
    events: list[Any]


def hosts_show(ctx: Context, name: str) -> HostDetail:
    row = ctx.ledger.host(name)
    if row is None:
        raise UsageError(f'unknown host "{name}"; `gpuq hosts list` shows the registered ones')
    active = [j for j in ctx.ledger.jobs(states=controller.ACTIVE) if j.host == name]
    return HostDetail(row, active, _unverified_on(ctx, name), fleet.key_fingerprint(row.host_key),
                      ctx.ledger.events(subject=name, limit=10))


def _unverified_on(ctx: Context, name: str) -> list[Job]:
    """Succeeded jobs whose results on ``name`` have not been pulled and verified."""
    verified = _verified_ids(ctx)
    return [j for j in ctx.ledger.jobs(states=[JobState.SUCCEEDED]) if j.host == name and j.id not in verified]


def _verified_ids(ctx: Context) -> set[str]:
    finder = getattr(ctx.ledger, "verified_job_ids", None)
    return set(finder()) if callable(finder) else set()


def hosts_rm(ctx: Context, name: str, *, force: bool = False) -> None:
    """Forget a host.  Refused while jobs run there or its results are unverified (unless forced)."""
    detail = hosts_show(ctx, name)
    if detail.row.kind == "local":
        raise UsageError(f'"{name}" is the embedded local host; it cannot be removed')
    if detail.active:
        raise UsageError(f"host {name} has {len(detail.active)} unfinished jobs "
                         f"({', '.join(j.name for j in detail.active[:5])}); `gpuq cancel` them first")
    if detail.unverified and not force:
        raise UsageError(f"host {name} holds unverified results of {len(detail.unverified)} jobs "
                         f"({', '.join(j.name for j in detail.unverified[:5])}); `gpuq pull` first, "
                         "or --force to forget them")
    fleet.forget_host(ctx.ledger, ctx.settings, detail.row)


def hosts_trust(ctx: Context, name: str, fingerprint: str) -> str:
    """Replace a host's known key by the one it offers now, if it has the fingerprint the user checked."""
    return fleet.trust(ctx.ledger, ctx.settings, name, fingerprint)


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
    makespan_s: float = 0.0
    pushed_to: list[str] = field(default_factory=list)  # hosts that received the bundle's bytes


def _new_sweep_id(ctx: Context) -> str:
    taken = ctx.ledger.sweep_ids()
    while True:
        candidate = new_queue_id(os.urandom(4))
        if candidate not in taken:
            return candidate


def _target_rows(ctx: Context, hosts: Sequence[str], pins: set[str]) -> list[HostRow]:
    """Hosts a submit may use: the named ones; else every remote host (local only when none is
    registered); plus any host a queue line pins with ``host=``."""
    remote = ctx.fleet.remote_rows()
    if hosts:
        names = list(dict.fromkeys(hosts))
    elif remote:
        names = [row.name for row in remote]
    else:
        names = [LOCAL_HOST]
    names += sorted(pins - set(names))
    rows = []
    for name in names:
        row = ctx.ledger.host(name)
        if row is None and name == LOCAL_HOST:  # registered by its first real use, never by a dry run
            row = HostRow(name=LOCAL_HOST, kind="local", root=str(ctx.settings.local_host_root), created_at=0.0)
        if row is not None:
            rows.append(row)
    return rows


def submit(ctx: Context, queue: Path, *, hosts: Sequence[str] = (), dry_run: bool = False) -> SubmitResult:
    """Validate the whole queue, record it in one transaction, place and start its jobs.

    Jobs are packed across the target hosts (see ``_target_rows``) by ``scheduler.plan``; the
    bundle is pushed to every host that gets work before anything is written, and a host
    whose push fails is left out of the plan.
    """
    known = _known_hosts(ctx)
    for name in hosts:
        if name not in known:
            raise UsageError(f'unknown host "{name}"; known hosts: {", ".join(sorted(known))} '
                             "(`gpuq hosts add` registers one)")
    entry = ctx.settings.entry
    parsed = parse_queue(queue, known_hosts=known, tasks=None if entry else _payload_tasks())
    if entry:
        path = Path(parsed.workdir) / entry
        if entry.startswith("/") or ".." in Path(entry).parts or not path.is_file():
            raise UsageError(f"entry = {entry!r} (gpuq.toml / GPUQ_ENTRY): must name a file inside the project "
                             f"{parsed.workdir}; nothing was submitted")
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
    sweep_id = _new_sweep_id(ctx)
    rates = epoch_rates(ctx.ledger.run_history())
    ckpt = ctx.ledger.checkpoint_bytes_by_config()
    plan_jobs = [
        controller.plan_job(job_id_for(sweep_id, j.name), gpus=j.gpus, config=j.config, task=j.task,
                            epochs=j.epochs, est_min=j.est_min, host_pin=j.host, rates=rates, ckpt_bytes=ckpt)
        for j in parsed.jobs
    ]
    rows = _target_rows(ctx, hosts, {j.host for j in parsed.jobs if j.host})
    pushed: list[str] = []
    if dry_run:
        decided = plan(plan_jobs, controller.capacities(ctx.ledger, ctx.settings, rows, rates))
        dropped: dict[str, str] = {}
    else:
        decided, dropped = controller.plan_and_push(ctx.ledger, ctx.fleet, ctx.settings, plan_jobs, rows, bundle,
                                                    rates, pushed)
    warnings += [f"host {name} left out: {why}" for name, why in sorted(dropped.items())]
    if decided.unplaced:
        names = {job_id_for(sweep_id, j.name): (j.name, j.line) for j in parsed.jobs}
        lines = [f"{queue}:{names[jid][1]}: job {names[jid][0]!r} cannot be placed: {why}"
                 for jid, why in decided.unplaced]
        raise UsageError("\n".join([*lines, "nothing was submitted"]))
    placements = {a.job_id: a.host for a in decided.assignments}
    if dry_run:
        return SubmitResult(sweep_id, str(queue), [], bundle, placements, warnings, True,
                            makespan_s=decided.makespan_s)
    rows_added = ctx.ledger.add_sweep(
        sweep_id=sweep_id,
        queue_path=str(queue),
        workdir=str(workdir.resolve()),
        queue_text=queue.read_text(encoding="utf-8-sig", errors="replace"),
        jobs=parsed.jobs,
        default_retries=ctx.settings.retries,
        bundle_sha=bundle.sha256,
        hosts=list(dict.fromkeys(hosts)),
        entry=ctx.settings.entry,
        launcher=ctx.settings.launcher,
        verify=ctx.settings.verify,
    )
    result = SubmitResult(sweep_id, str(queue), rows_added, bundle, placements, warnings, False,
                          makespan_s=decided.makespan_s, pushed_to=sorted(pushed))
    failed = controller.deliver(ctx.ledger, ctx.fleet, ctx.settings, decided, {j.id: j for j in rows_added},
                                bundle.sha256)
    if failed:
        for name, err in failed.items():
            ctx.ledger.record_event("sweep", sweep_id, f"delivery to {name} failed: {err}")
        result.launch_error = "; ".join(f"{err} (recorded; `gpuq status` retries the delivery)"
                                        for err in failed.values())
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
    """Probe every host once (in parallel), reconcile the ledger, collect results, move waiting
    jobs to idle hosts, and dispatch jobs still QUEUED."""
    pairs = [(host_for(ctx, row), row.agent_bundle) for row in ctx.ledger.hosts()]
    probes = controller.probe_all(pairs, ctx.settings)
    by_name = {h.name: (h, sha) for h, sha in pairs}
    for report in probes:
        host, sha = by_name[report.host]
        if not report.ok:
            row = ctx.ledger.host(report.host)
            if report.reachable:
                ctx.ledger.update_host(report.host, last_probe_at=time.time(), unreachable_since=None)
            elif report.round_trips and row is not None and row.unreachable_since is None:
                ctx.ledger.update_host(report.host, unreachable_since=time.time())
                ctx.ledger.record_event("host", report.host, f"unreachable: {report.error}")
            continue
        done = controller.reconcile(ctx.ledger, host, ctx.settings, report)
        try:
            controller.collect(ctx.ledger, host, sha, done)
        except GpuqError as exc:  # results are collected again by `gpuq results`; never fail a tick
            ctx.ledger.record_event("host", host.name, f"collecting results failed: {exc}")
    rates = epoch_rates(ctx.ledger.run_history())
    controller.steal(ctx.ledger, ctx.fleet, ctx.settings, probes, rates)
    _dispatch_queued(ctx, rates)
    return {p.host: p for p in probes}


def _dispatch_queued(ctx: Context, rates: EpochRates) -> None:
    """Place QUEUED jobs (a submit killed after its ledger write, or a host left out at submit)."""
    queued = ctx.ledger.jobs(states=[JobState.QUEUED])
    if not queued:
        return
    for sweep_id in sorted({j.sweep_id for j in queued}):
        sweep = ctx.ledger.sweep(sweep_id)
        if sweep is None:
            continue
        bundle_path = ctx.settings.bundle_cache / f"{sweep.bundle_sha}.tar"
        if not bundle_path.is_file():
            ctx.ledger.record_event("sweep", sweep_id, "bundle missing from the cache; cannot launch queued jobs")
            continue
        bundle = Bundle(sweep.bundle_sha, bundle_path, 0, bundle_path.stat().st_size)
        jobs = {j.id: j for j in queued if j.sweep_id == sweep_id}
        ckpt = ctx.ledger.checkpoint_bytes_by_config()
        plan_jobs = [controller.plan_job(j.id, gpus=j.gpus, config=j.config, task=j.task, epochs=j.epochs,
                                         est_min=j.est_min, host_pin=j.host_pin, rates=rates, ckpt_bytes=ckpt)
                     for j in jobs.values()]
        rows = _target_rows(ctx, sorted(sweep.host_set()), {j.host_pin for j in jobs.values() if j.host_pin})
        try:
            decided, _ = controller.plan_and_push(ctx.ledger, ctx.fleet, ctx.settings, plan_jobs, rows, bundle,
                                                  rates)
        except GpuqError as exc:
            ctx.ledger.record_event("sweep", sweep_id, f"cannot place queued jobs yet: {exc}")
            continue
        for job_id, why in decided.unplaced:
            ctx.ledger.record_event("job", job_id, f"still queued: {why}")
        failed = controller.deliver(ctx.ledger, ctx.fleet, ctx.settings, decided, jobs, bundle.sha256)
        for name, err in failed.items():
            ctx.ledger.record_event("sweep", sweep_id, f"delivery to {name} failed: {err}")


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
    pulled: str = ""  # "verified" (local copy in local_dir), "missing" (verified, copy gone), "" (not pulled)
    local_dir: str = ""


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
    verified = ctx.ledger.verified_jobs(sweep_id)
    rows = []
    for job in jobs:
        final = {m.name: m.value for m in metrics if m.job_id == job.id and m.scope == "final"}
        best = {m.name: m.value for m in metrics if m.job_id == job.id and m.scope == "best"}
        entry = ResultRow(job, final, best, latest.get(job.id))
        mark = verified.get(job.id)
        if mark is not None:
            present = (Path(mark.local_dir) / transfer.PULL_VERIFIED).is_file()
            entry.pulled, entry.local_dir = ("verified" if present else "missing"), mark.local_dir
        rows.append(entry)
    if not rows:
        raise JobNotFound(f"sweep {sweep_id} has no jobs")
    return rows


# --- pull -------------------------------------------------------------------------


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
        """At least one job verified, and every job not written off is verified (DOMAIN.md 18.7)."""
        return bool(self.verified) and all(o.verified or o.job_id in self.written_off for o in self.outcomes)


def _not_pullable(job: Job) -> str:
    state = JobState(job.state)
    if state == JobState.CANCELLED:
        return "cancelled by the user: nothing to pull"
    if not state.terminal and state != JobState.LOST:
        return f"still {job.state}; pull once it has succeeded (`gpuq wait`)"
    return f"{job.state}: no results to pull (the log is evidence: `gpuq logs {job.id}`)"


def pull(ctx: Context, *, sweep: str | None = None) -> PullReport:
    """Bring the results of the sweep's SUCCEEDED jobs home into ``$GPUQ_HOME/results/<sweep>/<job>/``.

    One tick first (a job that finished unwatched becomes SUCCEEDED), then per host one
    ``manifest`` round trip and the transfers; every copy is verified against its manifest before
    the ledger calls it verified (transfer.pull).  Verified jobs are not fetched again.
    """
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    tick(ctx)
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    if not jobs:
        raise JobNotFound(f"sweep {sweep_id} has no jobs")
    results_dir = ctx.settings.home / "results"
    quarantine_dir = ctx.settings.home / protocol.QUARANTINE_DIR
    outcomes: dict[str, transfer.PullOutcome] = {}
    by_host: dict[str, list[Job]] = {}
    for job in jobs:
        row = ctx.ledger.host(job.host) if job.host else None
        if job.state != JobState.SUCCEEDED.value:
            why = _not_pullable(job)
        elif row is None:
            why = f"it ran on host {job.host!r}, which is no longer registered"
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
                got = transfer.pull_jobs(ctx.ledger, host, agent_argv(host, row.agent_bundle), group, results_dir,
                                         quarantine_dir)
            except GpuqError as exc:
                got = [transfer.PullOutcome(j.id, j.name, sweep_id, name, transfer.NOT_PULLED, str(exc))
                       for j in group]
            outcomes.update((o.job_id, o) for o in got)
    written_off = {j.id for j in jobs if j.state == JobState.CANCELLED.value}
    return PullReport(sweep_id, results_dir / sweep_id, [outcomes[j.id] for j in jobs], written_off)
