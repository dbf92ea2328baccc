"""Leases of rented hosts, as the tick sees them (docs/providers.md): a rented host that stopped answering,
or whose jobs just exited on a SIGTERM gpuq did not send, is looked up at its provider; when the provider
says it is gone, its jobs are settled PREEMPTED (spot) or LOST with the reason in the ledger.

Also the provider adapters' opener and the per-context cache the verbs (``api/cloud.py``) share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from orchestrator import host_documents
from orchestrator.context import Context
from orchestrator.core.config import Settings
from orchestrator.core.errors import GpuqError, ProviderError
from orchestrator.core.states import AttemptState, JobState, LeaseState
from orchestrator.health import stops
from orchestrator.ledger import Attempt, HostRow
from orchestrator.money.selfstop import can_stop_itself, self_stop_cost, unseen_stop_cost
from orchestrator.providers import registry
from orchestrator.providers.base import Provider, classify
from orchestrator.tick import ACTIVE, notify


def open_provider(name: str, settings: Settings) -> Provider:
    """The adapter for ``name`` (orchestrator/providers/registry.py), its key and URL from the environment
    or the keys file."""
    quick = None
    if settings.provider_poll_s is not None:
        quick = (settings.provider_poll_s, settings.provider_ready_timeout_s)
    return registry.open_adapter(name, os.environ, quick=quick)


def provider_for(ctx: Context, name: str) -> Provider:
    """The adapter for ``name``, opened once per context."""
    if name not in ctx.providers:
        ctx.providers[name] = open_provider(name, ctx.settings)
    return ctx.providers[name]


# --- preemption --------------------------------------------------------------------------------

LEASE_FOR = {"spot_preemption": LeaseState.PREEMPTED, "manual_stop": LeaseState.STOPPED,
             "host_failure": LeaseState.FAILED, "unknown": LeaseState.FAILED}


def check_lease(ctx: Context, row: HostRow) -> str | None:
    """A rented host stopped answering: ask its provider what happened and, when it is gone,
    settle its jobs (PREEMPTED for a spot preemption, LOST otherwise) with the reason in the ledger.
    Returns the classification, or None when the provider says it runs (a mere SSH drop)."""
    try:
        inst = provider_for(ctx, row.provider).get(row.instance_id)
    except ProviderError as exc:
        ctx.ledger.record_event("host", row.name, f"provider {row.provider} unreachable: {exc}", unless_repeated=True)
        return None
    verdict = classify(inst)
    if verdict in ("running", "pending"):
        return None
    state = LEASE_FOR.get(verdict, LeaseState.FAILED)
    if inst is None or inst.state in ("terminating", "terminated"):
        state = LeaseState.TERMINATED  # gone for good: its jobs resume elsewhere (a replacement, or any host)
    reason = (inst.reason or inst.raw_status) if inst is not None else "the provider no longer knows this instance"
    if inst is not None and inst.gpu_count == 0 and inst.state == "running":
        reason = "came back with zero GPUs"
    if verdict == "manual_stop" and state is LeaseState.STOPPED:
        if self_stopped(ctx, row):
            return verdict  # recorded by an earlier command: its jobs stay as they were, the reason too
        if _leased(ctx, row):
            return _record_self_stop(ctx, row, reason)
    changed = row.lease is not state or row.lease_reason != reason
    label = {"spot_preemption": "spot preemption", "manual_stop": "stopped by the user",
             "host_failure": "host failure"}.get(verdict, verdict)
    message, action = (f"{label}: {row.provider} {row.instance_id} is {reason}",
                       "`gpuq resume` continues its jobs from their last checkpoints")
    if changed:
        ctx.ledger.lease_transition(row.name, state, reason)
        ctx.ledger.record_finding("host", row.name, severity="escalate", rule=verdict, message=message, action=action)
    stopped = settle_host_jobs(ctx, row.name, verdict, reason)
    if changed:
        jobs = f"; {len(stopped)} job(s) stopped there" if stopped else ""
        notify.send(ctx.settings, ctx.ledger, notify.Notice(
            "escalation", notify.line(message + jobs, host=row.name, next_step="gpuq resume"),
            {"rule": verdict, "host": row.name, "job": None, "message": message, "action": action},
            title=f"{row.name}: {label}", severity="escalate"))
    if verdict == "spot_preemption":  # the grace came first: attempts that just ended there were stopped
        window = 2 * ctx.settings.patrol_interval_s + ctx.settings.kill_grace_s
        stops.reclaim_preempted(ctx.ledger, row.name, reason, within_s=window)
    return verdict


def settle_host_jobs(ctx: Context, host: str, verdict: str, reason: str) -> list[str]:
    """Every live attempt on ``host`` ends PREEMPTED (spot) or LOST; the jobs follow."""
    preempted = verdict == "spot_preemption"
    now = time.time()
    done = []
    for job in ctx.ledger.jobs(states=ACTIVE):
        if job.host != host:
            continue
        att = ctx.ledger.attempt(job.id, job.attempt_count)
        message = f"{'spot preemption' if preempted else verdict.replace('_', ' ')}: {reason}"
        if att is not None and not AttemptState(att.state).terminal:
            ctx.ledger.update_attempt(job.id, att.number, message=message, ended_at=now, lost_step=att.step)
            ctx.ledger.transition(job.id, AttemptState.PREEMPTED if preempted else AttemptState.LOST,
                                  attempt=att.number, message=message)
        ctx.ledger.transition(job.id, JobState.PREEMPTED if preempted else JobState.LOST, message=message)
        done.append(job.id)
    return done


# --- the host's own stop (docs/cost.md, "When no gpuq command runs") ---------------------------------


def _leased(ctx: Context, row: HostRow) -> bool:
    """A stop found now can be the rented host's own: it holds a lease and a way to act, and no gpuq command
    reached it for the lease (its last answered probe, by gpuq's clock, is that old).  Jobs the ledger still
    shows live there do not say otherwise: a host stops itself only once its work has ended, and a controller
    that was gone (a closed laptop, a kill) never saw them end."""
    if not can_stop_itself(row.provider) or ctx.settings.lease_timeout_min <= 0 or row.lease is not LeaseState.RUNNING:
        return False
    live = any(j.host == row.name for j in ctx.ledger.jobs(states=ACTIVE))
    heard = _last_contact(row, ctx.ledger.attempts_on([row.name]))
    return not live or time.time() - heard >= ctx.settings.lease_timeout_min * 60.0


def _last_contact(row: HostRow, attempts: Sequence[Attempt]) -> float:
    """The last gpuq command the ledger knows reached the host: its last answered probe or a dispatch there."""
    return max([row.last_probe_at or 0.0, row.created_at, *(a.created_at for a in attempts)])


def self_stopped(ctx: Context, row: HostRow) -> bool:
    """The rented host's lease is STOPPED by its own stop, as recorded (a ``self_stop`` finding at the stop)."""
    if row.lease is not LeaseState.STOPPED or row.lease_changed_at is None:
        return False
    return any(e.rule == "self_stop" and abs(e.time - row.lease_changed_at) < 1.0
               for e in ctx.ledger.events(row.name, limit=50, exact=True))


def _record_self_stop(ctx: Context, row: HostRow, provider_says: str) -> str:
    """Through the lease gate: STOPPED as of the latest it can have stopped, the idle hours and money to then.
    Jobs the ledger shows live there ended before the stop, unseen: they are left as they are (their exit records
    and results are on the stopped disk) until the machine is started again (`gpuq resume`), and the stop is
    bounded by when gpuq found it."""
    now = time.time()
    attempts = ctx.ledger.attempts_on([row.name])
    ends = [max(a.created_at, a.started_at or 0.0, a.ended_at or 0.0) for a in attempts]
    idle_since = max([row.created_at, *ends])
    contact = _last_contact(row, attempts)
    minutes = f"{ctx.settings.lease_timeout_min:g}"
    live = [j.name for j in ctx.ledger.jobs(states=ACTIVE) if j.host == row.name]
    if live:
        cost = unseen_stop_cost(contact, row.price_per_hour, now)
        money = "price unknown" if cost.cost is None else f"at most ${cost.cost:.2f}"
        found = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(now))
        reason = (f"stopped by itself by {found} at the latest: no gpuq command for {minutes} min "
                  f"(lease_timeout_min) and its work done; {len(live)} job(s) gpuq last saw running there "
                  f"({', '.join(live[:5])}) ended unseen, their exit records and results on its disk; "
                  f"{cost.idle_hours:.2f} h billed since the last gpuq command ({money}); disk kept "
                  f"({row.provider}: {provider_says})")
    else:
        lease_s = ctx.settings.lease_timeout_min * 60.0
        cost = self_stop_cost(contact, idle_since, lease_s, row.price_per_hour, now)
        money = "price unknown" if cost.cost is None else f"${cost.cost:.2f}"
        reason = (f"stopped by itself: no gpuq command for {minutes} min and no work (lease_timeout_min); "
                  f"{cost.idle_hours:.2f} idle h billed after its last work ({money}); disk kept "
                  f"({row.provider}: {provider_says})")
    ctx.ledger.lease_transition(row.name, LeaseState.STOPPED, reason, at=cost.stopped_at)
    ctx.ledger.record_finding("host", row.name, severity="info", rule="self_stop", at=cost.stopped_at,
                              message=f"{row.provider} {row.instance_id} {reason}",
                              action="its results stay on its stopped disk: `gpuq resume` starts it and reads them")
    return "manual_stop"


