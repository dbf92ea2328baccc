"""Billing stops when the work stops: the tick's stage for rented hosts (docs/providers.md, "Down when done").

**Down when done.**  A host rented with ``gpuq up --down-when-done`` (or under ``auto_down``) is ended
by the tick once its work is over: no job is queued for it (pinned there, or of a sweep restricted to
it) or running there, and work has run there (a host that never got any waits until every sweep
submitted since it came up has ended; one that failed its GPU preflight gets none, and goes as soon
as nothing runs there).  A preempted or lost job last there does not hold it: the tick shipped its
checkpoints home while it ran (``ship_checkpoints``), and `gpuq resume` continues it from that copy on
any host (with ``ship_checkpoints = "never"`` it does hold it).  Then, in this order: the results of
its SUCCEEDED jobs are pulled and verified as `gpuq pull` does (``transfer.pull_jobs``), the log and
exit record of every failed attempt there are brought home verified (``transfer/evidence.py``), and
the machine is terminated through the teardown gate (``tick/teardown.py``).  The ledger records when
it stopped billing (lease ``terminated``, ``lease_changed_at``) and what it cost (a ``down_when_done``
finding, also sent to the webhook).

A result or a log that fails verification keeps the box: one ``unverified_result`` escalation, and no
further pulls from that host (each would quarantine another copy) until a person acts (`gpuq pull`
by hand, after which the next tick ends it; or `gpuq down HOST --force`).  A passing failure (the host
unreachable, a transfer cut, the provider's API down) is retried on the next tick; after
``MAX_TRIES`` in a row it escalates too.

**The idle alert.**  Every rented host that has had no work for ``idle_billing_alert_min`` minutes gets
one ``idle_billing`` warning per idle period (dashboard, webhook) with its price and the command that
ends it.  An idle period ends when work arrives (a job queued for it or running there, or an attempt
that started and ended between two ticks); a new one starts after that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator import transfer
from orchestrator.agent import client
from orchestrator.context import Context, host_for
from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError
from orchestrator.core.states import HoldKind, JobState, LeaseState
from orchestrator.ledger import Attempt, Event, HostRow, Job, Sweep
from orchestrator.money import cost
from orchestrator.tick import ACTIVE, budget, notify, teardown
from orchestrator.tick.checkpoints import ship_wanted
from orchestrator.tick.findings import TickReport
from orchestrator.transfer import evidence

RULE_IDLE = "idle_billing"  # warn: a rented host with no work; info: its idle period ended
RULE_DONE = "down_when_done"  # info: the host was ended, with what it cost and when it stopped billing
RULE_UNVERIFIED = "unverified_result"  # escalate: a result or a log from it did not verify: it is kept
RULE_RETRY = "auto_down"  # warn: ending it failed for a passing reason (retried); escalate after MAX_TRIES
MAX_TRIES = 3
STRANDED = (JobState.PREEMPTED.value, JobState.LOST.value)
ACTIVE_STATES = tuple(s.value for s in ACTIVE)
KEPT = (JobState.SUCCEEDED.value, JobState.STOPPED.value)  # results brought home before the end: a stopped job's too


@dataclass(frozen=True)
class Work:
    """What the ledger says about one rented host's work."""

    busy: tuple[str, ...] = ()  # names of jobs queued for it or running there
    stranded: tuple[str, ...] = ()  # PREEMPTED or LOST jobs last there, waiting for `gpuq resume`
    unpulled: tuple[Job, ...] = ()  # SUCCEEDED (or STOPPED) there, results not yet verified at home
    evidence: tuple[tuple[Job, Attempt], ...] = ()  # failed attempts there whose log and exit record are not home
    attempts: tuple[Attempt, ...] = ()  # every attempt that ran there
    idle_since: float = 0.0  # since when nothing ran there: its start, its newest attempt's, or work last seen

    @property
    def used(self) -> bool:
        return bool(self.attempts)


def rented(row: HostRow) -> bool:
    """A machine gpuq rented that bills now."""
    return bool(row.provider and row.instance_id) and row.lease is LeaseState.RUNNING and \
        row.hold not in (HoldKind.REPLACED, HoldKind.TERMINATED)


