"""Patrol rules: pure functions from one probe report to findings (docs/health.md).

Nothing here talks to a host or the ledger.  The controller feeds each rule what it read (the
agent's ``status --json`` document, the ledger's view of a job and host) and stores the findings
as events; the policy (``verdicts.decide``) says what to do about a job, and the controller does it;
``host_lines`` draws one line per host.

Signals are combined because each lies alone: a buffered log looks stale while training is fine,
a CPU-bound loader shows 0 % GPU, a hung collective shows 100 % SM with no progress.  "Stalled"
therefore needs heartbeat, log and checkpoint all stale while the process group lives; "done"
comes only from the exit record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from orchestrator.health import observed
from orchestrator.health.verdicts import DEADLOCK_AT_START, DEADLOCK_HINT, DIVERGENCE_HINT, Decision
from orchestrator.host_documents import JobEntry, Memory, Scan, StatusDocument


class Severity(str, Enum):
    INFO = "info"
    WARN = "warn"
    ESCALATE = "escalate"


SEVERITY_RANK = {Severity.INFO: 0, Severity.WARN: 1, Severity.ESCALATE: 2}


@dataclass(frozen=True)
class Finding:
    rule: str  # "unreachable" "disk" "inodes" "memory" "oom_kill" "xid" "crash" "stalled" "dead" "rebooted"
    #            "nan" "early_finish" "failed"
    severity: Severity
    host: str
    message: str
    action: str = ""
    job: str | None = None
    evidence: tuple[str, ...] = ()
    # the class the attempt is ended with when the finding fires on a running attempt ("stalled",
    # "deadlock_at_start", "divergence"; tick/ending.py), "" when it ends nothing
    klass: str = field(default="", compare=False)
    # what a reader needs of it, recorded in the event's fields (never read back from ``message``): its
    # words without the job's name, the class of an attempt that already ended badly, the attempt it names
    reason: str = field(default="", compare=False)
    failure_class: str = field(default="", compare=False)
    attempt: int | None = field(default=None, compare=False)
    # a crash finding's signature names (its action says them to people too); an ended attempt's settling
    # decision without its next step (its action is the whole decision)
    signatures: tuple[str, ...] = field(default=(), compare=False)
    decision: str = field(default="", compare=False)

    @property
    def subject(self) -> str:
        return self.job or self.host


@dataclass(frozen=True)
class Thresholds:
    disk_warn_pct: float = 90.0
    disk_escalate_pct: float = 95.0
    memory_warn_pct: float = 90.0
    stall_after_s: float = 900.0
    startup_grace_s: float = 600.0
    start_stall_after_s: float = 300.0  # no first step yet: a stall after this long is a deadlock at start
    early_finish_ratio: float = 0.5
    unreachable_escalate_failures: int = 3
    unreachable_escalate_s: float = 600.0


@dataclass(frozen=True)
class HostView:
    """What the ledger knows about a host before this tick."""

    name: str
    oom_kill: int | None = None  # the counter at the previous probe
    unreachable_since: float | None = None
    probe_failures: int = 0  # consecutive, including this tick's failure


@dataclass(frozen=True)
class JobView:
    """What the ledger knows about a job's current attempt."""

    job_id: str
    name: str
    attempt: int
    launched_at: float | None = None
    stepped: bool = False  # the ledger saw a step of this attempt, or it resumed from a checkpoint


# --- host rules -------------------------------------------------------------------------------


def unreachable(host: HostView, error: str, now: float, th: Thresholds) -> Finding:
    since = host.unreachable_since or now
    stamp = time.strftime("%H:%MZ", time.gmtime(since))
    long_enough = (host.probe_failures >= th.unreachable_escalate_failures
                   and now - since >= th.unreachable_escalate_s)
    auth = "auth" in error.lower() or "host key" in error.lower()
    if auth:
        return Finding("unreachable", Severity.ESCALATE, host.name, f"unreachable (auth) since {stamp}: {error}",
                       "fix the key or credentials; gpuq will not retry blindly")
    if long_enough:
        return Finding("unreachable", Severity.ESCALATE, host.name,
                       f"unreachable since {stamp} ({host.probe_failures} failed probes): {error}",
                       "check the provider console for balance, power or preemption")
    return Finding("unreachable", Severity.WARN, host.name, f"unreachable since {stamp}: {error}",
                   "jobs keep running detached; gpuq retries with backoff")


