"""One controller tick: probe → reconcile → patrol → collect → stop → seeds=auto → steal → dispatch → budget → billing
(docs/health.md).

Every host gets exactly one read-only round trip (the agent's ``status --json``, carrying the
patrol's scan offsets and kernel-log cursor).  The patrol rules (``orchestrator.health.patrol``) turn
what came back into findings, stored as events with a severity and an action; the policy acts
on the few that have an automatic remedy (a dead or stalled attempt is requeued with resume while
retries last; a full disk or a bad GPU holds the host).  Last, the rented hosts' billing
(``tick/billing.py``): a down-when-done host whose work is over has its results brought home
verified and is terminated; an idle rented host is alerted on; a rented machine still provisioning past the
readiness window (its `gpuq up` gone) is settled (``tick/provisioning.py``).  Before that, each unfinished capped
sweep is counted against its budget (``tick/budget.py``: dispatch itself starts only what the budget
fits).  Between collect and dispatch, early stopping (``tick/stopping.py``, docs/stopping.md): a sweep's
``[stop]`` policy looks at its cells at the rungs, records each look, then stops the cells that lost, so
that dispatch hands their slots on in the same tick.
Before placement, a ``seeds=auto`` sweep whose jobs have all ended gets its next seeds as QUEUED
jobs (``tick/autoseeds.py``), so dispatch starts them in the same tick.  Every tick yields one line per
host, also when nothing changed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from orchestrator.context import Context, host_for
from orchestrator.core.states import LEASE_UNPROBED, HoldKind, JobState
from orchestrator.health.host_lines import host_line
from orchestrator.ledger import Attempt, HostRow, Job
from orchestrator.scheduling.estimates import epoch_rates
from orchestrator.tick import (
    ACTIVE,
    autoseeds,
    billing,
    budget,
    gangs,
    host_answers,
    multinode,
    provisioning,
    stopping,
)
from orchestrator.tick.answers import failed_probe, patrol_host
from orchestrator.tick.dispatch import dispatch_queued
from orchestrator.tick.findings import (
    TickReport,
    sweeps_done,
    thresholds,
)
from orchestrator.tick.probe import Probe, ProbeRequest, probe_all
from orchestrator.tick.steal import steal


def run_tick(ctx: Context, *, honour_backoff: bool = False) -> TickReport:
    """``honour_backoff``: skip hosts still backing off after failed probes (`gpuq watch`);
    an interactive `gpuq status` probes every host."""
    now = time.time()
    th = thresholds(ctx)
    report = TickReport()
    rows = ctx.ledger.hosts()
    active = ctx.ledger.jobs(states=ACTIVE)
    attempts = ctx.ledger.latest_attempts(j.id for j in active)
    by_host: dict[str, list[Job]] = {}
    for job in active:
        by_host.setdefault(job.host or "", []).append(job)
    stopped_sweeps = stopping.watched(ctx.ledger, active)  # sweeps with a [stop] policy and work on hosts
    curves_for = stopping.curves_wanted(active, stopped_sweeps)
    requests, waiting = _requests(ctx, rows, by_host, attempts, now, honour_backoff, curves_for)
    probes = host_answers.only_known(ctx.ledger, probe_all(requests, ctx.settings))
    row_by_name = {r.name: r for r in rows}
    parts = gangs.parts_this_tick(active, attempts, {p.host: p.doc for p in probes if p.ok and p.doc is not None})
    ended: list[str] = []
    for probe in probes:
        report.probes[probe.host] = probe
        report.round_trips[probe.host] = probe.round_trips
        row = row_by_name[probe.host]
        if not probe.ok:
            failed_probe(ctx, row, probe, now, th, report)
            continue
        with host_answers.contained(ctx.ledger, row.name, report.lines):
            ended += patrol_host(ctx, row, probe, by_host.get(row.name, []), attempts, now, th, report, parts)
    if parts:
        multinode.after_reconcile(ctx, parts, ended, report.actions)
    for row in waiting:
        report.lines.append(host_line(row.name, None, (), unreachable_since=row.unreachable_since,
                                      failures=row.probe_failures, next_try=row.next_probe_at))
    if stopped_sweeps:
        stopping.record_partials(ctx.ledger, probes, curves_for)
        stopping.stop_stage(ctx, report, stopped_sweeps)
    unsettled = autoseeds.add_seeds(ctx, report)
    _place(ctx, probes)
    budget.check(ctx.ledger, ctx.settings, report)
    billing.billing(ctx, report, {p.host for p in probes if p.ok})
    provisioning.watch_provisioning(ctx, report)
    sweeps_done(ctx, report, unsettled)
    return report


def _requests(ctx: Context, rows: Sequence[HostRow], by_host: dict[str, list[Job]], attempts: dict[str, Attempt],
              now: float, honour_backoff: bool, curves_for: set[str]) -> tuple[list[ProbeRequest], list[HostRow]]:
    """One probe request per host (with the patrol's scan offsets, kernel cursor and the running jobs whose
    curves early stopping reads), and the hosts still backing off (skipped this tick)."""
    requests: list[ProbeRequest] = []
    waiting: list[HostRow] = []
    for row in rows:
        if row.lease in LEASE_UNPROBED or row.hold is HoldKind.REPLACED:
            continue  # a rented machine that is gone (terminated, or replaced) or not up yet: nothing to probe
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
        curves = [j.id for j in by_host.get(row.name, []) if j.id in curves_for]
        if curves:
            extra += ["--curves-for", *curves]
        requests.append((host_for(ctx, row), row.agent_bundle, [j.id for j in by_host.get(row.name, [])], extra))
    return requests, waiting


def _place(ctx: Context, probes: Sequence[Probe]) -> None:
    """A capped sweep past its cap takes back what has not started, then work stealing and dispatch of
    QUEUED jobs."""
    # placement needs the run history (one join over every finished attempt): read it only when
    # some inbox holds waiting jobs (work stealing, a budget passed) or the ledger holds QUEUED ones
    queued_remote = any(j.state == "queued" for p in probes if p.ok for j in p.document.jobs)
    queued = ctx.ledger.jobs(states=[JobState.QUEUED])
    if queued_remote or queued:
        rates = epoch_rates(ctx.ledger.run_history())
        if queued_remote:
            if budget.withdraw_over(ctx.ledger, ctx.fleet, probes, rates):
                queued = ctx.ledger.jobs(states=[JobState.QUEUED])
            steal(ctx.ledger, ctx.fleet, ctx.settings, probes, rates)
        if queued:
            dispatch_queued(ctx, rates, queued)
