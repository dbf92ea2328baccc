"""One controller tick: probe → reconcile → schedule → launch.

Probing is one agent ``status --json`` per host, in parallel.  Reconciling
maps what the host's files say onto the ledger, only ever through
``Ledger.transition``.  A probe that fails at the transport level marks the
host "unreachable since T" and changes no job (docs/health.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator import gangs, host_documents, observed, protocol, slurm_hosts, stops
from orchestrator.bundle import Bundle
from orchestrator.config import Settings
from orchestrator.errors import GpuqError, HostError
from orchestrator.fleet import Fleet
from orchestrator.host_documents import (
    ExitRecord,
    HealthDocument,
    JobEntry,
    Results,
    Scan,
    ScanHit,
    StatusDocument,
    Verdicts,
)
from orchestrator.hosts.base import Host
from orchestrator.launcher import agent_argv, deliver_all, enqueue, ensure_agent, ensure_bundle, job_spec, push_all
from orchestrator.ledger import Attempt, HostRow, Job, Ledger
from orchestrator.patrol import Decision, classify, decide, signatures_of
from orchestrator.scheduler import EpochRates, Move, Plan, PlanJob, QueuedJob, estimate_s, plan, plan_steals
from orchestrator.setup_holds import is_setup_failure, settle_setup_failure
from orchestrator.specs import HostSlots, clamp_slots
from orchestrator.states import AttemptState, JobState

ACTIVE = (JobState.ASSIGNED, JobState.RUNNING)
_EMPTY = StatusDocument.model_validate({"schema": "gpuq.status/1"})  # what a host that said nothing says
NONE_SAID = Verdicts({})


@dataclass
class Probe:
    host: str
    ok: bool
    doc: StatusDocument | None = None  # the host's status document (ok: always one)
    error: str = ""
    round_trips: int = 1
    duration_s: float = 0.0
    reachable: bool = False  # the transport worked (ok adds: the agent answered with a status document)


def probe(host: Host, agent_bundle: str, settings: Settings, results_for: Sequence[str] = (),
          extra: Sequence[str] = ()) -> Probe:
    """One read-only round trip to the host's agent.

    ``results_for``: the jobs the ledger believes active there; any of them that exited 0
    comes back with its collected results, so finishing jobs cost no second round trip.
    ``extra``: more ``status`` arguments (the patrol's ``--scan`` offsets, ``--kernel-since``).
    """
    started = time.monotonic()
    if not agent_bundle:  # nothing of ours there yet: the round trip only proves reachability
        try:
            host.run(["true"], timeout=settings.status_timeout_s)
        except HostError as exc:
            return Probe(host.name, False, error=str(exc), duration_s=time.monotonic() - started)
        return Probe(host.name, False, error="no bundle placed yet", duration_s=time.monotonic() - started,
                     reachable=True)
    try:
        wanted = ["--results-for", *results_for] if results_for else []
        result = host.run(agent_argv(host, agent_bundle, "status", "--json", *wanted, *extra),
                          timeout=settings.status_timeout_s)
    except HostError as exc:  # unreachable, or a key/auth refusal: either way no verdict on any job
        return Probe(host.name, False, error=str(exc), duration_s=time.monotonic() - started)
    elapsed = time.monotonic() - started
    if result.exit_code != 0:
        return Probe(host.name, False, error=f"status exited {result.exit_code}: {result.stderr.strip()[-300:]}",
                     duration_s=elapsed, reachable=True)
    try:
        doc = host_documents.read_status(host.name, result.stdout)
    except host_documents.ProtocolError as exc:
        return Probe(host.name, False, error=f"protocol error: {exc.detail}", duration_s=elapsed, reachable=True)
    return Probe(host.name, True, doc=doc, duration_s=elapsed, reachable=True)


ProbeRequest = tuple[Host, str, Sequence[str], Sequence[str]]  # host, agent bundle, active job ids, extra args


def probe_all(hosts: Sequence[ProbeRequest], settings: Settings) -> list[Probe]:
    """Probe every host in parallel: one round trip each, at most 8 connections at once
    (reconnect storms trip sshd MaxStartups, docs/health.md)."""
    if len(hosts) <= 1:
        return [probe(h, sha, settings, ids, extra) for h, sha, ids, extra in hosts]
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        return list(pool.map(lambda item: probe(item[0], item[1], settings, item[2], item[3]), hosts))


def _exit_message(exit_doc: ExitRecord) -> str:
    code = exit_doc.code
    meaning = protocol.EXIT_MEANINGS.get(code)
    if meaning is None and code > protocol.EXIT_SIGNAL_BASE:
        meaning = f"killed by signal {code - protocol.EXIT_SIGNAL_BASE}"
    detail = exit_doc.message or ""
    parts = [f"exit {code}"] + ([meaning] if meaning else []) + ([detail] if detail else [])
    return ": ".join(parts)


@dataclass(frozen=True)
class Settled:
    """An attempt that ended badly this tick, classified (docs/health.md) and acted on."""

    job_id: str
    outcome: str  # "failed" (exited non-zero) | "lost" (vanished: no exit record of its own)
    klass: str
    decision: Decision
    rebooted: bool = False


@dataclass
class Reconciled:
    succeeded: list[str] = field(default_factory=list)  # job ids that just succeeded
    settled: list[Settled] = field(default_factory=list)
    multi_node_ended: list[str] = field(default_factory=list)  # multi-node attempts that ended: stop their nodes


def reconcile(ledger: Ledger, host: Host, settings: Settings, report: Probe,
              parts: Mapping[str, Sequence[gangs.Part]] | None = None) -> Reconciled:
    """Apply one successful probe to the ledger: progress, exits, vanished attempts; an attempt
    that ended badly is classified and settled by the retry policy (docs/health.md).

    ``parts``: this tick's view of every multi-node attempt's nodes (gangs.parts_this_tick); such an
    attempt is judged on all of them, on the host of its node 0."""
    now = time.time()
    row = ledger.host(host.name)
    doc = report.doc if report.doc is not None else _EMPTY
    kills = doc.memory.oom_kill if doc.memory is not None else None
    oom_rose = bool(row is not None and row.oom_kill is not None and kills is not None and kills > row.oom_kill)
    oom_rose = oom_rose or stops.kernel_oom_kills(doc)  # or the kernel log's OOM killer, since the cursor
    ledger.update_host(
        host.name,
        last_probe_at=now,
        unreachable_since=None,
        probe_failures=0,
        next_probe_at=None,
        slots_kind=doc.slots.kind,
        slots_total=clamp_slots(doc.slots.total),
        disk_free_bytes=doc.disk.free_bytes,
        oom_kill=kills,
    )
    on_host = doc.entries()
    out = Reconciled()
    missing: list[Job] = []
    for job in ledger.jobs(states=ACTIVE):
        if job.host != host.name:
            continue
        multi = parts.get(job.id) if parts is not None else None
        seen = gangs.standing_entry(multi) if multi else on_host.get(job.id)
        if multi and seen is None:
            continue  # node 0's spec never arrived: the tick sends it again with the node's section
        if seen is None or seen.attempt < job.attempt_count:
            missing.append(job)
            continue
        if seen.attempt != job.attempt_count:
            continue
        outcome = _apply(ledger, job, seen)
        if multi and outcome:
            out.multi_node_ended.append(job.id)
        if outcome == "succeeded":
            out.succeeded.append(job.id)
        elif outcome == "failed" and is_setup_failure(seen.exit_or_empty):
            attempt = ledger.attempt(job.id, job.attempt_count)
            exit_doc = seen.exit_or_empty
            decision = settle_setup_failure(ledger, job.id, host.name, attempt.bundle_sha if attempt else "",
                                            exit_doc, _exit_message(exit_doc))
            out.settled.append(Settled(job.id, outcome, "setup", decision))
        elif outcome in ("failed", "lost"):
            exit_doc = seen.exit_or_empty
            if outcome == "lost" and job.state != JobState.LOST.value:
                ledger.transition(job.id, JobState.LOST, message=_exit_message(exit_doc), of_attempt=job.attempt_count)
            scan = seen.scan if seen.scan is not None else Scan()
            rebooted = outcome == "lost" and bool(seen.boot_id) and seen.boot_id != doc.boot_id
            klass = classify(
                exit_doc.wrapper_code if outcome == "failed" else None,
                exit_doc.trainer_code if outcome == "failed" else None,
                [*earlier_hits(ledger, job), *scan.hits], scan.traceback,
                oom_kill_rose=oom_rose, rebooted=rebooted,
                wrapper_signal=stops.wrapper_signal(exit_doc) if outcome == "failed" else None)
            decision = settle(ledger, job.id, klass, settings, attempt=job.attempt_count)
            if decision.action != "stale":  # another gpuq command settled this attempt first
                out.settled.append(Settled(job.id, outcome, klass, decision, rebooted))
    if missing:
        _reenqueue(ledger, host, settings, missing)  # `enqueue --serve` also ensures the agent
    else:
        _revive_agent(ledger, host, settings, report)
    return out


def earlier_hits(ledger: Ledger, job: Job) -> list[ScanHit]:
    """Crash signatures earlier ticks found in this attempt's log (stored as "crash" findings)."""
    attempt = ledger.attempt(job.id, job.attempt_count)
    since = attempt.created_at if attempt is not None else 0.0
    hits = []
    for event in ledger.events(subject=job.id, limit=50):
        if event.rule == "crash" and event.time >= since:
            hits += [ScanHit(signature=name, line=event.message) for name in signatures_of(event.action)]
    return hits


def settle(ledger: Ledger, job_id: str, klass: str, settings: Settings, *, attempt: int | None = None) -> Decision:
    """The job's current attempt ended badly (the attempt is already EXITED or LOST): requeue it
    with resume while retries last, else FAILED (never retried) or LOST (`gpuq resume` later).

    ``attempt``: the attempt that ended.  When another gpuq command has settled it and started the
    job again meanwhile, nothing changes (a stale tick must not end or requeue the newer attempt)."""
    job = ledger.job(job_id)
    if attempt is not None and (job.attempt_count != attempt or JobState(job.state).terminal
                                or job.state == JobState.QUEUED.value):
        return Decision("stale", f"attempt {attempt} was already settled (the job is {job.state}, "
                                f"attempt {job.attempt_count})")
    retries = job.retries if job.retries is not None else settings.retries
    decision = decide(klass, ledger.failed_attempts(job_id), retries)
    if decision.action == "requeue":
        if job.state != JobState.LOST.value:
            ledger.transition(job_id, JobState.LOST, message=decision.reason, of_attempt=job.attempt_count)
        ledger.transition(job_id, JobState.QUEUED, message=decision.reason, of_attempt=job.attempt_count)
    elif decision.action == "keep_lost" and job.state in (JobState.LOST.value, JobState.RUNNING.value,
                                                            JobState.ASSIGNED.value):
        ledger.transition(job_id, JobState.LOST, message=decision.reason, of_attempt=job.attempt_count)
    else:
        ledger.transition(job_id, JobState.FAILED, message=decision.reason, of_attempt=job.attempt_count)
    return decision


def _revive_agent(ledger: Ledger, host: Host, settings: Settings, report: Probe) -> None:
    """An agent that died with work pending (inbox, or claimed and never launched) is relaunched.

    Safe without asking (docs/host-protocol.md, detached launch): the flock admits one agent per
    root, and a new agent adopts live attempt groups and never re-runs a launched attempt.
    """
    doc = report.doc if report.doc is not None else _EMPTY
    pending = [j for j in doc.jobs if j.state in ("queued", "claimed")]
    if doc.agent.alive or not pending:
        return
    row = ledger.host(host.name)
    if row is None or not row.agent_bundle or row.kind == "slurm":  # on a login node Slurm holds the queue
        return
    verdict = ensure_agent(host, row.agent_bundle, settings)
    ledger.record_event("host", host.name, f"agent was not running with {len(pending)} jobs pending: {verdict}")


def _apply(ledger: Ledger, job: Job, seen: JobEntry) -> str:
    """Move the attempt (and, for success or cancel, the job) to what the host says; returns
    "succeeded" | "failed" (exited non-zero) | "lost" (vanished) | "" (nothing ended)."""
    number = job.attempt_count
    state = seen.state
    _progress(ledger, job, number, seen)
    if state == "running":
        ledger.transition(job.id, AttemptState.RUNNING, attempt=number, message="group alive")
        ledger.transition(job.id, JobState.RUNNING, of_attempt=number)
    elif state == "exited":
        exit_doc = seen.exit_or_empty
        code = exit_doc.code
        ledger.update_attempt(
            job.id, number, exit_code=code, trainer_code=exit_doc.trainer_code,
            phase=exit_doc.phase, message=_exit_message(exit_doc),
            ended_at=exit_doc.ended_at, started_at=exit_doc.started_at,
        )
        if _time_limit_chunk(ledger, job, number, exit_doc, code, seen):
            message = (f"Slurm time limit: stopped at step {exit_doc.last_step} with a checkpoint; "
                       "continues in a new Slurm job (not counted against retries=)")
            ledger.transition(job.id, AttemptState.PREEMPTED, attempt=number, message=message)
            ledger.transition(job.id, JobState.PREEMPTED, message=message, of_attempt=number)
            ledger.transition(job.id, JobState.QUEUED, message=message, of_attempt=number)
            return ""
        ledger.transition(job.id, AttemptState.LOST if exit_doc.vanished and code != protocol.EXIT_OK
                          else AttemptState.EXITED, attempt=number, message=_exit_message(exit_doc))
        if code == protocol.EXIT_OK:
            ledger.transition(job.id, JobState.SUCCEEDED, message="exit record 0, artifacts verified",
                              of_attempt=number)
            return "succeeded"
        if seen.cancel_requested:
            ledger.transition(job.id, JobState.CANCELLED, message=_exit_message(exit_doc), of_attempt=number)
            return ""
        if exit_doc.vanished:  # the agent wrote it: the wrapper's whole group died (kill -9)
            return "lost"
        return "failed"
    elif state == "dead":
        message = "process group gone without an exit record"
        ledger.update_attempt(job.id, number, message=message, ended_at=time.time())
        ledger.transition(job.id, AttemptState.LOST, attempt=number, message=message)
        ledger.transition(job.id, JobState.LOST, message=message, of_attempt=number)
        return "lost"
    elif state == "withdrawn":
        ledger.transition(job.id, AttemptState.KILLED, attempt=number, message="withdrawn from the inbox")
        ledger.transition(job.id, JobState.CANCELLED, message="withdrawn from the inbox", of_attempt=number)
    return ""


def _time_limit_chunk(ledger: Ledger, job: Job, number: int, exit_doc: ExitRecord, code: int,
                      seen: JobEntry) -> bool:
    """A Slurm job stopped near its time limit (the wrapper's ``slurm_time_limit``) that trained past
    where this attempt began: one chunk of a run longer than the partition allows, continued like a
    preemption.  A chunk that made no progress is an ordinary stop (it counts against retries=, so a
    time limit shorter than the start-up cannot loop forever)."""
    if not exit_doc.slurm_time_limit or code == protocol.EXIT_OK or seen.cancel_requested:
        return False
    last = exit_doc.last_step
    previous = ledger.attempt(job.id, number - 1) if number > 1 else None
    began = (previous.step or 0) if previous is not None else 0
    return last is not None and last > began


def _progress(ledger: Ledger, job: Job, number: int, seen: JobEntry) -> None:
    beat = seen.beat
    fields: dict[str, Any] = {}
    if beat is not None:
        fields.update(step=beat.step, total_steps=beat.total_steps, epoch=beat.epoch, loss=beat.loss,
                      heartbeat_at=beat.time)
    fields.update(observed.attempt_progress(seen))  # no heartbeat: what the log's tail says
    if seen.launched_at is not None:
        fields["started_at"] = seen.launched_at
    if seen.log_bytes is not None:
        fields["log_bytes"] = seen.log_bytes
    if fields:
        ledger.update_attempt(job.id, number, **fields)
    pointer = seen.ckpt
    if pointer is not None and pointer.sha256:
        ledger.record_checkpoint(job.id, number, pointer.recorded())
    nodes = seen.nodes
    if nodes is not None and len(nodes) > 1:  # which machine got which node rank, once per attempt
        ranks = ", ".join(f"node {n.rank} on {n.host}" for n in nodes)
        message = f"attempt {number} runs on {len(nodes)} nodes: {ranks}"
        if not any(e.message == message for e in ledger.events(subject=job.id, limit=100)):
            ledger.record_event("job", job.id, message)


def _reenqueue(ledger: Ledger, host: Host, settings: Settings, jobs: Sequence[Job]) -> None:
    """Specs the ledger recorded but the host never received (controller died mid-launch)."""
    specs = []
    sha = ""
    for job in jobs:
        attempt = ledger.attempt(job.id, job.attempt_count)
        if attempt is None:
            continue
        sha = attempt.bundle_sha
        specs.append(job_spec(job, attempt, settings, sweep=ledger.sweep(job.sweep_id), host=ledger.host(host.name)))
    if specs:
        verdicts = enqueue(host, sha, specs, settings)
        for job_id, verdict in verdicts.root.items():
            if verdict == "queued":
                ledger.record_event("job", job_id, f"re-enqueued on {host.name} (spec was never delivered)")
            elif verdict == "busy":  # the agent never runs two attempts of a job at once
                ledger.record_event("job", job_id, f"waiting on {host.name}: an earlier attempt of this job is "
                                    "still alive there", unless_repeated=True)


def collect(ledger: Ledger, host: Host, agent_bundle: str, job_ids: Sequence[str],
            report: Probe | None = None) -> None:
    """Read finished jobs' summaries and file hashes into the ledger: from the probe's document
    when it carried them, else in one ``collect`` round trip for the rest."""
    doc = report.doc if report is not None and report.doc is not None else _EMPTY
    carried = {j.job_id: j.results for j in doc.jobs if j.results is not None}
    record_collected(ledger, {jid: carried[jid] for jid in job_ids if jid in carried})
    rest = [jid for jid in job_ids if jid not in carried]
    if not rest:
        return
    result = host.run(agent_argv(host, agent_bundle, "collect", *rest), timeout=120)
    if result.exit_code != 0:
        raise GpuqError(f"host {host.name}: collecting results failed: {result.stderr.strip()[-300:]}")
    record_collected(ledger, host_documents.read_collect(host.name, result.stdout).root)


def record_collected(ledger: Ledger, docs: Mapping[str, Results]) -> None:
    for job_id, doc in docs.items():
        summary = doc.summary
        metrics: list[tuple[str, str, float, int | None, int | None]] = []
        for scope, row in (("final", summary.final if summary else None), ("best", summary.best if summary else None)):
            if row is not None:  # finite numbers only, checked at the edge
                metrics += [(scope, name, value, row.step_int(), row.epoch_int())
                            for name, value in row.metrics().items()]
        for name, points in (summary.curves if summary else {}).items():  # checked finite and bounded at the edge
            metrics += [("curve", name, value, int(step), None) for step, value in points]
        artifacts = [(f.path, f.bytes, f.sha256) for f in doc.files]
        ledger.record_results(job_id, doc.attempt, metrics=metrics, artifacts=artifacts, checkpoint=doc.ckpt)


# --- placement: capacity → plan → push → deliver ------------------------------------------


def host_capacity(row: HostRow, active: Sequence[Job], attempts: dict[str, Attempt], settings: Settings,
                  rates: EpochRates, now: float) -> HostSlots:
    """What the scheduler may assume about one host, from the ledger alone (no round trip).

    Work already on the host occupies its slots: running jobs until their estimate runs out
    (at least one more heartbeat), then assigned jobs in order behind them.
    """
    total = row.slots_total
    slurm = slurm_hosts.settings_of(row)
    if row.kind == "local":
        total = settings.local_cpu_slots or os.cpu_count() or 1
    elif slurm is not None:  # a slot is a place in Slurm's queue (the host's job cap); Slurm packs the GPUs
        total = slurm.max_jobs
    free_at = [0.0] * clamp_slots(total)  # the ledger may hold what an older gpuq let a host report
    mine = [j for j in active if j.host == row.name
            or (j.id in attempts and row.name in attempts[j.id].node_hosts()[1:])]  # a node of a multi-node job
    mine.sort(key=lambda j: (j.state != JobState.RUNNING.value, attempts[j.id].created_at if j.id in attempts else 0))
    for job in mine:
        need = 1 if slurm is not None else min(job.gpus, len(free_at))
        if need <= 0:
            continue
        est = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=rates)
        attempt = attempts.get(job.id)
        started = attempt.started_at if attempt is not None else None
        remaining = max(float(settings.heartbeat_s), est - (now - started)) if started else est
        free_at.sort()
        begin = free_at[need - 1]
        for index in range(need):
            free_at[index] = begin + remaining
    reason = ""
    if row.hold_reason:  # disk full, failed preflight, Xid: no new work until cleared
        reason = f"held: {row.hold_reason}"
    elif row.unreachable_since is not None:
        reason = f"unreachable since {datetime.fromtimestamp(row.unreachable_since, timezone.utc):%Y-%m-%d %H:%M:%SZ}"
    budget = None
    if row.disk_free_bytes is not None:  # what jobs may fill before the host's disk gate refuses them
        gate = max(row.min_free_gb, settings.min_free_gb) * 1e9
        budget = max(0, int(row.disk_free_bytes - gate))
    return HostSlots(host=row.name, total=total, usable=not reason and total > 0, slot_free_at=tuple(free_at),
                     reason=reason, disk_free_bytes=budget, job_slots=1 if slurm is not None else 0,
                     max_gpus=(slurm.gpus_per_node or None) if slurm is not None and slurm.gres else None,
                     max_nodes=max(1, slurm.nodes) if slurm is not None else 1,
                     gang=slurm is None and row.kind != "local")


