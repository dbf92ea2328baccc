"""The budget in the tick (``orchestrator/money/budget.py`` decides; docs/cost.md).

Dispatch asks it which of a capped sweep's planned jobs start (``admit_plan``; none once the cap is
reached: ``hold``), work stealing which moves may go (``moves_within``: a move to a dearer host commits
more), and a stage after placement records each unfinished capped sweep's findings (``check``): one
``budget`` warning when spent + committed reaches 80 % of the cap and one escalation when dispatch stops,
per cap (a new cap, set by `gpuq budget`, starts over), on the dashboard and the webhook.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.core.config import Settings
from orchestrator.core.states import LEASE_DOWN, JobState, LeaseState
from orchestrator.ledger.pricing import attempt_price
from orchestrator.money import budget
from orchestrator.money.cost import money_spent
from orchestrator.scheduling.estimates import EpochRates, epoch_rates, estimate_s, estimate_source
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.scheduling.stealing import Move
from orchestrator.tick import ACTIVE, notify

if TYPE_CHECKING:
    from orchestrator.fleet.registry import Fleet
    from orchestrator.ledger import HostRow, Job, Ledger, Sweep
    from orchestrator.ledger.reader import LedgerReads
    from orchestrator.tick.findings import TickReport
    from orchestrator.tick.probe import Probe


def standings(ledger: LedgerReads, sweeps: Sequence[Sweep], now: float,
              rates: EpochRates | None = None) -> dict[str, budget.Standing]:
    """Each sweep's spent and committed (and cap) now; the run history is read only when some priced
    attempt of theirs is live."""
    priced = ledger.priced_attempts(s.id for s in sweeps)
    live = {a.job_id for attempts in priced.values() for a in attempts if a.state in budget.LIVE}
    est: dict[str, float] = {}
    guessed: set[str] = set()
    if live:
        rates = rates if rates is not None else epoch_rates(ledger.run_history())
        for job in ledger.jobs(states=ACTIVE):
            if job.id in live:
                est[job.id] = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min,
                                         history=rates)
                if estimate_source(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min,
                                   rates=rates) is None:
                    guessed.add(job.id)
    idle = idle_charges(ledger, {s.id for s in sweeps}, now)
    return {s.id: replace(budget.standing(s.budget_usd, priced.get(s.id, []), est, now, guessed),
                          idle=idle.get(s.id, 0.0)) for s in sweeps}


def idle_charges(ledger: LedgerReads, sweep_ids: Collection[str], now: float) -> dict[str, float]:
    """{sweep: its share of the idle billed time of every priced machine gpuq rented that its attempts ran on}
    (``budget.idle_split``): a machine bills from its row's creation to the provider saying it is down (now while
    it runs), at its price."""
    rows = [r for r in ledger.hosts() if r.provider and r.price_per_hour is not None
            and r.lease not in (LeaseState.NONE, LeaseState.PROVISIONING)]
    if not rows or not sweep_ids:
        return {}
    attempts = ledger.attempts_on(r.name for r in rows)
    ran = {a.job_id for a in attempts}
    ours = {j.id: s for s in sorted(sweep_ids) for j in ledger.jobs(sweep_id=s) if j.id in ran} if ran else {}
    out: dict[str, float] = {}
    for row in rows:
        used: dict[str, float] = {}
        for att in (a for a in attempts if a.host == row.name):
            sweep = ours.get(att.job_id, "")
            used[sweep] = used.get(sweep, 0.0) + (money_spent([att], now) or 0.0)
        end = (row.lease_changed_at or now) if row.lease in LEASE_DOWN else now
        billed = max(0.0, end - row.created_at) / 3600 * (row.price_per_hour or 0.0)
        for sweep, dollars in budget.idle_split(billed, used).items():
            out[sweep] = out.get(sweep, 0.0) + dollars
    return out


def standing_of(ledger: Ledger, sweep: Sweep, rates: EpochRates | None = None) -> budget.Standing:
    return standings(ledger, [sweep], time.time(), rates)[sweep.id]


def hold(ledger: Ledger, settings: Settings, sweep_id: str, now: budget.Standing, reasons: Mapping[str, str],
         needs: float | None = None) -> None:
    """``reasons``' jobs stay QUEUED: each says why (``still queued: budget: ...``), and the sweep's
    escalation is recorded once per cap.  ``now``: the sweep's standing with what this tick admitted;
    ``needs``: the projected cost of the first job held."""
    ledger.record_events("job", {job_id: f"still queued: {why}" for job_id, why in reasons.items()})
    alert(ledger, settings, sweep_id, now, held=len(reasons), needs=needs)


def admit_plan(ledger: Ledger, settings: Settings, sweep_id: str, now: budget.Standing, decided: Plan,
               jobs: Mapping[str, PlanJob]) -> tuple[Plan, budget.Admission]:
    """``decided`` less the jobs the sweep's cap does not fit, in the plan's order (budget.admit), each at
    its estimate times the price share of the host(s) the plan gives it (the share its attempt will fix:
    ``ledger.store.attempt_price``)."""
    rows: dict[str, HostRow | None] = {}

    def row(name: str) -> HostRow | None:
        if name not in rows:
            rows[name] = ledger.host(name)
        return rows[name]

    costs = [(a.job_id, budget.projected_cost(jobs[a.job_id].est_s,
                                              attempt_price(jobs[a.job_id].gpus, [row(h) for h in (a.host, *a.peers)])))
             for a in decided.assignments]
    admitted = budget.admit(sweep_id, now, costs)
    if admitted.held:
        after = budget.Standing(now.cap, now.spent, now.committed + admitted.added, now.placeholders, now.idle)
        hold(ledger, settings, sweep_id, after, admitted.held, admitted.needs)
    keep = set(admitted.admitted)
    return replace(decided, assignments=tuple(a for a in decided.assignments if a.job_id in keep)), admitted


def moves_within(ledger: Ledger, settings: Settings, moves: Sequence[Move], jobs: Mapping[str, Job],
                 rates: EpochRates) -> list[Move]:
    """Work stealing's moves less those a capped sweep cannot afford: a moved job's new attempt fixes the
    target's price share, so a move to a dearer host commits the difference; it goes only while the sweep's
    spent + committed stays within its cap (a move to a host no dearer always goes)."""
    sweeps = {sid: sweep for sid in sorted({jobs[m.job_id].sweep_id for m in moves})
              if (sweep := ledger.sweep(sid)) is not None and sweep.budget_usd is not None}
    if not sweeps:
        return list(moves)
    now = time.time()
    stand = standings(ledger, list(sweeps.values()), now, rates)
    added = dict.fromkeys(sweeps, 0.0)
    keep = []
    for move in moves:
        job = jobs[move.job_id]
        cap = sweeps[job.sweep_id].budget_usd if job.sweep_id in sweeps else None
        if cap is None:
            keep.append(move)
            continue
        est = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=rates)
        old = ledger.attempt(job.id, job.attempt_count)
        delta = budget.projected_cost(est, attempt_price(job.gpus, [ledger.host(move.to_host)]))
        delta -= budget.remaining_cost(old, est, now) if old is not None else 0.0
        if delta <= 0 or stand[job.sweep_id].total + added[job.sweep_id] + delta <= cap + budget.EPSILON:
            keep.append(move)
            added[job.sweep_id] += delta
            continue
        ledger.record_event("job", job.id, f"not moved to {move.to_host}: budget: it would commit "
                            f"{budget.usd(delta)} more than the sweep's budget of {budget.usd(cap)} fits "
                            f"({stand[job.sweep_id].line()})", unless_repeated=True)
    return keep


def withdraw_over(ledger: Ledger, fleet: Fleet, probes: Sequence[Probe], rates: EpochRates) -> list[str]:
    """A capped sweep whose spent + committed passed its cap (`gpuq budget` lowered it, or running attempts
    went past their estimates) takes its jobs not yet started back out of their hosts' inboxes, the newest
    placement first, until it is within the cap again (``tick/withdraw.py``: recorded before the host is
    asked).  They wait QUEUED, as dispatch holds any job the budget does not fit; running jobs finish.
    Returns the ids put back in the queue."""
    capped = {s.id: s for s in ledger.capped_sweeps()}
    if not capped:
        return []
    waiting = {(d.job_id, d.attempt): p.host for p in probes if p.ok for d in p.document.jobs if d.state == "queued"}
    if not waiting:
        return []
    slurm = {r.name for r in ledger.hosts() if r.kind == "slurm"}  # Slurm holds that queue, not an inbox
    jobs = [j for j in ledger.jobs(states=[JobState.ASSIGNED]) if j.sweep_id in capped and j.nodes == 1
            and waiting.get((j.id, j.attempt_count)) == j.host and j.host not in slurm]  # a node waits with its gang
    if not jobs:
        return []
    now = time.time()
    stand = standings(ledger, [capped[sid] for sid in sorted({j.sweep_id for j in jobs})], now, rates)
    attempts = ledger.latest_attempts(j.id for j in jobs)
    over: dict[str, list[Job]] = {}  # host -> jobs to withdraw from its inbox
    why: dict[str, str] = {}
    for sweep_id, standing_now in stand.items():
        cap = capped[sweep_id].budget_usd
        assert cap is not None
        total = standing_now.total
        if total <= cap + budget.EPSILON:
            continue
        mine = sorted((j for j in jobs if j.sweep_id == sweep_id and j.id in attempts),
                      key=lambda j: attempts[j.id].created_at, reverse=True)
        for job in mine:
            if total <= cap + budget.EPSILON:
                break
            est = estimate_s(config=job.config, task=job.task, epochs=job.epochs, est_min=job.est_min, history=rates)
            total -= budget.remaining_cost(attempts[job.id], est, now)
            over.setdefault(job.host or "", []).append(job)
            why[job.id] = (f"budget: the sweep's budget of {budget.usd(cap)} is passed ({standing_now.line()}); "
                           f"`gpuq budget {sweep_id} USD` raises it")
    # the agent's verbs (launcher, host documents) load here: a status that reads standings needs none
    from orchestrator.tick import withdraw

    back: list[str] = []
    for host_name, group in over.items():
        for job_id in sorted(withdraw.withdraw(ledger, fleet, host_name, group, "budget")):
            job = next(j for j in group if j.id == job_id)
            if withdraw.requeue(ledger, job, job.attempt_count,
                                f"withdrawn unstarted from {host_name}: {why[job_id]}"):
                back.append(job_id)
    return back


def alert(ledger: Ledger, settings: Settings, sweep_id: str, now: budget.Standing, *, held: int = 0,
          needs: float | None = None, report: TickReport | None = None) -> None:
    """Record the sweep's budget finding when one is due (``budget.alert``: once per threshold per cap)."""
    last = ledger.latest_finding(sweep_id, budget.RULE)
    level = budget.alert(now, held > 0, last.severity if last is not None else None)
    if level is None:
        return
    if level == "warn":
        message = f"sweep {sweep_id} is at {now.fraction or 0:.0%} of its budget: {now.line()}"
        action = f"`gpuq budget {sweep_id}` shows it; `gpuq budget {sweep_id} USD` raises it"
    else:
        queued = f"; {held} job(s) stay queued" if held else "; nothing new of it starts"
        if needs is not None:
            queued += f" (the next would cost about {budget.usd(needs)})"
        message = f"sweep {sweep_id}: dispatch stopped by its budget: {now.line()}{queued}; running jobs finish"
        action = (f"`gpuq budget {sweep_id} USD` raises it (queued jobs start at the next tick), or "
                  f"`gpuq cancel --sweep {sweep_id}` ends the rest")
    ledger.record_finding("sweep", sweep_id, severity=level, rule=budget.RULE, message=message, action=action)
    notify.send(settings, ledger, notify.Notice(
        budget.RULE, notify.line(message.removeprefix(f"sweep {sweep_id}: ").removeprefix(f"sweep {sweep_id} is "),
                                 sweep=sweep_id, next_step=f"gpuq budget {sweep_id} USD"),
        {"severity": level, "sweep": sweep_id, "cap_usd": now.cap, "spent_usd": round(now.spent, 2),
         "committed_usd": round(now.committed, 2), "message": message, "action": action},
        title="budget reached: dispatch stopped" if level == "escalate" else "budget warning",
        severity="escalate" if level == "escalate" else "warn"))
    if report is not None:
        report.actions.append(f"{sweep_id}: {message}")