def own_stop_record(ctx: Context, row: HostRow, back: HostRow) -> None:
    """A self-stopped host that is back (``row``: its row as it was, STOPPED; ``back``: as it is now, at its new
    endpoint): its own ``selfstop.json`` says when
    it stopped.  Kept as the host's claim in an ``info`` finding, bounded by gpuq's clock (no sooner than the
    lease after the last gpuq command that reached it, no later than when gpuq found it stopped), never billed;
    a claim outside those bounds is a ``host_clock`` finding too.  A host that answers nothing usable: nothing."""
    if row.lease_changed_at is None:
        return
    try:
        host = ctx.fleet.host(back)
        read = 'head -c 65536 "$1/selfstop.json" 2>/dev/null || head -c 65536 "$1/selfstop.prev.json"'
        result = host.run(["sh", "-c", read, "sh", host.root], timeout=30)
        if result.exit_code != 0:
            return
        claim = host_documents.read_selfstop(row.name, result.stdout).at_epoch  # ProtocolError is a GpuqError
    except GpuqError:
        return
    lowest = _last_contact(row, ctx.ledger.attempts_on([row.name])) + ctx.settings.lease_timeout_min * 60.0
    kept = min(max(float(claim), lowest), row.lease_changed_at)
    saved = row.lease_changed_at - kept
    money = "" if row.price_per_hour is None else f" (${saved * row.price_per_hour / 3600.0:.2f})"
    ctx.ledger.record_finding("host", row.name, severity="info", rule="self_stop_claim",
                              message=f"{row.name} says it stopped itself at {_utc(float(claim))}: "
                                      f"{saved / 3600:.2f} h before gpuq found it stopped{money}, by its claim "
                                      "(kept, never billed)")
    if abs(kept - float(claim)) > 1.0:
        ctx.ledger.record_finding("host", row.name, severity="warn", rule="host_clock",
                                  message=f"{row.name} says it stopped itself at {_utc(float(claim))}, outside what "
                                          "gpuq saw (after the lease, before gpuq found it stopped)",
                                  action="check the host's clock")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))