def plan_job(job_id: str, *, gpus: int, config: str, task: str, epochs: int, est_min: float | None,
             host_pin: str | None, rates: EpochRates, ckpt_bytes: dict[str, int] | None = None,
             nodes: int = 1) -> PlanJob:
    """``ckpt_bytes``: largest checkpoint seen per config; a job keeps two (latest + best)."""
    est = estimate_s(config=config, task=task, epochs=epochs, est_min=est_min, history=rates)
    return PlanJob(job_id, gpus, est, host_pin, disk_bytes=2 * (ckpt_bytes or {}).get(config, 0), nodes=nodes)


def capacities(ledger: Ledger, settings: Settings, rows: Sequence[HostRow], rates: EpochRates) -> list[HostSlots]:
    active = ledger.jobs(states=ACTIVE)
    attempts = ledger.latest_attempts(j.id for j in active)
    now = time.time()
    return [host_capacity(row, active, attempts, settings, rates, now) for row in rows]


def plan_and_push(ledger: Ledger, fleet: Fleet, settings: Settings, jobs: Sequence[PlanJob],
                  rows: Sequence[HostRow], bundle: Bundle, rates: EpochRates,
                  pushed: list[str] | None = None) -> tuple[Plan, dict[str, str]]:
    """Plan, then place the bundle on every host that got work.  A host whose push fails is
    dropped and the jobs are planned again without it (once per failing host).

    Returns the final plan and {host: why it was dropped}; ``pushed`` collects the hosts that
    received the bundle's bytes (the others had it already).
    """
    dropped: dict[str, str] = {}
    while True:
        slots = [
            s if s.host not in dropped else s.model_copy(update={"usable": False, "reason": dropped[s.host]})
            for s in capacities(ledger, settings, rows, rates)
        ]
        decided = plan(jobs, slots)
        targets = sorted({n for a in decided.assignments for n in (a.host, *a.peers)} - set(dropped))
        failed = push_all([fleet.named(name) for name in targets], bundle, pushed)
        for name in targets:
            if name not in failed:
                ledger.update_host(name, agent_bundle=bundle.sha256)
        dropped.update({name: f"bundle push failed: {err}" for name, err in failed.items()})
        if settings.preflight:  # a host's first job waits for its GPU preflight (docs/health.md)
            fresh = [name for name in targets if name not in failed and _needs_preflight(ledger.host(name))]
            for name, verdict in preflight_all(ledger, fleet, settings, fresh, bundle.sha256).items():
                if verdict.verdict == "fail":
                    dropped[name] = f"failed its GPU preflight: {verdict.detail}"
                elif verdict.verdict == "unreachable":
                    dropped[name] = f"unreachable for its GPU preflight: {verdict.detail}"
        if not set(dropped) & set(targets):
            return decided, dropped


