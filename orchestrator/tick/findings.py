"""What the tick records of the patrol's findings, and the host holds and checks that follow them."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.context import Context
from orchestrator.core.errors import GpuqError
from orchestrator.core.states import AttemptState, HoldChange, HoldKind, JobState
from orchestrator.health.observed import FROM_SCRATCH
from orchestrator.health.patrol import (
    Finding,
    JobView,
    Severity,
    Thresholds,
    early_finish,
)
from orchestrator.host_documents import JobEntry
from orchestrator.ledger import HostRow, Job
from orchestrator.money import budget
from orchestrator.report import cells
from orchestrator.tick import notify
from orchestrator.tick.probe import Probe

PERSISTENT_RULES = frozenset({"unreachable", "disk", "inodes", "memory", "stalled", "protocol"})  # open till cleared


@dataclass
class TickReport:
    probes: dict[str, Probe] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # one per host (docs/health.md)
    findings: list[Finding] = field(default_factory=list)  # newly recorded this tick
    actions: list[str] = field(default_factory=list)  # what the policy did, one line each
    round_trips: dict[str, int] = field(default_factory=dict)
    teardown_pending: list[str] = field(default_factory=list)  # down-when-done hosts to end at the next tick


def thresholds(ctx: Context) -> Thresholds:
    return Thresholds(stall_after_s=ctx.settings.stall_after_s, startup_grace_s=ctx.settings.startup_grace_s,
                      start_stall_after_s=ctx.settings.start_stall_after_s)



def resumed(ctx: Context, host: str, mine: Sequence[Job], entries: Mapping[str, JobEntry],
             report: TickReport) -> None:
    """Proof that a resume resumed (docs/checkpoints.md): the step the payload says it loaded, checked
    against the newest checkpoint the ledger knew when the attempt started."""
    for job in mine:
        entry = entries.get(job.id)
        if entry is not None and entry.scan is not None and entry.scan.from_scratch is not None:
            from_scratch(ctx, host, job, report)
        resumed = entry.scan.resumed if entry is not None and entry.scan is not None else None
        if resumed is None or resumed.step is None:
            continue
        step = resumed.step
        ctx.ledger.update_attempt(job.id, job.attempt_count, resumed_step=step)
        earlier = [c for c in ctx.ledger.checkpoints(job.id) if c.attempt < job.attempt_count]
        expected = max((c.step for c in earlier), default=None)
        if expected is not None and step < expected:
            words = f"resumed from step {step}, but a checkpoint of step {expected} existed"
            found = Finding("resume", Severity.ESCALATE, host, f"{job.name} a{job.attempt_count}: {words}",
                            "the newer checkpoint was lost or not shipped: check the host's ckpt dir and `gpuq logs`",
                            job=job.id, attempt=job.attempt_count, reason=words)
            record(ctx, [found], subjects=[], report=report)




def from_scratch(ctx: Context, host: str, job: Job, report: TickReport) -> None:
    """A retry found no checkpoint to pass (the wrapper says so in the log): requeued "with resume", it
    trains again from the start.  Loud, never silent (docs/checkpoints.md)."""
    if job.attempt_count < 2:
        return
    sweep = ctx.ledger.sweep(job.sweep_id)
    run = sweep.run_config() if sweep is not None else None
    globs = list(run.checkpoint) if run is not None else []
    shown = f" {json.dumps(globs)}" if globs else ""
    words = f"restarted from scratch: no file matched `checkpoint`{shown} in its run dir"
    found = Finding(FROM_SCRATCH, Severity.ESCALATE, host, f"{job.name} a{job.attempt_count}: {words}",
                    "the retry trains again from step 0: compare `checkpoint` in gpuq.toml with what the trainer "
                    "writes (`gpuq logs`)", job=job.id, attempt=job.attempt_count, reason=words)
    record(ctx, [found], subjects=[], report=report)


def holds(ctx: Context, row: HostRow, findings: Sequence[Finding]) -> None:
    """A full data mount or a fatal Xid holds the host: no new job goes there until it clears."""
    fatal = [f for f in findings if f.rule == "xid" and f.severity == Severity.ESCALATE]
    full = [f for f in findings if f.rule in ("disk", "inodes") and f.severity == Severity.ESCALATE]
    if fatal:
        ctx.ledger.change_hold(row.name, HoldChange(HoldKind.UNHEALTHY, fatal[0].message), health="fail",
                               health_at=time.time(), health_detail=fatal[0].message)
    elif full:  # a host held for another reason (unhealthy, unusable, replaced) keeps that hold
        ctx.ledger.change_hold(row.name, HoldChange(HoldKind.DISK, full[0].message,
                                                    over=frozenset({HoldKind.NONE, HoldKind.DISK})))
    elif row.hold is HoldKind.DISK and not full:
        ctx.ledger.change_hold(row.name, HoldChange.lift(HoldKind.DISK))


def early_finishes(ctx: Context, host: str, job_ids: Sequence[str], report: TickReport) -> None:
    """A job that succeeded in under half its expected time is suspect: its ``est_min``, else the
    mean time of its own cell's other seeds that ran from scratch (report/cells.py), never other
    cells' (another learning rate, another model size).  Without either there is no verdict."""
    for job_id in job_ids:
        job = ctx.ledger.job(job_id)
        att = ctx.ledger.attempt(job_id, job.attempt_count)
        if att is None or att.started_at is None or att.ended_at is None or att.resume_from or job.attempt_count > 1:
            continue  # a resumed run trains part of its epochs: no verdict
        duration = att.ended_at - att.started_at
        expected: float | None = job.est_min * 60 if job.est_min else _own_cell_seconds(ctx, job)
        found = early_finish(host, JobView(job.id, job.name, job.attempt_count), duration, expected,
                             thresholds(ctx))
        if found is not None:
            record(ctx, [found], subjects=[], report=report)


