"""One controller tick: probe → reconcile → schedule → launch.

Probing is one agent ``status --json`` per host, in parallel.  Reconciling
maps what the host's files say onto the ledger, only ever through
``Ledger.transition``.  A probe that fails at the transport level marks the
host "unreachable since T" and changes no job (DOMAIN.md 6.3).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator import protocol
from orchestrator.config import Settings
from orchestrator.errors import GpuqError, HostUnreachable
from orchestrator.hosts.base import Host
from orchestrator.launcher import agent_argv, enqueue, ensure_agent, job_spec
from orchestrator.ledger import Job, Ledger
from orchestrator.states import AttemptState, JobState

ACTIVE = (JobState.ASSIGNED, JobState.RUNNING)


@dataclass
class Probe:
    host: str
    ok: bool
    doc: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    round_trips: int = 1
    duration_s: float = 0.0


def probe(host: Host, agent_bundle: str, settings: Settings) -> Probe:
    """One read-only round trip to the host's agent."""
    started = time.monotonic()
    if not agent_bundle:
        return Probe(host.name, False, error="no bundle placed yet", round_trips=0)
    try:
        result = host.run(agent_argv(host, agent_bundle, "status", "--json"), timeout=settings.status_timeout_s)
    except HostUnreachable as exc:
        return Probe(host.name, False, error=str(exc), duration_s=time.monotonic() - started)
    elapsed = time.monotonic() - started
    if result.exit_code != 0:
        return Probe(host.name, False, error=f"status exited {result.exit_code}: {result.stderr.strip()[-300:]}",
                     duration_s=elapsed)
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError:
        return Probe(host.name, False, error="status printed no JSON", duration_s=elapsed)
    return Probe(host.name, True, doc=doc, duration_s=elapsed)


def probe_all(hosts: Sequence[tuple[Host, str]], settings: Settings) -> list[Probe]:
    if len(hosts) <= 1:
        return [probe(h, sha, settings) for h, sha in hosts]
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        return list(pool.map(lambda pair: probe(pair[0], pair[1], settings), hosts))