@dataclass
class HealthVerdict:
    host: str
    verdict: str  # "pass" | "warn" | "fail" | "unreachable" (no verdict)
    detail: str  # the warning/failing checks, one line
    doc: HealthDocument | None = None


def _needs_preflight(row: HostRow | None) -> bool:
    """A host's first job waits for its GPU preflight; a Slurm login node has no GPUs of its own to
    check (Slurm's node health is the cluster's business)."""
    return row is not None and row.health == "" and row.kind != "slurm"


def preflight(host: Host, agent_bundle: str, settings: Settings, row: HostRow | None = None) -> HealthVerdict:
    """The agent's ``health`` verb (GPU preflight, docs/health.md): one round trip, a few seconds of
    GPU sampling.  A transport failure raises HostError; the agent's verdict is returned."""
    argv = ["health", "--samples", str(settings.preflight_samples)]
    if row is not None:
        argv += ["--min-free-gb", str(max(row.min_free_gb, settings.min_free_gb))]
        if row.python and row.train_device != "cpu":  # a rehearsal host trains on CPU: no CUDA torch expected
            argv += ["--python", row.python]
    result = host.run(agent_argv(host, agent_bundle, *argv), timeout=60 + 2 * settings.preflight_samples)
    try:
        doc = host_documents.read_health(host.name, result.stdout)
    except host_documents.ProtocolError as exc:
        tail = (result.stderr or result.stdout).strip()[-300:]
        return HealthVerdict(host.name, "fail", f"the health check printed no verdict (exit {result.exit_code}, "
                                                f"{exc.detail}): {tail}")
    bad = [f"{c.check}: {c.detail}" for c in doc.problems()]
    return HealthVerdict(host.name, doc.verdict, "; ".join(bad) or "all checks passed", doc)