def _own_cell_seconds(ctx: Context, job: Job) -> float | None:
    """The mean seconds of the successful, from-scratch runs of the other jobs of ``job``'s cell in
    its sweep; None when none has finished."""
    done = [j for j in ctx.ledger.jobs(sweep_id=job.sweep_id, states=[JobState.SUCCEEDED]) if j.id != job.id]
    mates = next((members for members in cells.group([*done, job]).values()
                  if any(m is job for m in members)), [])
    others = [j.id for j in mates if j.id != job.id]
    seconds = [a.ended_at - a.started_at for a in ctx.ledger.attempts_of(others)
               if a.state == AttemptState.EXITED.value and a.exit_code == 0 and not a.resume_from
               and a.started_at is not None and a.ended_at is not None and a.ended_at > a.started_at]
    return sum(seconds) / len(seconds) if seconds else None


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
                                  message=f.message, action=f.action, reason=f.reason,
                                  failure_class=f.failure_class, attempt=f.attempt, signatures=f.signatures)
        report.findings.append(f)
        if f.severity == Severity.ESCALATE:
            notify.send(ctx.settings, ctx.ledger, _escalation(ctx, f))
    probed = set(subjects)
    for (subject, rule), event in open_.items():
        if subject in probed and rule in PERSISTENT_RULES and (subject, rule) not in firing:
            ctx.ledger.record_finding(event.kind, subject, severity="info", rule=rule,
                                      message=f"cleared: {event.message}")


def sweeps_done(ctx: Context, report: TickReport, unsettled: Collection[str] = ()) -> None:
    """Announce each sweep once, when its last job ends (``unsettled``: seeds=auto may add more to these)."""
    counts = ctx.ledger.state_counts()
    for sweep_id, states in counts.items():
        if sweep_id in unsettled or any(not JobState(s).terminal and s != JobState.LOST.value for s in states):
            continue
        open_ = [rule for _, rule in ctx.ledger.open_findings([sweep_id]) if rule != budget.RULE]  # a cap: no bar
        if open_ or any(e.rule == "sweep_done" for e in ctx.ledger.events(subject=sweep_id, limit=20)):
            continue
        summary = ", ".join(f"{state}={n}" for state, n in sorted(states.items()))
        ctx.ledger.record_finding("sweep", sweep_id, severity="info", rule="sweep_done",
                                  message=f"sweep {sweep_id} finished: {summary}")
        failed = sum(n for state, n in states.items() if state != JobState.SUCCEEDED.value)
        text = notify.line(f"finished: {summary}", sweep=sweep_id, next_step=f"gpuq results --sweep {sweep_id}")
        notify.send(ctx.settings, ctx.ledger, notify.Notice(
            "sweep_done", text, {"sweep": sweep_id, "states": states},
            title="sweep finished" + (f", {failed} not succeeded" if failed else ""),
            severity="warn" if failed else "info"))


_TITLES = {"failed": "job failed", "dead": "job lost", "rebooted": "job lost (host rebooted)", "crash": "job crashed",
           "stalled": "job stalled", "nan": "job diverged", "resume": "resume went back", FROM_SCRATCH: "job restarted"}
_ENDED = ("failed", "dead", "rebooted")  # their action is the settling decision ("config error: never retried")


def _escalation(ctx: Context, f: Finding) -> notify.Notice:
    """The webhook's notice of an escalated finding: the JSON fields as ever, and one line that names
    the job (its sweep) or the host, what happened and the next command."""
    fields = {"rule": f.rule, "host": f.host, "job": f.job, "message": f.message, "action": f.action}
    title = _TITLES.get(f.rule, f.rule.replace("_", " ")) if f.job else f"{f.rule.replace('_', ' ')} on {f.host}"
    what, step = f.message, notify.next_command(f.action)
    if f.job is None:
        text = notify.line(what, host=f.host, next_step=step or f"gpuq hosts show {f.host}")
        return notify.Notice("escalation", text, fields, title=title, severity="escalate")
    try:
        job = ctx.ledger.job(f.job)
    except GpuqError:  # a job the ledger does not hold: the finding's own words
        return notify.Notice("escalation", notify.line(what, job=f.job, host=f.host, next_step=step), fields,
                             title=title, severity="escalate")
    # a job's finding carries its words without the job's name and the attempt it names, as fields
    what = (f.reason + (f" (class: {f.failure_class})" if f.failure_class else "")) if f.reason else what
    attempt = f.attempt if f.attempt is not None else job.attempt_count
    if f.rule in _ENDED and f.decision:
        what += "; " + f.decision
    text = notify.line(what, job=notify.job_label(job.name, job.id), sweep=job.sweep_id, host=f.host,
                       next_step=step or f"gpuq logs {job.id} --attempt {attempt}")
    return notify.Notice("escalation", text, fields, title=title, severity="escalate")