def host_findings(host: HostView, doc: StatusDocument, th: Thresholds) -> list[Finding]:
    """Disk and inodes of the data mount, cgroup memory and OOM kills, new kernel Xids."""
    out: list[Finding] = []
    disk = doc.disk
    for rule, pct, what in (("disk", disk.used_pct, "disk"), ("inodes", disk.inodes_used_pct, "inodes")):
        if pct is None:
            continue
        where = disk.path or "the data dir"
        if pct >= th.disk_escalate_pct:
            out.append(Finding(rule, Severity.ESCALATE, host.name, f"{what} {pct:.0f}% used on {where}",
                               "the host gets no new job until space is freed: prune *.tmp, rolling "
                               "checkpoints of finished jobs, caches; or move to a bigger disk"))
        elif pct >= th.disk_warn_pct:
            out.append(Finding(rule, Severity.WARN, host.name, f"{what} {pct:.0f}% used on {where}",
                               "free space before it fills"))
    mem = doc.memory if doc.memory is not None else Memory()
    pct = mem.used_pct
    if pct is not None and pct > th.memory_warn_pct:
        out.append(Finding("memory", Severity.WARN, host.name,
                           f"memory {pct:.0f}% of the {mem.source or 'cgroup'} limit",
                           "OOM risk: see the attempt's mem.tsv; fewer loader workers or smaller eval buffers"))
    kills = mem.oom_kill
    if kills is not None and host.oom_kill is not None and kills > host.oom_kill:
        out.append(Finding("oom_kill", Severity.ESCALATE, host.name,
                           f"host OOM: oom_kill counter {host.oom_kill} -> {kills}",
                           "show the memory trace; retry only once the cause is removed"))
    for xid in doc.kernel.xids if doc.kernel is not None else []:
        code, line = xid.code, xid.line
        if code in (48, 79):
            meaning = "double-bit ECC error" if code == 48 else "GPU fell off the bus"
            out.append(Finding("xid", Severity.ESCALATE, host.name, f"Xid {code} ({meaning})",
                               "host marked unhealthy: no new jobs; its jobs resume elsewhere", evidence=(line,)))
        elif code is not None:
            out.append(Finding("xid", Severity.WARN, host.name, f"Xid {code} in the kernel log",
                               "usually an application fault; check the job's log", evidence=(line,)))
    return out


SIGNATURES_PREFIX = "signatures: "  # a crash finding's action starts with the signature names, for people


# --- job rules --------------------------------------------------------------------------------


def job_findings(host: str, job: JobView, entry: JobEntry, now: float, th: Thresholds) -> list[Finding]:
    """Rules over one job's entry of the status document (state, heartbeat, log, checkpoint, scan)."""
    out: list[Finding] = []
    scan = entry.scan if entry.scan is not None else Scan()
    hits = [h for h in scan.hits if h.signature != "stopped_by_signal"]
    if hits:
        names = sorted({h.signature for h in hits})
        first = hits[0].line
        tb = tuple(scan.traceback)
        out.append(Finding("crash", Severity.ESCALATE, host, f"{job.name} a{job.attempt}: {first}",
                           f"{SIGNATURES_PREFIX}{', '.join(names)}; triage from the traceback: gpuq logs {job.job_id}",
                           job=job.job_id, evidence=tb or (first,), attempt=job.attempt, reason=first,
                           signatures=tuple(names)))
    if scan.nonfinite:
        b = scan.nonfinite[0]
        running = entry.state == "running"  # the attempt still bills: it is ended within this tick
        what = f"non-finite {b.field}={b.value} at step {b.step}"
        out.append(Finding("nan", Severity.ESCALATE, host, f"{job.name}: {what}",
                           f"the attempt is ended as a divergence; {DIVERGENCE_HINT}" if running
                           else "divergence: no automatic retry", job=job.job_id,
                           klass="divergence" if running else "", reason=what))
    if entry.state == "running":
        launched = job.launched_at if job.launched_at is not None else entry.launched_at
        beat_age = entry.heartbeat_age_s
        log_age = None if entry.log_mtime is None else now - entry.log_mtime
        ckpt_age = None if entry.ckpt is None or entry.ckpt.mtime is None else now - entry.ckpt.mtime
        since_launch = None if launched is None else now - launched
        # a trainer without a heartbeat lives by its log and its checkpoint-glob matches
        signals = [a for a in (beat_age, log_age, ckpt_age) if a is not None] + observed.liveness_ages(entry, now)
        freshest = min(signals) if signals else since_launch
        started = first_step_reached(entry, job)
        limit = th.stall_after_s if started else min(th.start_stall_after_s, th.stall_after_s)
        if beat_age is None and since_launch is not None and since_launch < th.startup_grace_s:
            pass  # starting: no heartbeat yet, within the start-up grace
        elif freshest is not None and freshest > limit and (
                since_launch is None or since_launch > min(limit, th.startup_grace_s)):
            hb = "never" if beat_age is None else f"{beat_age:.0f}s ago"
            line = observed.last_line(entry) if beat_age is None else ""
            tail = f"; last log line: {line}" if line else ""
            if not started:
                words = (f"stalled before its first step ({DEADLOCK_AT_START}): heartbeat {hb}, nothing written for "
                         f"{freshest:.0f}s{tail}")
                out.append(Finding("stalled", Severity.ESCALATE, host, f"{job.name} a{job.attempt}: {words}",
                                   "save where each process waits, then kill the attempt; " + DEADLOCK_HINT,
                                   job=job.job_id, klass=DEADLOCK_AT_START, attempt=job.attempt, reason=words))
                return out
            step = entry.heartbeat.step if entry.heartbeat is not None else None
            if step is None:  # a trainer without a heartbeat: the step its log last showed
                step = observed.attempt_progress(entry).get("step")
            words = f"stalled: heartbeat {hb}, nothing written for {freshest:.0f}s (last step {step}){tail}"
            out.append(Finding("stalled", Severity.ESCALATE, host, f"{job.name} a{job.attempt}: {words}",
                               "kill the attempt and requeue it with resume if retries are left", job=job.job_id,
                               klass="stalled", attempt=job.attempt, reason=words))
    return out