def record_health(ledger: Ledger, verdict: HealthVerdict) -> None:
    """Store a preflight verdict; a FAIL holds the host (no new jobs) until a later PASS or WARN."""
    row = ledger.host(verdict.host)
    if row is None:
        return
    fields: dict[str, Any] = {"health": verdict.verdict, "health_at": time.time(), "health_detail": verdict.detail}
    if verdict.verdict == "fail":
        fields["hold_reason"] = f"unhealthy: {verdict.detail}"
    elif row.hold_reason.startswith("unhealthy"):
        fields["hold_reason"] = ""
    ledger.update_host(verdict.host, **fields)
    severity = {"pass": "info", "warn": "warn", "fail": "escalate"}[verdict.verdict]
    action = {"pass": "", "warn": "jobs may run; look at the warnings",
              "fail": "no jobs go to this host until `gpuq doctor` passes; gpuq places work elsewhere"}
    ledger.record_finding("host", verdict.host, severity=severity, rule="preflight",
                          message=f"GPU preflight {verdict.verdict.upper()}: {verdict.detail}",
                          action=action[verdict.verdict])


def preflight_all(ledger: Ledger, fleet: Fleet, settings: Settings, names: Sequence[str],
                  agent_bundle: str) -> dict[str, HealthVerdict]:
    """Preflight these hosts in parallel and record each verdict; an unreachable host fails."""
    def one(name: str) -> HealthVerdict:
        row = ledger.host(name)
        try:
            return preflight(fleet.named(name), agent_bundle or (row.agent_bundle if row else ""), settings, row)
        except HostError as exc:  # no verdict on its GPUs: not recorded, but no job goes there now
            return HealthVerdict(name, "unreachable", str(exc))

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        verdicts = list(pool.map(one, names))
    for verdict in verdicts:
        if verdict.verdict != "unreachable":
            record_health(ledger, verdict)
    return {v.host: v for v in verdicts}