def work_of(row: HostRow, jobs: Mapping[str, Job], queued: Sequence[Job], sweep_hosts: Mapping[str, set[str]],
            attempts: Sequence[Attempt], verified: Collection[str], evidence_home: Callable[[Job, int], bool],
            seen_busy_at: float | None = None, as_node: Sequence[str] = ()) -> Work:
    """``jobs``: by id, at least every job whose host is ``row`` and every job of ``attempts`` (those on
    ``row``); ``queued``: the QUEUED jobs; ``sweep_hosts``: each restricted sweep's hosts;
    ``evidence_home(job, attempt)``: whether that failed attempt's evidence is home, verified;
    ``seen_busy_at``: when the tick last saw work there (the end of the last idle alert's period);
    ``as_node``: jobs running there as a node other than rank 0 of a multi-node attempt."""
    here = [a for a in attempts if a.host == row.name]
    mine = [j for j in jobs.values() if j.host == row.name]
    busy = [j.name for j in mine if j.state in ACTIVE_STATES] + list(as_node)
    if row.health != "fail":  # a host that failed its preflight gets no job: nothing queued is for it
        busy += [j.name for j in queued if j.host_pin == row.name or row.name in sweep_hosts.get(j.sweep_id, ())]
    failed = [(jobs[a.job_id], a) for a in here if evidence.failed_attempt(a) and a.job_id in jobs
              and jobs[a.job_id].state != JobState.CANCELLED.value]  # a cancelled job: written off
    times = [row.created_at, row.lease_changed_at or 0.0, seen_busy_at or 0.0]
    times += [max(a.created_at, a.started_at or 0.0, a.ended_at or 0.0) for a in here]
    return Work(busy=tuple(busy), stranded=tuple(j.name for j in mine if j.state in STRANDED),
                unpulled=tuple(j for j in mine if j.state in KEPT and j.id not in verified),
                evidence=tuple((j, a) for j, a in failed if not evidence_home(j, a.number)),
                attempts=tuple(here), idle_since=max(times))


def end_blocker(row: HostRow, work: Work, sweeps_since_done: bool, *, checkpoints_home: bool = True) -> str | None:
    """Why a down-when-done host's work is not over (None: it is: bring its results home and end it).
    ``sweeps_since_done``: some sweep was submitted since the host came up, and all such have ended.
    ``checkpoints_home``: the tick ships its running jobs' checkpoints home (``ship_checkpoints``), so a
    preempted or lost job there resumes from that copy, anywhere (`gpuq resume`); else from its disk only."""
    if not row.down_when_done:
        return "not marked down-when-done"
    if work.busy:
        return f"{len(work.busy)} job(s) queued for it or running there ({', '.join(work.busy[:3])})"
    if work.stranded and not checkpoints_home:
        return (f"{len(work.stranded)} preempted or lost job(s) resume from its disk ({', '.join(work.stranded[:3])}; "
                "ship_checkpoints is never): `gpuq resume`, or `gpuq cancel` them")
    if not work.used and row.health != "fail" and not sweeps_since_done:
        return "no work has run there yet"
    return None


def idle_alert(work: Work, now: float, after_s: float, alerted_at: float | None) -> str | None:
    """"alert" (this idle period reached ``after_s`` and was not alerted), "clear" (the alerted period
    ended: work arrived) or None.  ``alerted_at``: the time of the host's open idle alert."""
    if after_s <= 0:
        return None
    if work.busy:
        return "clear" if alerted_at is not None else None
    if alerted_at is not None and alerted_at >= work.idle_since:
        return None  # this idle period was alerted: once only
    if now - work.idle_since >= after_s:
        return "alert"
    return "clear" if alerted_at is not None else None  # work came and went between two ticks


def _sweeps_since_done(row: HostRow, sweeps: Sequence[Sweep], counts: Mapping[str, Mapping[str, int]],
                       held: Collection[str] = ()) -> bool:
    """Some sweep was submitted since ``row`` came up, and every such sweep ended (as `gpuq watch` sees it:
    a preempted or lost job waits for `gpuq resume`, a sweep its budget stopped (``held``) for a raised cap)."""
    since = [s for s in sweeps if s.created_at >= row.created_at]
    return bool(since) and all(s.id in held or JobState(st).terminal or st in STRANDED
                               for s in since for st in counts.get(s.id, {}))


