"""Reconcile: map one host's status document onto the ledger, only ever through ``Ledger.transition``.

An attempt that ended badly is classified (``failures.classify``) and settled by the retry policy
(``tick/settle.py``); a spec the host never received is sent again; an agent that died with work
pending is relaunched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.agent.launcher import attempt_spec, enqueue, ensure_agent
from orchestrator.core.config import Settings
from orchestrator.core.specs import clamp_slots
from orchestrator.core.states import JobState
from orchestrator.health import failures, stops
from orchestrator.health.setup_holds import is_setup_failure, settle_setup_failure
from orchestrator.health.verdicts import Decision
from orchestrator.host_documents import JobEntry, RetryDecision, Scan, ScanHit
from orchestrator.hosts.base import Host
from orchestrator.ledger import HostFields, Job, Ledger
from orchestrator.scheduling.gpumatch import facts_json
from orchestrator.tick import ACTIVE, gangs, host_retries
from orchestrator.tick.attempts import apply, exit_message
from orchestrator.tick.probe import Probe
from orchestrator.tick.settle import settle


@dataclass(frozen=True)
class Settled:
    """An attempt that ended badly this tick, classified (docs/health.md) and acted on.  It names the job
    and attempt as reconcile read them: another command may have placed the job on this host after the
    tick listed the host's jobs."""

    job_id: str
    name: str
    attempt: int
    outcome: str  # "failed" (exited non-zero) | "lost" (vanished: no exit record of its own)
    klass: str
    decision: Decision
    rebooted: bool = False
    why: str = ""  # HEALED: what the host's agent saw stall


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
    oom_rose = _record_probe(ledger, host.name, report)
    on_host = report.document.entries()
    out = Reconciled()
    missing: list[Job] = []
    mine = [job for job in ledger.jobs(states=ACTIVE) if job.host == host.name]
    who = host_retries.who_retries(ledger, host, mine, on_host)  # before any attempt that ended badly is settled
    for job in mine:
        multi = parts.get(job.id) if parts is not None else None
        seen = gangs.standing_entry(multi) if multi else on_host.get(job.id)
        if multi and seen is None:
            continue  # node 0's spec never arrived: the tick sends it again with the node's section
        if seen is None or seen.attempt < job.attempt_count:
            missing.append(job)
            continue
        if seen.attempt > job.attempt_count and seen.host_retried:  # the host retried attempts gpuq saw run
            job = _catch_up(ledger, job, seen, settings, report, oom_rose, out)
        if seen.attempt != job.attempt_count or (job.id in who and who[job.id] is None):
            continue  # not this attempt; or the host could not say who retries it: the next look settles it
        healed = who.get(job.id)
        if healed is not None and host_retries.host_stall(healed) and seen.state == "exited":
            _healed(ledger, job, seen, healed, settings, out)
            continue
        outcome = apply(ledger, job, seen)
        if multi and outcome:
            out.multi_node_ended.append(job.id)
        if outcome == "succeeded":
            out.succeeded.append(job.id)
        elif outcome == "failed" and is_setup_failure(seen.exit_or_empty):
            attempt = ledger.attempt(job.id, job.attempt_count)
            exit_doc = seen.exit_or_empty
            decision = settle_setup_failure(ledger, job.id, host.name, attempt.bundle_sha if attempt else "",
                                            exit_doc, exit_message(exit_doc))
            out.settled.append(Settled(job.id, job.name, job.attempt_count, outcome, "setup", decision))
        elif outcome in ("failed", "lost"):
            done = _settle_ended(ledger, job, seen, outcome, settings, report, oom_rose, who.get(job.id))
            if done is not None:
                out.settled.append(done)
    if missing:
        _reenqueue(ledger, host, settings, missing)  # `enqueue --serve` also ensures the agent
    else:
        _revive_agent(ledger, host, settings, report)
    return out


