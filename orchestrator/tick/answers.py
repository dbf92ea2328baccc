"""One host's answer, acted on: a failed probe (backoff, lease check), or a status document
(patrol, reconcile, stalled kills, checkpoint shipping, results).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from orchestrator.context import Context, host_for
from orchestrator.core.errors import GpuqError
from orchestrator.health import stops
from orchestrator.health.host_lines import host_line
from orchestrator.health.patrol import (
    Finding,
    HostView,
    JobView,
    Severity,
    Thresholds,
    ended_badly,
    host_findings,
    job_findings,
    unreachable,
)
from orchestrator.host_documents import JobEntry
from orchestrator.ledger import Attempt, HostRow, Job
from orchestrator.tick import gangs, host_answers
from orchestrator.tick.checkpoints import ship_checkpoints, ship_wanted
from orchestrator.tick.collect import collect
from orchestrator.tick.ending import end_attempt
from orchestrator.tick.findings import (
    TickReport,
    early_finishes,
    holds,
    record,
    resumed,
)
from orchestrator.tick.leases import check_lease
from orchestrator.tick.probe import Probe
from orchestrator.tick.reconcile import HEALED, Settled, reconcile


def failed_probe(ctx: Context, row: HostRow, probe: Probe, now: float, th: Thresholds,
                  report: TickReport) -> None:
    if probe.reachable:  # the link works; the agent could not answer (no bundle yet, or it failed)
        ctx.ledger.update_host(row.name, last_probe_at=now, unreachable_since=None, probe_failures=0,
                               next_probe_at=None)
        report.lines.append(host_line(row.name, None, (), error=probe.error or "reachable"))
        record(ctx, host_answers.protocol_findings(row.name, probe.error), subjects=[], report=report)
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
        verdict = check_lease(ctx, row)
        if verdict is not None:
            report.actions.append(f"{row.name}: {verdict.replace('_', ' ')}; its jobs wait for `gpuq resume`")
    if verdict is None:
        record(ctx, [unreachable(view, probe.error, now, th)], subjects=[], report=report)
    report.lines.append(host_line(row.name, None, (), unreachable_since=since, failures=failures, next_try=next_at))


def patrol_host(ctx: Context, row: HostRow, probe: Probe, mine: Sequence[Job],
                 attempts: dict[str, Attempt], now: float, th: Thresholds, report: TickReport,
                 parts: Mapping[str, Sequence[gangs.Part]]) -> list[str]:
    """Patrol and reconcile one host that answered; returns the multi-node attempts that ended there."""
    host = host_for(ctx, row)
    doc = probe.document
    findings = host_findings(HostView(row.name, row.oom_kill, row.unreachable_since, 0), doc, th)
    if doc.kernel is not None and doc.kernel.cursor:
        ctx.ledger.update_host(row.name, kernel_cursor=doc.kernel.cursor)
    entries = doc.entries()
    ending = _job_findings(ctx, row.name, mine, entries, attempts, now, th, findings)
    # a rented host whose jobs just exited on SIGTERM that gpuq did not send: a preemption in its
    # grace window (the machine still answers).  Ask the provider before reconcile calls it a failure.
    if row.provider and row.instance_id and any(stops.interrupted(entries.get(j.id)) for j in mine):
        verdict = check_lease(ctx, row)
        if verdict is not None:
            report.actions.append(f"{row.name}: {verdict.replace('_', ' ')}; its jobs wait for `gpuq resume`")
    # record this tick's crash evidence before reconcile classifies attempts that just ended
    subjects = [row.name] + [j.id for j in mine]
    record(ctx, findings, subjects=subjects, report=report)
    done = reconcile(ctx.ledger, host, ctx.settings, probe, parts)
    ended = _settled_findings(ctx, row.name, done.settled, report)
    record(ctx, ended, subjects=[], report=report)
    for job, finding in ending:
        end_attempt(ctx, host, row, job, finding, report)
    resumed(ctx, row.name, mine, entries, report)
    if ship_wanted(ctx.settings, row):
        ship_checkpoints(ctx, row, doc)
    holds(ctx, row, findings)
    if done.succeeded:
        early_finishes(ctx, row.name, done.succeeded, report)
        try:
            collect(ctx.ledger, host, row.agent_bundle, done.succeeded, probe)
        except GpuqError as exc:  # results are collected again by `gpuq results`; never fail a tick
            ctx.ledger.record_event("host", row.name, f"collecting results failed: {exc}", unless_repeated=True)
    report.lines.append(host_line(row.name, doc, findings))
    return done.multi_node_ended


def _job_findings(ctx: Context, host: str, mine: Sequence[Job], entries: Mapping[str, JobEntry],
                  attempts: dict[str, Attempt], now: float, th: Thresholds,
                  findings: list[Finding]) -> list[tuple[Job, Finding]]:
    """Each current attempt's findings (added to ``findings``) and scan offsets; returns the running
    attempts to end (a stall, a deadlock at start, a divergence), each with the first finding that ends it."""
    ending: list[tuple[Job, Finding]] = []
    for job in mine:
        entry = entries.get(job.id)
        if entry is None or entry.attempt != job.attempt_count:
            continue
        att = attempts.get(job.id)
        stepped = att is not None and att.number == job.attempt_count and (
            (att.step or 0) > 0 or att.resumed_step is not None or bool(att.resume_from))
        view = JobView(job.id, job.name, job.attempt_count, att.started_at if att else None, stepped=stepped)
        found = job_findings(host, view, entry, now, th)
        findings += found
        if entry.scan is not None:
            ctx.ledger.update_attempt(job.id, job.attempt_count, log_scanned=entry.scan.log_to,
                                      metrics_scanned=entry.scan.metrics_to)
        ends = [f for f in found if f.klass]
        if ends:  # a divergence first: a diverged run that also went quiet is not retried
            ending.append((job, next((f for f in ends if f.klass == "divergence"), ends[0])))
    return ending


def _settled_findings(ctx: Context, host: str, settled: Sequence[Settled], report: TickReport) -> list[Finding]:
    """What reconcile settled this tick, as actions and "ended badly" findings.  Each names the job and
    attempt reconcile read: a job that another command placed on this host after the tick listed the
    host's jobs is settled here too."""
    ended = []
    for item in settled:
        report.actions.append(f"{item.name} ({item.job_id}): {item.decision.reason}")
        if item.outcome == HEALED:  # the patrol's own finding, as if it had seen the stall itself (once)
            if not any(e.rule == "stalled" and e.attempt == item.attempt
                       for e in ctx.ledger.events(subject=item.job_id, limit=50)):
                words = f"{item.why}; its host's agent saved where it hung, killed it and retried it"
                ended.append(Finding("stalled", Severity.ESCALATE, host, f"{item.name} a{item.attempt}: {words}",
                                     item.decision.reason, job=item.job_id, attempt=item.attempt, reason=words))
            continue
        att = ctx.ledger.attempt(item.job_id, item.attempt)
        ended.append(ended_badly(host, JobView(item.job_id, item.name, item.attempt), item.outcome, item.klass,
                                 item.decision, item.decision.action == "requeue", rebooted=item.rebooted,
                                 message=att.message if att else ""))
    return ended