def works(ctx: Context, rows: Sequence[HostRow],
          held: Mapping[str, str] | None = None) -> tuple[dict[str, Work], list[Sweep]]:
    """The ``Work`` of each of the rented ``rows`` (a few queries for all of them), and every sweep.
    ``held``: the sweeps their budget stopped (``budget.stopped``), when the caller has them already."""
    names = [r.name for r in rows]
    attempts = ctx.ledger.attempts_on(names)
    jobs = {j.id: j for j in ctx.ledger.jobs_on(names)}
    for job_id in {a.job_id for a in attempts} - set(jobs):
        jobs[job_id] = ctx.ledger.job(job_id)  # a job that ran there once and moved on
    if held is None:  # a sweep its budget stopped waits for a person to raise its cap: no work for a machine
        held = budget.stopped(ctx.ledger, None)
    queued = [j for j in ctx.ledger.jobs(states=[JobState.QUEUED]) if j.sweep_id not in held]
    sweeps = ctx.ledger.sweeps()
    sweep_hosts = {s.id: s.host_set() for s in sweeps if s.hosts}
    verified = set(ctx.ledger.verified_pulls(j.id for j in jobs.values() if j.state in KEPT))
    results = ctx.settings.home / "results"
    active = {j.id: j for j in ctx.ledger.jobs(states=ACTIVE)}
    as_node: dict[str, list[str]] = {}
    for att in ctx.ledger.latest_attempts(active).values():
        for node in att.node_hosts()[1:]:  # rank 0 is the attempt's host
            as_node.setdefault(node, []).append(active[att.job_id].name)
    out = {}
    for row in rows:
        last = ctx.ledger.latest_finding(row.name, RULE_IDLE)
        out[row.name] = work_of(row, jobs, queued, sweep_hosts, attempts, verified,
                                lambda job, n: evidence.is_home(results, job, n),
                                last.time if last is not None and last.severity == "info" else None,
                                as_node.get(row.name, ()))
    return out, sweeps


def idle_hosts(ctx: Context) -> dict[str, float]:
    """{rented host with no work now: since when} (the dashboard marks them)."""
    rows = [r for r in ctx.ledger.hosts() if rented(r)]
    if not rows:
        return {}
    found, _ = works(ctx, rows)
    return {name: w.idle_since for name, w in found.items() if not w.busy}


def billing(ctx: Context, report: TickReport, reachable: Collection[str], now: float | None = None) -> None:
    """The stage: end the down-when-done hosts whose work is over, and alert on idle rented hosts.
    ``reachable``: the hosts whose probe answered this tick (only they are pulled from)."""
    rows = [r for r in ctx.ledger.hosts() if rented(r)]
    if not rows:
        return
    now = time.time() if now is None else now
    held = budget.stopped(ctx.ledger, None)
    found, sweeps = works(ctx, rows, held)
    counts = ctx.ledger.state_counts() if any(r.down_when_done for r in rows) else {}
    for row in rows:
        work = found[row.name]
        try:
            since = _sweeps_since_done(row, sweeps, counts, held)
            if row.down_when_done and end_blocker(row, work, since, checkpoints_home=ship_wanted(ctx.settings, row)) \
                    is None and _end(ctx, row, work, row.name in reachable, report):
                continue
        except (GpuqError, OSError) as exc:  # one host's trouble (or this machine's disk) never stops the tick
            _retry(ctx, row, str(exc), report)
        _idle(ctx, row, work, now, ctx.ledger.latest_finding(row.name, RULE_IDLE), report)