def deliver(ledger: Ledger, fleet: Fleet, settings: Settings, decided: Plan, jobs: dict[str, Job],
            bundle_sha: str) -> dict[str, str]:
    """Record attempts and enqueue every assignment of ``decided``, hosts in parallel.  A multi-node
    job goes out only when all its nodes start now (gangs.hold_back); its parts go to every node host."""
    decided, waiting = gangs.hold_back(decided)
    for job_id, why in waiting:
        ledger.record_event("job", job_id, f"still queued: {why}", unless_repeated=True)
    by_host: dict[str, list[Job]] = {}
    multi = [a for a in decided.assignments if a.peers]
    for assignment in decided.assignments:
        if not assignment.peers:
            by_host.setdefault(assignment.host, []).append(jobs[assignment.job_id])
    for name, group in by_host.items():
        row = ledger.host(name)
        slurm = slurm_hosts.settings_of(row) if row is not None else None
        if slurm is not None:  # a Slurm host's queue is Slurm's: send no more than its cap, the rest stay QUEUED
            held = sum(1 for j in ledger.jobs(states=ACTIVE) if j.host == name and j.id not in jobs)
            by_host[name] = group[:max(0, slurm.max_jobs - held)]
    hosts = {name: fleet.named(name) for name in by_host}
    failed = deliver_all(ledger, hosts, bundle_sha, by_host, settings)
    for name, err in gangs.deliver(ledger, fleet, settings, multi, jobs, bundle_sha).items():
        failed[name] = f"{failed[name]}; {err}" if name in failed else err
    return failed