def _record_probe(ledger: Ledger, name: str, report: Probe) -> bool:
    """The host's row after a probe that answered; returns whether its OOM killer fired since the last one."""
    now = time.time()
    row = ledger.host(name)
    doc = report.document
    kills = doc.memory.oom_kill if doc.memory is not None else None
    oom_rose = bool(row is not None and row.oom_kill is not None and kills is not None and kills > row.oom_kill)
    oom_rose = oom_rose or stops.kernel_oom_kills(doc)  # or the kernel log's OOM killer, since the cursor
    # its GPUs for `gpu=` / `gpu_mem=`; a GPU host whose nvidia-smi listed none this time keeps what was known
    fields: HostFields = {
        "last_probe_at": now,
        "unreachable_since": None,
        "probe_failures": 0,
        "next_probe_at": None,
        "slots_kind": doc.slots.kind,
        "slots_total": clamp_slots(doc.slots.total),
        "disk_free_bytes": doc.disk.free_bytes,
        "oom_kill": kills,
    }
    if doc.gpus or doc.slots.kind != "gpu":
        fields["gpu_facts"] = facts_json((g.name, g.mem_total_mib) for g in doc.gpus)
    ledger.update_host(name, **fields)
    return oom_rose


def _settle_ended(ledger: Ledger, job: Job, seen: JobEntry, outcome: str, settings: Settings, report: Probe,
                  oom_rose: bool, retried: RetryDecision | None = None) -> Settled | None:
    """An attempt that failed or vanished: classified (crash lines, OOM, reboot) and settled by the
    retry policy, or, when the host's agent has retried it (``retried``), adopted as gpuq's own retry;
    None when another gpuq command settled it first."""
    exit_doc = seen.exit_or_empty
    if outcome == "lost" and job.state != JobState.LOST.value:
        ledger.transition(job.id, JobState.LOST, message=exit_message(exit_doc), of_attempt=job.attempt_count)
    scan = seen.scan if seen.scan is not None else Scan()
    rebooted = outcome == "lost" and bool(seen.boot_id) and seen.boot_id != report.document.boot_id
    hits = [*earlier_hits(ledger, job), *scan.hits]
    klass = failures.classify(
        exit_doc.wrapper_code if outcome == "failed" else None,
        exit_doc.trainer_code if outcome == "failed" else None,
        hits, scan.traceback,
        oom_kill_rose=oom_rose, rebooted=rebooted,
        wrapper_signal=stops.wrapper_signal(exit_doc) if outcome == "failed" else None)
    repeated = _repeated(ledger, job, hits, scan.traceback) if failures.repeat_matters(klass) else ""
    if retried is not None and host_retries.by_host(retried):
        decision = host_retries.adopt(ledger, job, klass, settings, repeated=repeated, why=retried.why or "")
    else:
        decision = settle(ledger, job.id, klass, settings, attempt=job.attempt_count, repeated=repeated)
    if decision.action != "stale":  # another gpuq command settled this attempt first
        return Settled(job.id, job.name, job.attempt_count, outcome, klass, decision, rebooted)
    return None


def _catch_up(ledger: Ledger, job: Job, seen: JobEntry, settings: Settings, report: Probe, oom_rose: bool,
              out: Reconciled) -> Job:
    """Attempts the host's agent retried by itself before this look (``seen.host_retried``, oldest first):
    each is ended as its exit record says and settled as gpuq's own retry, its successor adopted; returns
    the job as it stands after them (its current attempt is the host's newest when all were adopted)."""
    for link in seen.host_retried:
        if link.attempt != job.attempt_count or link.exit is None:
            continue
        first = seen.scan is not None and link.attempt == seen.host_retried[0].attempt
        ended = JobEntry(job_id=job.id, attempt=link.attempt, state="exited", exit=link.exit.model_dump(),
                         scan=seen.scan if first else None)
        decision = RetryDecision.model_validate({"by": "host", "attempt": link.attempt + 1, "why": link.why,
                                                 "class": link.klass, "stacks": link.stacks})
        if host_retries.host_stall(decision):
            _healed(ledger, job, ended, decision, settings, out)
            job = ledger.job(job.id)
            if job.attempt_count == link.attempt:
                break
            continue
        outcome = apply(ledger, job, ended)
        if outcome in ("failed", "lost"):
            done = _settle_ended(ledger, job, ended, outcome, settings, report, oom_rose, decision)
            if done is not None:
                out.settled.append(done)
        job = ledger.job(job.id)
        if job.attempt_count == link.attempt:
            break  # not adopted (another command settled it): its events say why
    return job