def _end(ctx: Context, row: HostRow, work: Work, reachable: bool, report: TickReport) -> bool:
    """Bring the host's results home and terminate it; True when it is gone."""
    kept = ctx.ledger.open_findings([row.name]).get((row.name, RULE_UNVERIFIED))
    if work.unpulled or work.evidence:
        if kept is not None:
            return False  # a result did not verify: kept until a person acts
        if not reachable:
            _retry(ctx, row, "it did not answer this tick: its results cannot come home yet", report)
            return False
        problems, passing = _bring_home(ctx, row, work)
        if problems:
            _keep(ctx, row, problems, report)
            return False
        if passing:
            _retry(ctx, row, "; ".join(passing[:3]), report)
            return False
    here = ctx.ledger.jobs_on([row.name])
    blocked = teardown.refusal(row, here, set(ctx.ledger.verified_pulls(j.id for j in here)))
    if blocked is not None:
        _retry(ctx, row, blocked, report)
        return False
    outcome, gone = teardown.terminate(ctx, row, reason="down when done: its work is over and every result is "
                                                        "home, verified")
    if gone is None:
        _retry(ctx, row, outcome, report)
        return False
    _record_end(ctx, row, work, gone, report)
    if kept is not None:
        ctx.ledger.record_finding("host", row.name, severity="info", rule=RULE_UNVERIFIED,
                                  message=f"cleared: {kept.message}")
    return True


def _bring_home(ctx: Context, row: HostRow, work: Work) -> tuple[list[str], list[str]]:
    """Pull the unverified results and fetch the failed attempts' evidence: (problems that keep the
    host, passing failures to retry), one line each."""
    host = host_for(ctx, row)
    results = ctx.settings.home / "results"
    quarantine = ctx.settings.home / protocol.QUARANTINE_DIR
    problems: list[str] = []
    passing: list[str] = []
    by_sweep: dict[str, list[Job]] = {}
    for job in work.unpulled:
        by_sweep.setdefault(job.sweep_id, []).append(job)
    for sweep_id, group in by_sweep.items():
        try:
            with transfer.sweep_lock(results / sweep_id):
                got = transfer.pull_jobs(ctx.ledger, host, client.command(host, row.agent_bundle), group, results,
                                         quarantine, tries=3, backoff=(1.0, 5.0))
        except GpuqError as exc:  # another `gpuq pull` of the sweep holds its lock
            passing.append(str(exc))
            continue
        for o in got:
            if not o.verified:
                (passing if o.state == transfer.INCOMPLETE else problems).append(f"{o.name}: {o.state}: {o.reason}")
    if work.evidence:
        for e in evidence.fetch_evidence(ctx.ledger, host, work.evidence, results, quarantine):
            if not e.verified:
                line = f"{e.job_id} attempt {e.attempt} log and exit record: {e.reason}"
                (passing if e.state == evidence.INCOMPLETE else problems).append(line)
    return problems, passing


def _price(row: HostRow) -> str:
    return f"${row.price_per_hour:.2f}/h" if row.price_per_hour is not None else "an unknown price per hour"


def _keep(ctx: Context, row: HostRow, problems: Sequence[str], report: TickReport) -> None:
    message = (f"{len(problems)} result(s) from {row.name} did not verify ({problems[0]}"
               f"{'; ...' if len(problems) > 1 else ''}): the host is kept, billing {_price(row)}")
    action = (f"inspect them (`gpuq results`, {ctx.settings.home / protocol.QUARANTINE_DIR}); once `gpuq pull` "
              f"verifies them the next tick ends the host, or `gpuq down {row.name} --force` gives them up")
    ctx.ledger.record_finding("host", row.name, severity="escalate", rule=RULE_UNVERIFIED, message=message,
                              action=action)
    notify.send(ctx.settings, ctx.ledger, notify.Notice(
        "escalation", notify.line(message, host=row.name, next_step="gpuq pull"),
        {"rule": RULE_UNVERIFIED, "host": row.name, "job": None, "message": message, "action": action},
        title=f"{row.name} kept: results unverified", severity="escalate"))
    report.actions.append(f"{row.name}: down when done: kept: {message}")