def stopped(ledger: Ledger, sweep_id: str | None) -> dict[str, str]:
    """The sweeps (``sweep_id``'s, or every one) whose budget stopped them: capped, nothing of theirs placed
    or running, jobs waiting QUEUED, and the newest budget finding is the stop (a cap raised since then
    records its own): nothing will change until a person acts.  {sweep id: one line saying what to do}.
    `gpuq wait` and `gpuq watch` end on them rather than wait for ever."""
    capped = [s for s in ledger.capped_sweeps() if sweep_id is None or s.id == sweep_id]
    if not capped:
        return {}
    counts = ledger.state_counts()
    out: dict[str, str] = {}
    for sweep in capped:
        mine = counts.get(sweep.id, {})
        queued = mine.get(JobState.QUEUED.value, 0)
        if not queued or any(mine.get(s.value, 0) for s in ACTIVE):
            continue
        last = ledger.latest_finding(sweep.id, budget.RULE)
        if last is None or last.severity != "escalate":
            continue
        out[sweep.id] = (f"sweep {sweep.id}: stopped by its budget ({standing_of(ledger, sweep).line()}); "
                         f"{queued} job(s) wait: `gpuq budget {sweep.id} USD` raises it, "
                         f"`gpuq cancel --sweep {sweep.id}` ends them")
    return out