# --- work stealing ---------------------------------------------------------------------------


def steal(ledger: Ledger, fleet: Fleet, settings: Settings, probes: Sequence[Probe], rates: EpochRates) -> list[Move]:
    """Move jobs still waiting in a busy host's inbox to hosts with slots free now.

    The source agent withdraws a job by atomic rename out of its inbox; only a job it
    withdrew moves (the ledger records the move in one transaction, then the target gets
    the spec).  A job the source agent claimed meanwhile stays where it is.
    """
    reports = {p.host: p for p in probes}
    ledger_jobs = {j.id: j for j in ledger.jobs(states=[JobState.ASSIGNED])}
    queued: dict[str, list[QueuedJob]] = {}
    slots: list[HostSlots] = []
    rows = ledger.hosts()
    for row in rows:
        if row.kind == "slurm":
            continue  # nothing waits in a Slurm host's inbox (Slurm holds the queue), and its slots are not GPUs
        report = reports.get(row.name)
        if report is not None and report.ok and report.doc is not None:
            docs = report.doc.jobs
            total = clamp_slots(report.doc.slots.total)
            free = min(clamp_slots(report.doc.slots.free), total)
        elif report is not None and report.reachable and not row.agent_bundle:
            docs, total = [], clamp_slots(row.slots_total)  # reachable, nothing of ours placed there yet: all idle
            free = total
        else:
            continue  # unreachable hosts neither give nor take work
        waiting = [d for d in docs if d.state == "queued"]
        entries = []
        for doc in waiting:
            job = ledger_jobs.get(doc.job_id)
            if job is None or job.host != row.name or doc.attempt != job.attempt_count:
                continue
            if job.nodes > 1:
                continue  # a node of a multi-node job stays with its gang
            est = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=rates)
            entries.append(QueuedJob(job.id, job.gpus, est, job.host_pin))
        queued[row.name] = entries
        # busy slots free at an unknown time; only "free now" matters to a steal, so any positive
        # horizon works (a few heartbeats)
        free_at = tuple([0.0] * free + [float(settings.heartbeat_s) * 6] * max(0, total - free))
        slots.append(HostSlots(host=row.name, total=total, slot_free_at=free_at))
    if len(slots) < 2 or not any(queued.values()):
        return []
    # a sweep moves only among the hosts it may use: those named at submit, else every remote
    # host (the local host takes part only when no remote host is registered)
    default = {r.name for r in rows if r.kind != "local"} or {r.name for r in rows}
    allowed: dict[str, set[str]] = {}
    for job in ledger_jobs.values():
        if job.sweep_id not in allowed:
            sweep = ledger.sweep(job.sweep_id)
            allowed[job.sweep_id] = (sweep.host_set() if sweep is not None else set()) or default
    moves = [m for m in plan_steals(queued, slots) if m.to_host in allowed[ledger_jobs[m.job_id].sweep_id]]
    done: list[Move] = []
    by_source: dict[str, list[Move]] = {}
    for move in moves:
        by_source.setdefault(move.from_host, []).append(move)
    for source, group in by_source.items():
        host = fleet.named(source)
        src_row = ledger.host(source)
        argv = agent_argv(host, src_row.agent_bundle if src_row else "", "withdraw", *[m.job_id for m in group])
        try:
            result = host.run(argv, timeout=60)
            verdicts = host_documents.read_verdicts(host.name, result.stdout) if result.exit_code == 0 else NONE_SAID
        except (HostError, host_documents.ProtocolError):  # nothing moves from a host that answers garbage
            continue
        for move in group:
            if verdicts.of(move.job_id) != "withdrawn":
                continue  # claimed meanwhile: it runs where it is
            job = ledger_jobs[move.job_id]
            old = ledger.attempt(job.id, job.attempt_count)
            if old is None:
                continue
            target_row = ledger.host(move.to_host)
            bundle_sha = old.bundle_sha
            try:
                target = fleet.named(move.to_host)
                if target_row is not None and target_row.agent_bundle != bundle_sha:
                    _ensure_bundle_from_cache(target, bundle_sha, settings)
                    ledger.update_host(move.to_host, agent_bundle=bundle_sha)
                attempt = ledger.move_job(job.id, from_attempt=old.number, to_host=move.to_host,
                                          bundle_sha=bundle_sha, message=f"moved unstarted from {source} to "
                                          f"{move.to_host} (work stealing)")
                spec = job_spec(ledger.job(job.id), attempt, settings, sweep=ledger.sweep(job.sweep_id),
                                host=target_row)
                enqueue(target, bundle_sha, [spec], settings)
            except GpuqError as exc:
                ledger.record_event("job", job.id, f"move to {move.to_host} incomplete: {exc}; the next tick "
                                    "re-delivers it")
                continue
            done.append(move)
    return done


def _ensure_bundle_from_cache(host: Host, sha: str, settings: Settings) -> None:
    path = settings.bundle_cache / f"{sha}.tar"
    if not path.is_file():
        raise GpuqError(f"bundle {sha[:12]} is no longer in the local cache; cannot place it on {host.name}")
    ensure_bundle(host, Bundle(sha, path, 0, path.stat().st_size))