HEALED = "healed"  # a Settled outcome: a stall the host's agent ended and retried itself (tick/host_retries.py)


def _healed(ledger: Ledger, job: Job, seen: JobEntry, decision: RetryDecision, settings: Settings,
            out: Reconciled) -> None:
    """Attempt n stalled and its host healed it (stacks, kill, attempt n+1 with resume): recorded as gpuq's
    own stall kill and retry would be."""
    done = host_retries.adopt_stall(ledger, job, seen, decision, settings)
    if done.action != "stale":
        out.settled.append(Settled(job.id, job.name, job.attempt_count, HEALED, str(decision.klass), done,
                                   why=decision.why or ""))


def earlier_hits(ledger: Ledger, job: Job, number: int | None = None, *, limit: int = 50) -> list[ScanHit]:
    """Crash signatures earlier ticks found in attempt ``number``'s log (default: the current attempt's),
    stored as "crash" findings (their ``signatures`` field), each with the finding's first log line (its reason)."""
    number = job.attempt_count if number is None else number
    attempt = ledger.attempt(job.id, number)
    since = attempt.created_at if attempt is not None else 0.0
    after = ledger.attempt(job.id, number + 1) if number < job.attempt_count else None
    until = after.created_at if after is not None else float("inf")
    hits = []
    for event in ledger.events(subject=job.id, limit=limit):
        if event.rule == "crash" and since <= event.time < until:
            hits += [ScanHit(signature=name, line=event.reason) for name in event.signature_names]
    return hits


def _repeated(ledger: Ledger, job: Job, hits: list[ScanHit], traceback: Sequence[str]) -> str:
    """The exception line this attempt ended with, when the attempt before ended with the same one
    (docs/health.md: a deterministic crash is not retried again); "" otherwise."""
    if job.attempt_count < 2:
        return ""
    now = failures.exception_line(hits, traceback)
    before = failures.exception_line(earlier_hits(ledger, job, job.attempt_count - 1, limit=200))
    return now if failures.same_exception(now, before) else ""



def _revive_agent(ledger: Ledger, host: Host, settings: Settings, report: Probe) -> None:
    """An agent that died with work pending (inbox, or claimed and never launched) is relaunched.

    Safe without asking (docs/host-protocol.md, detached launch): the flock admits one agent per
    root, and a new agent adopts live attempt groups and never re-runs a launched attempt.
    """
    doc = report.document
    pending = [j for j in doc.jobs if j.state in ("queued", "claimed")]
    if doc.agent.alive or not pending:
        return
    row = ledger.host(host.name)
    if row is None or not row.agent_bundle or row.kind == "slurm":  # on a login node Slurm holds the queue
        return
    verdict = ensure_agent(host, row.agent_bundle, settings)
    ledger.record_event("host", host.name, f"agent was not running with {len(pending)} jobs pending: {verdict}")



def _reenqueue(ledger: Ledger, host: Host, settings: Settings, jobs: Sequence[Job]) -> None:
    """Specs the ledger recorded but the host never received (controller died mid-launch)."""
    specs = []
    sha = ""
    for job in jobs:
        attempt = ledger.attempt(job.id, job.attempt_count)
        if attempt is None:
            continue
        sha = attempt.bundle_sha
        specs.append(attempt_spec(ledger, job, attempt, settings, host=host.name))  # its host retries as first sent
    if specs:
        verdicts = enqueue(host, sha, specs, settings)
        for job_id, verdict in verdicts.root.items():
            if verdict == "queued":
                ledger.record_event("job", job_id, f"re-enqueued on {host.name} (spec was never delivered)")
            elif verdict == "busy":  # the agent never runs two attempts of a job at once
                ledger.record_event("job", job_id, f"waiting on {host.name}: an earlier attempt of this job is "
                                    "still alive there", unless_repeated=True)