def timestamp(value: Any) -> float | None:
    """Agent documents carry ISO-8601 UTC strings; the payload's heartbeat carries epoch floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _exit_message(exit_doc: dict[str, Any]) -> str:
    code = int(exit_doc.get("wrapper_code", -1))
    meaning = protocol.EXIT_MEANINGS.get(code)
    if meaning is None and code > protocol.EXIT_SIGNAL_BASE:
        meaning = f"killed by signal {code - protocol.EXIT_SIGNAL_BASE}"
    detail = str(exit_doc.get("message") or "")
    parts = [f"exit {code}"] + ([meaning] if meaning else []) + ([detail] if detail else [])
    return ": ".join(parts)


def reconcile(ledger: Ledger, host: Host, settings: Settings, report: Probe) -> list[str]:
    """Apply one successful probe to the ledger; returns job ids that just succeeded."""
    now = time.time()
    ledger.update_host(
        host.name,
        last_probe_at=now,
        unreachable_since=None,
        slots_kind=str(report.doc.get("slots", {}).get("kind", "")),
        slots_total=int(report.doc.get("slots", {}).get("total", 0)),
    )
    on_host = {str(j["job_id"]): j for j in report.doc.get("jobs", [])}
    succeeded: list[str] = []
    missing: list[Job] = []
    for job in ledger.jobs(states=ACTIVE):
        if job.host != host.name:
            continue
        seen = on_host.get(job.id)
        if seen is None or int(seen.get("attempt") or 0) < job.attempt_count:
            missing.append(job)
            continue
        if int(seen.get("attempt") or 0) != job.attempt_count:
            continue
        if _apply(ledger, job, seen):
            succeeded.append(job.id)
    if missing:
        _reenqueue(ledger, host, settings, missing)  # `enqueue --serve` also ensures the agent
    else:
        _revive_agent(ledger, host, settings, report)
    return succeeded


def _revive_agent(ledger: Ledger, host: Host, settings: Settings, report: Probe) -> None:
    """An agent that died with work pending (inbox, or claimed and never launched) is relaunched.

    Safe without asking (DOMAIN.md 1): the flock admits one agent per root, and a new agent adopts
    live attempt groups and never re-runs a launched attempt.
    """
    pending = [j for j in report.doc.get("jobs", []) if j.get("state") in ("queued", "claimed")]
    if report.doc.get("agent", {}).get("alive") or not pending:
        return
    row = ledger.host(host.name)
    if row is None or not row.agent_bundle:
        return
    verdict = ensure_agent(host, row.agent_bundle, settings)
    ledger.record_event("host", host.name, f"agent was not running with {len(pending)} jobs pending: {verdict}")


def _apply(ledger: Ledger, job: Job, seen: dict[str, Any]) -> bool:
    number = job.attempt_count
    state = str(seen.get("state", ""))
    _progress(ledger, job, number, seen)
    if state == "running":
        ledger.transition(job.id, AttemptState.RUNNING, attempt=number, message="group alive")
        ledger.transition(job.id, JobState.RUNNING)
    elif state == "exited":
        exit_doc = seen.get("exit") or {}
        code = int(exit_doc.get("wrapper_code", -1))
        ledger.update_attempt(
            job.id, number, exit_code=code, trainer_code=exit_doc.get("trainer_code"),
            phase=exit_doc.get("phase"), message=_exit_message(exit_doc),
            ended_at=timestamp(exit_doc.get("ended_at")), started_at=timestamp(exit_doc.get("started_at")),
        )
        ledger.transition(job.id, AttemptState.EXITED, attempt=number, message=_exit_message(exit_doc))
        if code == protocol.EXIT_OK:
            ledger.transition(job.id, JobState.SUCCEEDED, message="exit record 0, artifacts verified")
            return True
        ledger.transition(job.id, JobState.FAILED, message=_exit_message(exit_doc))
    elif state == "dead":
        message = "process group gone without an exit record"
        ledger.transition(job.id, AttemptState.LOST, attempt=number, message=message)
        ledger.transition(job.id, JobState.LOST, message=message)
    elif state == "withdrawn":
        ledger.transition(job.id, AttemptState.KILLED, attempt=number, message="withdrawn from the inbox")
        ledger.transition(job.id, JobState.CANCELLED, message="withdrawn from the inbox")
    return False


def _progress(ledger: Ledger, job: Job, number: int, seen: dict[str, Any]) -> None:
    beat = seen.get("heartbeat") or {}
    fields: dict[str, Any] = {}
    if beat:
        fields.update(
            step=beat.get("step"), total_steps=beat.get("total_steps"), epoch=beat.get("epoch"),
            loss=beat.get("loss") if isinstance(beat.get("loss"), (int, float)) else None,
            heartbeat_at=timestamp(beat.get("time")),
        )
    if seen.get("launched_at"):
        fields["started_at"] = timestamp(seen.get("launched_at"))
    if seen.get("log_bytes") is not None:
        fields["log_bytes"] = seen.get("log_bytes")
    if fields:
        ledger.update_attempt(job.id, number, **fields)
    pointer = seen.get("ckpt")
    if isinstance(pointer, dict) and pointer.get("sha256"):
        ledger.record_checkpoint(job.id, number, pointer)


def _reenqueue(ledger: Ledger, host: Host, settings: Settings, jobs: Sequence[Job]) -> None:
    """Specs the ledger recorded but the host never received (controller died mid-launch)."""
    specs = []
    sha = ""
    for job in jobs:
        attempt = ledger.attempt(job.id, job.attempt_count)
        if attempt is None:
            continue
        sha = attempt.bundle_sha
        specs.append(job_spec(job, attempt, settings))
    if specs:
        verdicts = enqueue(host, sha, specs, settings)
        for job_id, verdict in verdicts.items():
            if verdict == "queued":
                ledger.record_event("job", job_id, f"re-enqueued on {host.name} (spec was never delivered)")


def collect(ledger: Ledger, host: Host, agent_bundle: str, job_ids: Sequence[str]) -> None:
    """Read finished jobs' summaries and file hashes from the host into the ledger (one round trip)."""
    if not job_ids:
        return
    result = host.run(agent_argv(host, agent_bundle, "collect", *job_ids), timeout=120)
    if result.exit_code != 0:
        raise GpuqError(f"host {host.name}: collecting results failed: {result.stderr.strip()[-300:]}")
    try:
        docs: dict[str, Any] = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise GpuqError(f"host {host.name}: unreadable results from the agent: {result.stdout[:200]!r}") from exc
    for job_id, doc in docs.items():
        summary = doc.get("summary") or {}
        metrics: list[tuple[str, str, float, int | None, int | None]] = []
        for scope in ("final", "best"):
            row = summary.get(scope) or {}
            for name, value in row.items():
                if name in ("step", "epoch", "time", "kind") or not isinstance(value, (int, float)):
                    continue
                metrics.append((scope, name, float(value), row.get("step"), row.get("epoch")))
        artifacts = [(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in doc.get("files", [])]
        ledger.record_results(job_id, int(doc.get("attempt", 0)), metrics=metrics, artifacts=artifacts,
                              checkpoint=doc.get("ckpt"))