def _retry(ctx: Context, row: HostRow, why: str, report: TickReport) -> None:
    """A passing failure: a warning, retried next tick (``report.teardown_pending``); the
    ``MAX_TRIES``-th in a row escalates once (the tick still retries, but `gpuq watch` need not wait)."""
    tries = 0
    for event in reversed(ctx.ledger.events(row.name, limit=100, exact=True)):
        if event.rule != RULE_RETRY:
            continue
        if event.severity != "warn":
            if event.severity == "escalate":
                return  # said; the stage keeps trying at every tick
            break
        tries += 1
    message = f"down when done: {row.name} not ended yet: {why}"
    if tries + 1 < MAX_TRIES:
        ctx.ledger.record_finding("host", row.name, severity="warn", rule=RULE_RETRY, message=message,
                                  action="retried at the next tick")
        report.teardown_pending.append(row.name)
        report.actions.append(f"{row.name}: {message} (retried)")
        return
    action = f"it bills {_price(row)}: `gpuq down {row.name}` ends it by hand"
    ctx.ledger.record_finding("host", row.name, severity="escalate", rule=RULE_RETRY,
                              message=f"{message} ({MAX_TRIES} tries)", action=action)
    notify.send(ctx.settings, ctx.ledger, notify.Notice(
        "escalation", notify.line(f"{message}; it bills {_price(row)}", host=row.name,
                                  next_step=f"gpuq down {row.name}"),
        {"rule": RULE_RETRY, "host": row.name, "job": None, "message": message, "action": action},
        title=f"{row.name} not ended, still billing", severity="escalate"))
    report.actions.append(f"{row.name}: {message}; {action}")


def _record_end(ctx: Context, row: HostRow, work: Work, gone: float, report: TickReport) -> None:
    spent = cost.money_spent(work.attempts, gone)
    hours = max(0.0, gone - row.created_at) / 3600
    last_end = max((a.ended_at for a in work.attempts if a.ended_at is not None), default=None)
    parts = [f"stopped billing at {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(gone))}"]
    if row.price_per_hour is not None:
        parts.append(f"rented {hours:.2f} h at {_price(row)}: about ${hours * row.price_per_hour:.2f}")
    parts.append(f"its {len(work.attempts)} attempt(s) cost ${spent or 0.0:.2f}")
    if last_end is not None:
        parts.append(f"billed {max(0.0, gone - last_end):.0f} s after its last job ended")
    if work.stranded:
        parts.append(f"{', '.join(work.stranded[:3])} resume from the checkpoint shipped home (`gpuq resume`)")
    message = f"{row.provider} {row.instance_id} terminated, down when done: " + "; ".join(parts)
    ctx.ledger.record_finding("host", row.name, severity="info", rule=RULE_DONE, message=message, at=gone)
    notify.send(ctx.settings, ctx.ledger, notify.Notice(
        RULE_DONE, notify.line(message, host=row.name, next_step="gpuq resume" if work.stranded else "gpuq results"),
        {"host": row.name, "provider": row.provider, "instance": row.instance_id, "stopped_at": gone,
         "attempts_usd": spent, "message": message}, title=f"{row.name} ended, billing stopped"))
    report.actions.append(f"{row.name}: {message}")


def _idle(ctx: Context, row: HostRow, work: Work, now: float, last: Event | None, report: TickReport) -> None:
    alerted_at = last.time if last is not None and last.severity == "warn" else None
    verdict = idle_alert(work, now, ctx.settings.idle_billing_alert_min * 60, alerted_at)
    if verdict == "clear":  # dated when work was last seen: the next idle period starts then
        ctx.ledger.record_finding("host", row.name, severity="info", rule=RULE_IDLE,
                                  at=now if work.busy else work.idle_since,
                                  message=f"cleared: work ran on {row.name}; its idle period ended")
    elif verdict == "alert":
        minutes = (now - work.idle_since) / 60
        message = (f"{row.name} has had no work for {int(minutes)} min and bills {_price(row)} "
                   f"({row.provider} {row.instance_id})")
        if row.down_when_done:
            why = end_blocker(row, work, False, checkpoints_home=ship_wanted(ctx.settings, row)) or \
                "its results could not be brought home"
            message += f"; down-when-done waits: {why}"
        action = f"`gpuq down {row.name}` ends it (after `gpuq pull` when results there are not home)"
        ctx.ledger.record_finding("host", row.name, severity="warn", rule=RULE_IDLE, message=message,
                                  action=action, at=now)
        notify.send(ctx.settings, ctx.ledger, notify.Notice(
            RULE_IDLE, notify.line(message, host=row.name, next_step=f"gpuq down {row.name}"),
            {"host": row.name, "provider": row.provider, "instance": row.instance_id,
             "price_per_hour": row.price_per_hour, "idle_min": round(minutes, 1), "message": message,
             "action": action}, title=f"{row.name} idle, still billing", severity="warn"))
        report.actions.append(f"{row.name}: {message}; {action}")
