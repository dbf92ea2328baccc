"""Health verbs: ``doctor`` (GPU preflight on demand), ``reap`` (VRAM zombies), ``watch``."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import host_documents
from orchestrator.agent.bundle import build_bundle
from orchestrator.agent.launcher import agent_argv, ensure_bundle
from orchestrator.context import Context
from orchestrator.core.errors import GpuqError, HostError, UsageError
from orchestrator.core.states import JobState
from orchestrator.host_documents import ReapCandidate, ReapDocument
from orchestrator.ledger import HostRow
from orchestrator.tick import ACTIVE
from orchestrator.tick.budget import stopped
from orchestrator.tick.findings import TickReport
from orchestrator.tick.loop import run_tick
from orchestrator.tick.preflight import HealthVerdict, preflight_all


def _rows(ctx: Context, names: Sequence[str]) -> list[HostRow]:
    rows = ctx.ledger.hosts()
    if not names:
        if not rows:
            raise UsageError("no host registered yet; `gpuq hosts add NAME user@address` or `gpuq submit` first")
        # a rented machine not up yet, or gone, has nothing to check (named, it is tried and says so)
        return [r for r in rows if r.lease_state not in ("provisioning", "terminated")]
    known = {r.name: r for r in rows}
    missing = [n for n in names if n not in known]
    if missing:
        raise UsageError(f'unknown host "{missing[0]}"; `gpuq hosts list` shows the registered ones')
    return [known[n] for n in dict.fromkeys(names)]


def _agent_bundle(ctx: Context, row: HostRow) -> str:
    """The bundle whose agent answers on ``row``; a host that never got work gets the bare payload
    (an empty project, content-addressed, so every later doctor reuses it)."""
    if row.agent_bundle:
        return row.agent_bundle
    with tempfile.TemporaryDirectory(prefix="gpuq-doctor-") as empty:
        bundle = build_bundle(Path(empty), ctx.settings.bundle_cache)
    ensure_bundle(ctx.fleet.host(row), bundle)
    ctx.ledger.update_host(row.name, agent_bundle=bundle.sha256)
    return bundle.sha256


def doctor(ctx: Context, names: Sequence[str] = ()) -> list[HealthVerdict]:
    """Run the GPU preflight on these hosts (default: all) in parallel and record each verdict:
    a FAIL holds the host, a later PASS or WARN releases it."""
    rows = _rows(ctx, names)
    out: list[HealthVerdict] = []
    ready: list[str] = []
    for row in rows:
        try:
            _agent_bundle(ctx, row)
            ready.append(row.name)
        except GpuqError as exc:
            out.append(HealthVerdict(row.name, "unreachable", str(exc)))
    verdicts = preflight_all(ctx.ledger, ctx.fleet, ctx.settings, ready, "")
    out += [verdicts[n] for n in ready]
    order = {r.name: i for i, r in enumerate(rows)}
    return sorted(out, key=lambda v: order[v.host])


@dataclass
class ReapReport:
    host: str
    doc: ReapDocument | None  # None: the agent printed no reap document (see ``error``)
    exit_code: int
    error: str = ""

    @property
    def candidates(self) -> list[ReapCandidate]:
        return list(self.doc.candidates) if self.doc is not None else []


def reap(ctx: Context, name: str, *, force: bool = False) -> ReapReport:
    """The agent's VRAM-zombie detection on ``name`` (two samples); with ``force`` it detects again
    at that moment and kills what it finds (never from a stale list)."""
    row = _rows(ctx, [name])[0]
    host = ctx.fleet.host(row)
    sha = _agent_bundle(ctx, row)
    argv = ["reap", "--min-age-s", str(ctx.settings.reap_min_age_s), "--resample-s", str(ctx.settings.reap_resample_s)]
    if force:
        argv.append("--force")
    try:
        result = host.run(agent_argv(host, sha, *argv), timeout=ctx.settings.reap_resample_s + 120)
    except HostError as exc:
        raise GpuqError(f"host {name}: {exc}") from exc
    try:
        doc = host_documents.read_reap(name, result.stdout)
    except host_documents.ProtocolError:
        return ReapReport(name, None, result.exit_code, (result.stderr or result.stdout).strip()[-400:])
    if force:
        ctx.ledger.record_event("host", name, "reaped: " + (", ".join(f"{k.pid} {k.outcome}"
                                                                      for k in doc.killed) or "nothing"))
    return ReapReport(name, doc, result.exit_code, result.stderr.strip()[-400:] if result.exit_code else "")


@dataclass
class WatchResult:
    ticks: int = 0
    reason: str = ""
    actions: list[str] = field(default_factory=list)


STRANDED = (JobState.LOST.value, JobState.PREEMPTED.value)


def _sweep_done(ctx: Context, sweep_id: str | None, *, auto_resume: bool = False) -> bool:
    """Every job ended (of the sweep; ``None``: of every sweep); without auto-resume a LOST or PREEMPTED
    job waits for `gpuq resume`, so it ends the watch too."""
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    held = stopped(ctx.ledger, sweep_id)  # a budget-stopped sweep waits for a person, like a stranded job
    return all(JobState(j.state).terminal or (j.state in STRANDED and not auto_resume)
               or (j.sweep_id in held and j.state == JobState.QUEUED.value) for j in jobs)


def watch(ctx: Context, *, sweep: str | None = None, interval_s: float | None = None, max_hours: float = 6.0,
          on_tick: Callable[[TickReport], None] | None = None,
          sleep: Callable[[float], None] = time.sleep, auto_resume: bool = False) -> WatchResult:
    """Tick until the sweep is done (every job ended, or LOST with no retries left) and no down-when-done
    host waits for a retry of its end (tick/billing.py), with per-host backoff for unreachable hosts.
    Without ``sweep``, until every sweep is done, those submitted while it watches too: the unattended
    controller of a machine that stays on (docs/health.md).  A watcher that never exits never
    notifies: it gives up after ``max_hours`` (docs/health.md)."""
    sweep_id = ctx.ledger.resolve_sweep(sweep).id if sweep is not None else None
    if sweep_id is None:
        ctx.ledger.resolve_sweep(None)  # "no sweeps yet" is the user's mistake, said as such
    floor = ctx.settings.patrol_min_interval_s
    deadline = time.monotonic() + max_hours * 3600
    result = WatchResult()
    while True:
        report = run_tick(ctx, honour_backoff=True)
        result.ticks += 1
        if auto_resume and ctx.ledger.jobs(sweep_id=sweep_id, states=[JobState.LOST, JobState.PREEMPTED]):
            from orchestrator.api.cloud import resume

            resumed = resume(ctx, sweep=sweep_id, tick=False)
            report.actions += [f"{h}: {how}" for h, how in resumed.revived.items()]
            report.actions += [f"{h}: not brought back: {why}" for h, why in resumed.failed.items()]
            if resumed.requeued:
                report.actions.append(f"auto-resume: {len(resumed.requeued)} job(s) continue from their checkpoints")
            if not resumed.requeued and all(j.id in resumed.skipped for j in ctx.ledger.jobs(
                    sweep_id=sweep_id, states=[JobState.LOST, JobState.PREEMPTED])):
                auto_resume = False  # nothing left that may resume: end like a plain watch
        result.actions += report.actions
        if on_tick is not None:
            on_tick(report)
        # a down-when-done host whose end failed for a passing reason is tried again (tick/billing.py):
        # the watch that ends a sweep also stops its billing
        if _sweep_done(ctx, sweep_id, auto_resume=auto_resume) and not report.teardown_pending:
            held = stopped(ctx.ledger, sweep_id)
            done = f"sweep {sweep_id} done" if sweep_id is not None else "every sweep done"
            result.reason = "; ".join(held.values()) if sweep_id is not None and held else (
                f"{done} (but {'; '.join(held.values())})" if held else done)
            return result
        if time.monotonic() > deadline:
            result.reason = f"gave up after {max_hours:g} h; check the sweep by hand (`gpuq status`)"
            return result
        running = bool(ctx.ledger.jobs(sweep_id=sweep_id, states=ACTIVE)) or bool(report.teardown_pending)
        wanted = interval_s if interval_s is not None else (
            ctx.settings.patrol_interval_s if running else ctx.settings.patrol_idle_interval_s)
        sleep(max(floor, wanted))