def check(ledger: Ledger, settings: Settings, report: TickReport) -> None:
    """The tick's stage: every unfinished capped sweep against its cap, its findings recorded when due."""
    capped = ledger.capped_sweeps()
    if not capped:
        return
    counts = ledger.state_counts()
    open_ = [s for s in capped if any(not JobState(st).terminal for st in counts.get(s.id, {}))]
    for sweep_id, now in standings(ledger, open_, time.time()).items():
        queued = counts.get(sweep_id, {}).get(JobState.QUEUED.value, 0)  # at the cap, dispatch just held them
        alert(ledger, settings, sweep_id, now, held=queued if now.level == "stop" else 0, report=report)


def month_stopped(ledger: Ledger, settings: Settings, now: float) -> str | None:
    """Why the user's monthly cap (``budget_usd_month``) stops all dispatch now, or None.  What counts: every
    sweep's priced attempts, their time inside this calendar month (UTC).  The stop is an escalation (notify
    and webhook too), recorded once per month and cap."""
    cap = settings.budget_usd_month
    if cap is None:
        return None
    since = budget.month_start(now)
    priced = ledger.priced_attempts(s.id for s in ledger.sweeps())
    spent = budget.spent_between((a for attempts in priced.values() for a in attempts), since, now)
    why = budget.month_stop(cap, spent)
    if why is None:
        return None
    last = ledger.latest_finding("budget_usd_month", budget.RULE_MONTH)
    key = f"{time.strftime('%Y-%m', time.gmtime(now))} at a cap of {budget.usd(cap)}"  # once per month and cap
    if last is None or last.reason != key:
        message = f"dispatch stopped across every sweep: {why}"
        action = "raise budget_usd_month in your config.toml (queued jobs start at the next tick); running jobs finish"
        ledger.record_finding("budget", "budget_usd_month", severity="escalate", rule=budget.RULE_MONTH,
                              message=message, action=action, reason=key)
        notify.send(settings, ledger, notify.Notice(
            budget.RULE_MONTH, notify.line(message, next_step="raise budget_usd_month"),
            {"severity": "escalate", "cap_usd": cap, "spent_usd": round(spent, 2), "message": message,
             "action": action}, title="monthly budget reached: dispatch stopped", severity="escalate"))
    return why
