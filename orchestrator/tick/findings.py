"""What the tick records of the patrol's findings, and the host holds and checks that follow them."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator import notify
from orchestrator.context import Context
from orchestrator.host_documents import JobEntry
from orchestrator.ledger import HostRow, Job
from orchestrator.patrol import (
    Finding,
    JobView,
    Severity,
    Thresholds,
    early_finish,
)
from orchestrator.scheduler import epoch_rates, estimate_s
from orchestrator.states import JobState
from orchestrator.tick.probe import Probe

PERSISTENT_RULES = frozenset({"unreachable", "disk", "inodes", "memory", "stalled", "protocol"})  # open till cleared


@dataclass
class TickReport:
    probes: dict[str, Probe] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # one per host (docs/health.md)
    findings: list[Finding] = field(default_factory=list)  # newly recorded this tick
    actions: list[str] = field(default_factory=list)  # what the policy did, one line each
    round_trips: dict[str, int] = field(default_factory=dict)


def thresholds(ctx: Context) -> Thresholds:
    return Thresholds(stall_after_s=ctx.settings.stall_after_s, startup_grace_s=ctx.settings.startup_grace_s)



def resumed(ctx: Context, host: str, mine: Sequence[Job], entries: Mapping[str, JobEntry],
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
            record(ctx, [found], subjects=[], report=report)


def holds(ctx: Context, row: HostRow, findings: Sequence[Finding]) -> None:
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


def early_finishes(ctx: Context, host: str, job_ids: Sequence[str], report: TickReport) -> None:
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
            alike = rates.by_config_task if job.epochs else rates.whole_runs  # no epochs: whole runs only
            if (job.config, job.task) in alike:
                expected = estimate_s(config=job.config, task=job.task, epochs=job.epochs, history=rates)
        found = early_finish(host, JobView(job.id, job.name, job.attempt_count), duration, expected,
                             thresholds(ctx))
        if found is not None:
            record(ctx, [found], subjects=[], report=report)


def record(ctx: Context, findings: Sequence[Finding], *, subjects: Sequence[str], report: TickReport) -> None:
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


def sweeps_done(ctx: Context, report: TickReport) -> None:
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