def first_step_reached(entry: JobEntry, job: JobView) -> bool:
    """Whether the job has shown a training step, the line between a stall and a deadlock at start
    (docs/health.md): a step the ledger saw or a resume from a checkpoint (``job.stepped``), a
    checkpoint (the payload's pointer or a checkpoint-glob match), a heartbeat past step 0, a step or
    a percentage past 0 (or an epoch past 1) in the log's progress, or a row of its metrics files.
    Written before the first step, none of these says a step was taken: a heartbeat at step 0, a
    tqdm bar at 0 %, Lightning's "Epoch 0:" line, a metrics file with only its header."""
    if job.stepped or entry.ckpt is not None or entry.run_ckpt_mtime is not None:
        return True
    beat = entry.beat
    if beat is not None and beat.step is not None and beat.step > 0:
        return True
    prog = entry.progress
    if prog is None:
        return False
    return (prog.step or 0) > 0 or (prog.pct or 0) > 0 or (prog.epoch or 0) > 1 or prog.source == "metrics"


def ended_badly(host: str, job: JobView, outcome: str, klass: str, decision: Decision, requeued: bool,
                *, rebooted: bool = False, message: str = "") -> Finding:
    """The finding for an attempt that ended badly: "dead" (vanished: group gone without an exit
    record of its own), "rebooted", or "failed" (a non-zero exit)."""
    if outcome == "lost":
        rule = "rebooted" if rebooted else "dead"
        why = "the host rebooted" if rebooted else "process group gone without an exit record"
    else:
        rule, why = "failed", message or "exited non-zero"
    return Finding(rule, Severity.WARN if requeued else Severity.ESCALATE, host,
                   f"{job.name} a{job.attempt}: {why} (class: {klass})", decision.reason, job=job.job_id,
                   reason=why, failure_class=klass, attempt=job.attempt, decision=decision.words)


def early_finish(host: str, job: JobView, duration_s: float | None, expected_s: float | None,
                 th: Thresholds) -> Finding | None:
    if duration_s is None or not expected_s or duration_s >= th.early_finish_ratio * expected_s:
        return None
    words = f"succeeded in {duration_s:.0f}s, under {th.early_finish_ratio:.0%} of the expected {expected_s:.0f}s"
    return Finding("early_finish", Severity.WARN, host, f"{job.name}: {words}",
                   "suspect early finish: check the metrics; `gpuq submit` the line again for an identical rerun",
                   job=job.job_id, reason=words)


def timestamp(value: Any) -> float | None:
    """Agent documents carry ISO-8601 UTC strings; the payload's heartbeat carries epoch floats."""
    from datetime import datetime

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
