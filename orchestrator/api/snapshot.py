"""``status``/``wait``: one controller tick (probe, reconcile, collect, steal, dispatch), then a snapshot."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.core.errors import WaitTimeout
from orchestrator.core.states import JobState

if TYPE_CHECKING:
    from orchestrator.context import Context
    from orchestrator.ledger import Attempt, Event, HostRow, Job, Sweep, SweepPart
    from orchestrator.ledger.reader import LedgerReads
    from orchestrator.money.budget import Standing
    from orchestrator.report.model import Report
    from orchestrator.tick.probe import Probe

ALERTS_SHOWN = 20


@dataclass
class Snapshot:
    generated_at: float
    hosts: list[HostRow]
    probes: dict[str, Probe]
    sweeps: list[Sweep]
    jobs: list[Job]
    attempts: dict[str, Attempt]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    alerts: list[Event] = field(default_factory=list)  # the newest findings first
    lines: list[str] = field(default_factory=list)  # the tick's one line per host
    attempt_history: dict[str, list[Attempt]] = field(default_factory=dict)  # every attempt of each shown job
    cells: Report | None = None  # the shown sweeps' per-cell report, when the dashboard asked for it
    cells_error: str = ""  # why it could not be built
    idle: dict[str, float] = field(default_factory=dict)  # rented hosts with no work: since when (tick/billing.py)
    budgets: dict[str, Standing] = field(default_factory=dict)  # each sweep's cap, spent, committed (budget.py)
    parts: dict[str, list[SweepPart]] = field(default_factory=dict)  # each sweep's parts by number (submit --into)


def tick(ctx: Context) -> dict[str, Probe]:
    """One controller tick over every host (``tick.loop.run_tick``); the probes it made."""
    from orchestrator.tick.loop import run_tick  # the tick, SSH: only when a host is probed

    return run_tick(ctx).probes


def status(ctx: Context, *, sweep: str | None = None, probe: bool = True, all_jobs: bool = False,
           honour_backoff: bool = False, states: Collection[JobState] = ()) -> Snapshot:
    """Tick, then a snapshot: every sweep's counts, and the jobs worth showing (``ledger_status``).
    Without ``probe`` the snapshot is the ledger's alone (no host is contacted)."""
    probes: dict[str, Probe] = {}
    lines: list[str] = []
    if probe:
        from orchestrator.tick.loop import run_tick  # the tick, SSH: only when a host is probed

        report = run_tick(ctx, honour_backoff=honour_backoff)
        probes, lines = report.probes, report.lines
    snap = ledger_status(ctx.ledger, sweep=sweep, all_jobs=all_jobs, states=states)
    snap.probes, snap.lines = probes, lines
    if any(h.provider and h.instance_id for h in snap.hosts):  # only a rented machine can idle at a price
        from orchestrator.tick.billing import idle_hosts  # the billing stage's imports (transfer, ...) only then

        snap.idle = idle_hosts(ctx)
    return snap


def ledger_status(ledger: LedgerReads, *, sweep: str | None = None, all_jobs: bool = False,
                  states: Collection[JobState] = ()) -> Snapshot:
    """The snapshot the ledger alone gives: every sweep's counts, and the jobs worth showing.

    Jobs shown: the given sweep's; else every sweep with unfinished jobs (or the newest sweep
    when all are finished); ``all_jobs`` shows the whole history; ``states`` keeps only jobs in
    those states.  ``ledger``: the ``Ledger``, or the read path without the ORM (``ledger/reader.py``,
    what ``gpuq status --no-probe`` reads).  Rented hosts' idle times are the billing stage's
    (``status``), not part of it.
    """
    counts = ledger.state_counts()
    sweep_rows = ledger.sweeps()
    if sweep is not None:
        shown = {ledger.resolve_sweep(sweep).id}
    elif all_jobs:
        shown = {s.id for s in sweep_rows}
    else:
        shown = {sid for sid, states in counts.items() if any(not JobState(st).terminal for st in states)}
        if not shown and sweep_rows:
            shown = {sweep_rows[-1].id}
    order = {row.id: index for index, row in enumerate(sweep_rows)}
    shown &= set(order)
    wanted = list(states) or None
    if shown == set(order):
        # the Ledger reads each table in a transaction of its own: a sweep submitted after the sweeps were
        # read is not in this snapshot, nor are its jobs (the reader's one transaction never sees one)
        every = [j for j in ledger.jobs(states=wanted) if j.sweep_id in order]
        jobs = sorted(every, key=lambda j: order[j.sweep_id])  # stable: ledger order within a sweep
    else:
        jobs = [j for sid in sorted(shown, key=order.__getitem__) for j in ledger.jobs(sweep_id=sid, states=wanted)]
    history: dict[str, list[Attempt]] = {}
    latest: dict[str, Attempt] = {}
    for att in ledger.attempts_of(j.id for j in jobs):  # one query for both (10,000 rows cost 0.3 s each)
        history.setdefault(att.job_id, []).append(att)
        if att.job_id not in latest or att.number > latest[att.job_id].number:
            latest[att.job_id] = att
    from orchestrator.tick.budget import standings

    now = time.time()
    parts: dict[str, list[SweepPart]] = {}
    for part in ledger.sweep_parts():
        parts.setdefault(part.sweep_id, []).append(part)
    return Snapshot(now, ledger.hosts(), {}, sweep_rows, jobs, latest, counts=counts,
                    alerts=ledger.alerts(ALERTS_SHOWN), attempt_history=history,
                    budgets=standings(ledger, sweep_rows, now), parts=parts)


def wait(ctx: Context, *, sweep: str | None = None, interval_s: float = 2.0,
         timeout_s: float | None = None, seen: Callable[[Snapshot], None] | None = None) -> Snapshot:
    """Tick until every job of the sweep is terminal (or LOST), or its budget stopped it (nothing runs and
    the rest waits for the cap to be raised: ``tick.budget.stopped``); ``seen`` is shown each tick's snapshot."""
    from orchestrator.tick.budget import stopped

    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        snap = status(ctx, sweep=sweep_id)
        if seen is not None:
            seen(snap)
        if all(JobState(j.state).terminal or j.state in (JobState.LOST.value, JobState.PREEMPTED.value)
               for j in snap.jobs):
            return snap
        if stopped(ctx.ledger, sweep_id):
            return snap
        if deadline is not None and time.monotonic() > deadline:
            raise WaitTimeout(f"sweep {sweep_id} still running after {timeout_s:.0f} s; `gpuq status` to follow it",
                              snap)
        time.sleep(interval_s)
