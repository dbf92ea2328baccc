"""One controller tick: probe → reconcile → patrol → collect → steal → dispatch (docs/health.md).

Every host gets exactly one read-only round trip (the agent's ``status --json``, carrying the
patrol's scan offsets and kernel-log cursor).  The patrol rules (``orchestrator.patrol``) turn
what came back into findings, stored as events with a severity and an action; the policy acts
on the few that have an automatic remedy (a dead or stalled attempt is requeued with resume while
retries last; a full disk or a bad GPU holds the host).  Every tick yields one line per host,
also when nothing changed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from orchestrator import controller, gangs, notify, stops
from orchestrator.api import host_answers, multinode
from orchestrator.api.checkpoints import place_checkpoint, ship_checkpoints, ship_wanted
from orchestrator.api.submit import _target_rows
from orchestrator.bundle import Bundle
from orchestrator.context import Context, host_for
from orchestrator.errors import GpuqError, HostError
from orchestrator.host_documents import JobEntry
from orchestrator.hosts.base import Host
from orchestrator.launcher import agent_argv
from orchestrator.ledger import Attempt, HostRow, Job
from orchestrator.patrol import (
    Finding,
    HostView,
    JobView,
    Severity,
    Thresholds,
    early_finish,
    ended_badly,
    host_findings,
    host_line,
    job_findings,
    unreachable,
)
from orchestrator.scheduler import EpochRates, Plan, epoch_rates, estimate_s
from orchestrator.setup_holds import held_bundles, is_held
from orchestrator.states import AttemptState, JobState

PERSISTENT_RULES = frozenset({"unreachable", "disk", "inodes", "memory", "stalled", "protocol"})  # open till cleared


@dataclass
class TickReport:
    probes: dict[str, controller.Probe] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # one per host (docs/health.md)
    findings: list[Finding] = field(default_factory=list)  # newly recorded this tick
    actions: list[str] = field(default_factory=list)  # what the policy did, one line each
    round_trips: dict[str, int] = field(default_factory=dict)


def thresholds(ctx: Context) -> Thresholds:
    return Thresholds(stall_after_s=ctx.settings.stall_after_s, startup_grace_s=ctx.settings.startup_grace_s)


def run_tick(ctx: Context, *, honour_backoff: bool = False) -> TickReport:
    """``honour_backoff``: skip hosts still backing off after failed probes (`gpuq watch`);
    an interactive `gpuq status` probes every host."""
    now = time.time()
    th = thresholds(ctx)
    report = TickReport()
    rows = ctx.ledger.hosts()
    active = ctx.ledger.jobs(states=controller.ACTIVE)
    attempts = ctx.ledger.latest_attempts(j.id for j in active)
    by_host: dict[str, list[Job]] = {}
    for job in active:
        by_host.setdefault(job.host or "", []).append(job)
    requests: list[controller.ProbeRequest] = []
    waiting: list[HostRow] = []
    for row in rows:
        if row.lease_state == "terminated" or row.hold_reason.startswith("lease "):
            continue  # a rented machine that is gone (terminated, or replaced): nothing to probe
        if honour_backoff and row.next_probe_at is not None and row.next_probe_at > now:
            waiting.append(row)
            continue
        extra: list[str] = []
        scans = []
        for job in by_host.get(row.name, []):
            att = attempts.get(job.id)
            if att is not None and att.number == job.attempt_count:
                scans.append(f"{job.id}:{att.number}:{att.log_scanned}:{att.metrics_scanned}")
        if scans:
            extra += ["--scan", *scans]
        if row.kernel_cursor:
            extra += ["--kernel-since", row.kernel_cursor]
        requests.append((host_for(ctx, row), row.agent_bundle, [j.id for j in by_host.get(row.name, [])], extra))
    probes = host_answers.only_known(ctx.ledger, controller.probe_all(requests, ctx.settings))
    row_by_name = {r.name: r for r in rows}
    parts = gangs.parts_this_tick(active, attempts, {p.host: p.doc for p in probes if p.ok and p.doc is not None})
    ended: list[str] = []
    for probe in probes:
        report.probes[probe.host] = probe
        report.round_trips[probe.host] = probe.round_trips
        row = row_by_name[probe.host]
        if not probe.ok:
            _failed_probe(ctx, row, probe, now, th, report)
            continue
        with host_answers.contained(ctx.ledger, row.name, report.lines):
            ended += _patrol_host(ctx, row, probe, by_host.get(row.name, []), attempts, now, th, report, parts)
    if parts:
        multinode.after_reconcile(ctx, parts, ended, report.actions)
    for row in waiting:
        report.lines.append(host_line(row.name, None, (), unreachable_since=row.unreachable_since,
                                      failures=row.probe_failures, next_try=row.next_probe_at))
    # placement needs the run history (one join over every finished attempt): read it only when
    # some inbox holds waiting jobs (work stealing) or the ledger holds QUEUED ones
    queued_remote = any(j.state == "queued" for p in probes if p.ok and p.doc is not None for j in p.doc.jobs)
    queued = ctx.ledger.jobs(states=[JobState.QUEUED])
    if queued_remote or queued:
        rates = epoch_rates(ctx.ledger.run_history())
        if queued_remote:
            controller.steal(ctx.ledger, ctx.fleet, ctx.settings, probes, rates)
        if queued:
            dispatch_queued(ctx, rates, queued)
    _sweeps_done(ctx, report)
    return report


def _failed_probe(ctx: Context, row: HostRow, probe: controller.Probe, now: float, th: Thresholds,
                  report: TickReport) -> None:
    if probe.reachable:  # the link works; the agent could not answer (no bundle yet, or it failed)
        ctx.ledger.update_host(row.name, last_probe_at=now, unreachable_since=None, probe_failures=0,
                               next_probe_at=None)
        report.lines.append(host_line(row.name, None, (), error=probe.error or "reachable"))
        _record(ctx, host_answers.protocol_findings(row.name, probe.error), subjects=[], report=report)
        return
    failures = row.probe_failures + 1
    since = row.unreachable_since or now
    # min(cap, tick × 2^k) ± 20 % jitter: reconnect storms trip MaxStartups, gateways and fail2ban
    delay = min(ctx.settings.patrol_max_backoff_s, ctx.settings.patrol_interval_s * 2 ** (failures - 1))
    next_at = now + delay * random.uniform(0.8, 1.2)
    ctx.ledger.update_host(row.name, unreachable_since=since, probe_failures=failures, next_probe_at=next_at)
    view = HostView(row.name, row.oom_kill, since, failures)
    verdict = None
    if row.provider and row.instance_id:  # a rented host: its provider says whether it is gone and why
        from orchestrator.api.cloud import check_lease

        verdict = check_lease(ctx, row)
        if verdict is not None:
            report.actions.append(f"{row.name}: {verdict.replace('_', ' ')}; its jobs wait for `gpuq resume`")
    if verdict is None:
        _record(ctx, [unreachable(view, probe.error, now, th)], subjects=[], report=report)
    report.lines.append(host_line(row.name, None, (), unreachable_since=since, failures=failures, next_try=next_at))


def _patrol_host(ctx: Context, row: HostRow, probe: controller.Probe, mine: Sequence[Job],
                 attempts: dict[str, Attempt], now: float, th: Thresholds, report: TickReport,
                 parts: Mapping[str, Sequence[gangs.Part]]) -> list[str]:
    """Patrol and reconcile one host that answered; returns the multi-node attempts that ended there."""
    host = host_for(ctx, row)
    doc = probe.doc
    assert doc is not None  # an ok probe carries its document
    findings = host_findings(HostView(row.name, row.oom_kill, row.unreachable_since, 0), doc, th)
    if doc.kernel is not None and doc.kernel.cursor:
        ctx.ledger.update_host(row.name, kernel_cursor=doc.kernel.cursor)
    entries = doc.entries()
    stalled: list[Job] = []
    for job in mine:
        entry = entries.get(job.id)
        if entry is None or entry.attempt != job.attempt_count:
            continue
        att = attempts.get(job.id)
        view = JobView(job.id, job.name, job.attempt_count, att.started_at if att else None)
        found = job_findings(row.name, view, entry, now, th)
        findings += found
        if entry.scan is not None:
            ctx.ledger.update_attempt(job.id, job.attempt_count, log_scanned=entry.scan.log_to,
                                      metrics_scanned=entry.scan.metrics_to)
        if any(f.rule == "stalled" for f in found):
            stalled.append(job)
    # a rented host whose jobs just exited on SIGTERM that gpuq did not send: a preemption in its
    # grace window (the machine still answers).  Ask the provider before reconcile calls it a failure.
    if row.provider and row.instance_id and any(stops.interrupted(entries.get(j.id)) for j in mine):
        from orchestrator.api.cloud import check_lease

        verdict = check_lease(ctx, row)
        if verdict is not None:
            report.actions.append(f"{row.name}: {verdict.replace('_', ' ')}; its jobs wait for `gpuq resume`")
    # record this tick's crash evidence before reconcile classifies attempts that just ended
    subjects = [row.name] + [j.id for j in mine]
    _record(ctx, findings, subjects=subjects, report=report)
    done = controller.reconcile(ctx.ledger, host, ctx.settings, probe, parts)
    names = {j.id: j for j in mine}
    ended = []
    for item in done.settled:
        job = names[item.job_id]
        report.actions.append(f"{job.name} ({item.job_id}): {item.decision.reason}")
        att = ctx.ledger.attempt(job.id, job.attempt_count)
        ended.append(ended_badly(row.name, JobView(job.id, job.name, job.attempt_count), item.outcome, item.klass,
                                 item.decision.reason, item.decision.action == "requeue", rebooted=item.rebooted,
                                 message=att.message if att else ""))
    _record(ctx, ended, subjects=[], report=report)
    for job in stalled:
        _kill_stalled(ctx, host, row, job, report)
    _resumed(ctx, row.name, mine, entries, report)
    if ship_wanted(ctx.settings, row):
        ship_checkpoints(ctx, row, doc)
    _holds(ctx, row, findings)
    if done.succeeded:
        _early_finishes(ctx, row.name, done.succeeded, report)
        try:
            controller.collect(ctx.ledger, host, row.agent_bundle, done.succeeded, probe)
        except GpuqError as exc:  # results are collected again by `gpuq results`; never fail a tick
            ctx.ledger.record_event("host", row.name, f"collecting results failed: {exc}", unless_repeated=True)
    report.lines.append(host_line(row.name, doc, findings))
    return done.multi_node_ended


def _kill_stalled(ctx: Context, host: Host, row: HostRow, job: Job, report: TickReport) -> None:
    """A stalled attempt (alive, nothing written for stall_after_s) is killed by its recorded group,
    then settled like a vanished one: requeued with resume while retries last."""
    current = ctx.ledger.job(job.id)
    live = (JobState.RUNNING.value, JobState.ASSIGNED.value)
    if current.state not in live or current.attempt_count != job.attempt_count:
        return
    try:
        result = host.run(agent_argv(host, row.agent_bundle, "kill", job.id, str(job.attempt_count)),
                          timeout=ctx.settings.kill_grace_s + 60)
    except HostError as exc:
        ctx.ledger.record_event("job", job.id, f"stalled; killing it failed: {exc}", unless_repeated=True)
        return
    verdict = result.stdout.strip() or result.stderr.strip()
    if result.exit_code != 0:
        ctx.ledger.record_event("job", job.id, f"stalled; not killed: {verdict}", unless_repeated=True)
        return
    message = f"stalled: killed group of attempt {job.attempt_count} ({verdict})"
    ctx.ledger.update_attempt(job.id, job.attempt_count, message=message, ended_at=time.time())
    ctx.ledger.transition(job.id, AttemptState.LOST, attempt=job.attempt_count, message=message)
    ctx.ledger.transition(job.id, JobState.LOST, message=message)
    decision = controller.settle(ctx.ledger, job.id, "stalled", ctx.settings, attempt=job.attempt_count)
    report.actions.append(f"{job.name} ({job.id}): {decision.reason}")


def _resumed(ctx: Context, host: str, mine: Sequence[Job], entries: Mapping[str, JobEntry],
             report: TickReport) -> None:
    """Proof that a resume resumed (docs/checkpoints.md): the step the payload says it loaded, checked
    against the newest checkpoint the ledger knew when the attempt started."""
    for job in mine:
        entry = entries.get(job.id)
        resumed = entry.scan.resumed if entry is not None and entry.scan is not None else None
        if resumed is None or resumed.step is None:
            continue
        step = resumed.step
        ctx.ledger.update_attempt(job.id, job.attempt_count, resumed_step=step)
        earlier = [c for c in ctx.ledger.checkpoints(job.id) if c.attempt < job.attempt_count]
        expected = max((c.step for c in earlier), default=None)
        if expected is not None and step < expected:
            found = Finding("resume", Severity.ESCALATE, host,
                            f"{job.name} a{job.attempt_count}: resumed from step {step}, but a checkpoint of "
                            f"step {expected} existed", "the newer checkpoint was lost or not shipped: check "
                            "the host's ckpt dir and `gpuq logs`", job=job.id)
            _record(ctx, [found], subjects=[], report=report)


def _holds(ctx: Context, row: HostRow, findings: Sequence[Finding]) -> None:
    """A full data mount or a fatal Xid holds the host: no new job goes there until it clears."""
    fatal = [f for f in findings if f.rule == "xid" and f.severity == Severity.ESCALATE]
    full = [f for f in findings if f.rule in ("disk", "inodes") and f.severity == Severity.ESCALATE]
    fields: dict[str, object] = {}
    if fatal:
        fields.update(health="fail", health_at=time.time(), health_detail=fatal[0].message,
                      hold_reason=f"unhealthy: {fatal[0].message}")
    elif full and not row.hold_reason.startswith("unhealthy"):
        fields["hold_reason"] = f"disk: {full[0].message}"
    elif row.hold_reason.startswith("disk:") and not full:
        fields["hold_reason"] = ""
    if fields:
        ctx.ledger.update_host(row.name, **fields)


def _early_finishes(ctx: Context, host: str, job_ids: Sequence[str], report: TickReport) -> None:
    """A job that succeeded in under half its expected time (est_min, else the history of other
    runs of the same config, task and epochs) is suspect."""
    history: list[tuple[str, str, int, float]] | None = None
    for job_id in job_ids:
        job = ctx.ledger.job(job_id)
        att = ctx.ledger.attempt(job_id, job.attempt_count)
        if att is None or att.started_at is None or att.ended_at is None or att.resume_from or job.attempt_count > 1:
            continue  # a resumed run trains part of its epochs: no verdict
        duration = att.ended_at - att.started_at
        expected: float | None = job.est_min * 60 if job.est_min else None
        if expected is None:
            if history is None:
                history = ctx.ledger.run_history()
            own = (job.config, job.task, job.epochs, duration)
            others = list(history)
            for index in range(len(others) - 1, -1, -1):  # this run is in the history too: leave it out
                if others[index][:3] == own[:3] and abs(others[index][3] - duration) < 1e-6:
                    del others[index]
                    break
            rates = epoch_rates(others)
            if (job.config, job.task) in rates.by_config_task:
                expected = estimate_s(config=job.config, task=job.task, epochs=job.epochs, history=rates)
        found = early_finish(host, JobView(job.id, job.name, job.attempt_count), duration, expected,
                             thresholds(ctx))
        if found is not None:
            _record(ctx, [found], subjects=[], report=report)


def _record(ctx: Context, findings: Sequence[Finding], *, subjects: Sequence[str], report: TickReport) -> None:
    """Store findings as events.  A persistent condition (disk, stalled, ...) is recorded when it
    opens or changes severity, and closed with an "info" finding when it stops firing on a subject
    probed this tick; one-off findings (crash lines, Xids, deaths) are recorded every time."""
    open_ = ctx.ledger.open_findings([*subjects, *(f.subject for f in findings)])
    firing = set()
    for f in findings:
        key = (f.subject, f.rule)
        firing.add(key)
        if f.rule in PERSISTENT_RULES and key in open_ and open_[key].severity == f.severity.value:
            continue
        ctx.ledger.record_finding("job" if f.job else "host", f.subject, severity=f.severity.value, rule=f.rule,
                                  message=f.message, action=f.action)
        report.findings.append(f)
        if f.severity == Severity.ESCALATE:
            notify.send(ctx.settings, ctx.ledger, {"event": "escalation", "rule": f.rule, "host": f.host,
                                                  "job": f.job, "message": f.message, "action": f.action})
    probed = set(subjects)
    for (subject, rule), event in open_.items():
        if subject in probed and rule in PERSISTENT_RULES and (subject, rule) not in firing:
            ctx.ledger.record_finding(event.kind, subject, severity="info", rule=rule,
                                      message=f"cleared: {event.message}")


def _sweeps_done(ctx: Context, report: TickReport) -> None:
    """Announce each sweep once, when its last job ends."""
    counts = ctx.ledger.state_counts()
    for sweep_id, states in counts.items():
        if any(not JobState(s).terminal and s != JobState.LOST.value for s in states):
            continue
        if ctx.ledger.open_findings([sweep_id]) or any(e.rule == "sweep_done" for e in
                                                       ctx.ledger.events(subject=sweep_id, limit=20)):
            continue
        summary = ", ".join(f"{state}={n}" for state, n in sorted(states.items()))
        ctx.ledger.record_finding("sweep", sweep_id, severity="info", rule="sweep_done",
                                  message=f"sweep {sweep_id} finished: {summary}")
        notify.send(ctx.settings, ctx.ledger, {"event": "sweep_done", "sweep": sweep_id, "states": states})


def _with_checkpoints(ctx: Context, decided: Plan, jobs: dict[str, Job]) -> Plan:
    """A job resuming on a host that lacks its newest checkpoint gets the controller's verified copy
    first; a job whose copy cannot be placed waits (QUEUED) for the next tick."""
    keep = []
    for assignment in decided.assignments:
        job = jobs[assignment.job_id]
        if job.attempt_count == 0:
            keep.append(assignment)
            continue
        try:
            if assignment.peers:
                multinode.place_on_every_node(ctx, job, [assignment.host, *assignment.peers])
            else:
                place_checkpoint(ctx, job, assignment.host)
            keep.append(assignment)
        except GpuqError as exc:
            ctx.ledger.record_event("job", job.id, f"checkpoint not placed on {assignment.host}: {exc}",
                                    unless_repeated=True)
    return replace(decided, assignments=tuple(keep))


def dispatch_queued(ctx: Context, rates: EpochRates, queued: list[Job]) -> None:
    """Place QUEUED jobs: a submit killed after its ledger write, a host left out at submit, or a
    job requeued by the patrol (preferring the host that holds its checkpoint)."""
    for sweep_id in sorted({j.sweep_id for j in queued}):
        sweep = ctx.ledger.sweep(sweep_id)
        if sweep is None:
            continue
        bundle_path = ctx.settings.bundle_cache / f"{sweep.bundle_sha}.tar"
        if not bundle_path.is_file():
            ctx.ledger.record_event("sweep", sweep_id, "bundle missing from the cache; cannot launch queued jobs",
                                    unless_repeated=True)
            continue
        bundle = Bundle(sweep.bundle_sha, bundle_path, 0, bundle_path.stat().st_size)
        jobs = {j.id: j for j in queued if j.sweep_id == sweep_id}
        ckpt = ctx.ledger.checkpoint_bytes_by_config()
        rows = _target_rows(ctx, sorted(sweep.host_set()), {j.host_pin for j in jobs.values() if j.host_pin})
        holds = held_bundles(ctx.ledger, [r.name for r in rows])
        rows = [r for r in rows if not is_held(holds, r.name, sweep.bundle_sha)]  # its setup failed there
        usable = {r.name for r in rows if not r.hold_reason and r.unreachable_since is None}
        plan_jobs = []
        for j in jobs.values():
            # a requeued job resumes from the checkpoint on its last host: stay there while it is usable
            pin = j.host_pin or (j.host if j.attempt_count and j.host in usable else None)
            plan_jobs.append(controller.plan_job(j.id, gpus=j.gpus, config=j.config, task=j.task, epochs=j.epochs,
                                                 est_min=j.est_min, host_pin=pin, rates=rates, ckpt_bytes=ckpt,
                                                 nodes=j.nodes))
        try:
            decided, _ = controller.plan_and_push(ctx.ledger, ctx.fleet, ctx.settings, plan_jobs, rows, bundle,
                                                  rates)
        except GpuqError as exc:
            ctx.ledger.record_event("sweep", sweep_id, f"cannot place queued jobs yet: {exc}", unless_repeated=True)
            continue
        for job_id, why in decided.unplaced:
            ctx.ledger.record_event("job", job_id, f"still queued: {why}", unless_repeated=True)
        decided = _with_checkpoints(ctx, decided, jobs)
        failed = controller.deliver(ctx.ledger, ctx.fleet, ctx.settings, decided, jobs, bundle.sha256)
        for name, err in failed.items():
            ctx.ledger.record_event("sweep", sweep_id, f"delivery to {name} failed: {err}", unless_repeated=True)
