"""A sweep's budget (orchestrator/money/budget.py, tick/budget.py, api/budgeting.py; docs/cost.md), on a real SQLite
ledger: spent at the price each attempt fixed, committed to each live attempt's estimate, admission that
stops exactly where spent + committed would cross the cap, one warning and one escalation per cap (webhook
included), the dry run's range, work stealing and `gpuq resume` under a cap, and the cap as a user-only
setting."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import budgeting as api_budget
from orchestrator.context import Context, open_context
from orchestrator.core.config import load_settings
from orchestrator.core.errors import ConfigError, UsageError
from orchestrator.core.specs import Assignment, JobSpec
from orchestrator.core.states import AttemptState, JobState, LeaseState
from orchestrator.ledger import Job, Ledger, attempt_price
from orchestrator.money import budget
from orchestrator.scheduling.estimates import epoch_rates
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.scheduling.stealing import Move
from orchestrator.tick import budget as tick_budget
from orchestrator.tick.findings import TickReport, sweeps_done

SWEEP = "qbud0001"
T0 = 1_800_000_000.0
HOUR = 3600.0


@pytest.fixture
def ctx(gpuq_home: Path, hook: list[dict[str, Any]]) -> Iterator[Context]:
    context = open_context()
    try:
        context.ledger.ensure_host("cheap", kind="ssh", root="/r")
        context.ledger.update_host("cheap", price_per_hour=2.0, gpu_count=4)  # a 1-GPU job pays $0.50/h
        context.ledger.ensure_host("dear", kind="ssh", root="/r")
        context.ledger.update_host("dear", price_per_hour=8.0, gpu_count=1)  # $8/h
        context.ledger.ensure_host("free", kind="ssh", root="/r")  # no price: costs nothing here
        yield context
    finally:
        context.close()


def _sweep(ledger: Ledger, cap: float | None, est_min: list[float | None], sweep_id: str = SWEEP) -> list[Job]:
    specs = [JobSpec(name=f"j{i}", config=f"c{i}.yaml", task="t", epochs=2, est_min=m) for i, m in enumerate(est_min)]
    return ledger.add_sweep(sweep_id=sweep_id, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                            default_retries=0, bundle_sha="b" * 64, budget_usd=cap)


def _run(ledger: Ledger, job: Job, host: str, start: float, end: float | None = None) -> None:
    """An attempt of ``job`` on ``host`` (its price fixed by the ledger), started at ``start``, ended at ``end``."""
    ledger.start_attempt(job.id, host=host, bundle_sha="s")
    ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ledger.transition(job.id, JobState.RUNNING)
    ledger.update_attempt(job.id, 1, started_at=start)
    if end is not None:
        ledger.transition(job.id, AttemptState.EXITED, attempt=1)
        ledger.transition(job.id, JobState.SUCCEEDED)
        ledger.update_attempt(job.id, 1, ended_at=end)


def _standing(ledger: Ledger, now: float, sweep_id: str = SWEEP) -> budget.Standing:
    sweep = ledger.sweep(sweep_id)
    assert sweep is not None
    return tick_budget.standings(ledger, [sweep], now)[sweep_id]


def test_spent_is_the_cost_policy_and_committed_runs_to_each_estimate(ctx: Context) -> None:
    jobs = _sweep(ctx.ledger, 10.0, [120, 60, 30, None])
    _run(ctx.ledger, jobs[0], "dear", T0, T0 + HOUR)  # done: 1 h x $8 = $8 spent, nothing committed
    _run(ctx.ledger, jobs[1], "cheap", T0)  # 30 of its 60 min run: $0.25 spent, $0.25 committed
    ctx.ledger.update_host("cheap", price_per_hour=100.0)  # a price change does not change a started attempt
    _run(ctx.ledger, jobs[2], "dear", T0 - HOUR)  # past its 30 min estimate: spends on, commits nothing
    ctx.ledger.start_attempt(jobs[3].id, host="cheap", bundle_sha="s")  # placed, not started; at $100/h
    now = _standing(ctx.ledger, T0 + HOUR / 2)
    assert now.spent == pytest.approx(8.0 + 0.25 + 1.5 * 8.0)
    placeholder = 2 * 60.0  # no est_min, no history: the scheduler's placeholder, 60 s per epoch
    assert now.committed == pytest.approx(0.25 + placeholder / HOUR * 100.0 * 0.25)
    assert now.placeholders == 1 and now.cap == 10.0 and now.level == "stop"
    assert "1 running job(s) without an estimate" in now.line()


def test_the_share_a_projection_uses_is_the_one_the_ledger_fixes(ctx: Context) -> None:
    jobs = _sweep(ctx.ledger, None, [60, 60])
    for job, host in zip(jobs, ("cheap", "dear"), strict=True):
        attempt = ctx.ledger.start_attempt(job.id, host=host, bundle_sha="s")
        assert (attempt.price_per_hour, attempt.gpu_share) == attempt_price(1, [ctx.ledger.host(host)])
    assert attempt_price(1, [ctx.ledger.host("free")]) is None


def test_admission_stops_exactly_where_the_cap_would_be_crossed() -> None:
    now = budget.Standing(10.0, spent=3.0, committed=2.0)
    got = budget.admit(SWEEP, now, [("a", 2.5), ("b", 2.5), ("c", 0.01), ("d", 0.0)])
    assert got.admitted == ("a", "b")  # 3 + 2 + 2.5 + 2.5 = 10: on the cap fits
    assert list(got.held) == ["c", "d"]  # c would cross it; d waits behind c, in the plan's order
    assert got.held["c"].startswith("budget: the sweep's budget of $10.00 does not fit it ($3.00 spent + $7.00 "
                                    "committed; it needs about $0.01)")
    assert "waits behind" in got.held["d"] and f"`gpuq budget {SWEEP} USD`" in got.held["d"]
    alone = budget.admit(SWEEP, budget.Standing(1.0), [("big", 1.5)])
    assert "it alone would cost about $1.50, more than the sweep's budget of $1.00" in alone.held["big"]
    assert budget.admit(SWEEP, budget.Standing(None, spent=1e9), [("x", 5.0)]).admitted == ("x",)


def test_levels_and_alerts_once_per_threshold() -> None:
    assert budget.Standing(10.0, 7.9).level == "ok" and budget.Standing(10.0, 4.0, 4.0).level == "warn"
    assert budget.Standing(10.0, 6.0, 4.0).level == "stop" and budget.Standing(None, 99.0).level == "none"
    warn, stop = budget.Standing(10.0, 8.0), budget.Standing(10.0, 10.0)
    assert budget.alert(warn, False, None) == "warn" and budget.alert(warn, False, "info") == "warn"
    assert budget.alert(warn, False, "warn") is None and budget.alert(warn, True, "warn") == "escalate"
    assert budget.alert(stop, False, None) == "warn"  # at the cap with nothing waiting: nothing is stopped
    assert budget.alert(stop, True, "warn") == "escalate" and budget.alert(stop, True, "escalate") is None
    assert budget.alert(budget.Standing(10.0, 1.0), False, None) is None


def test_the_tick_holds_a_capped_sweep_and_alerts_once_per_cap(ctx: Context, hook: list[dict[str, Any]]) -> None:
    jobs = _sweep(ctx.ledger, 1.0, [60, 60, 60, 60])  # each costs $0.50 on cheap
    plan = Plan(assignments=tuple(Assignment(job_id=j.id, host="cheap") for j in jobs), unplaced=())
    plans = {j.id: PlanJob(j.id, 1, 3600.0) for j in jobs}
    now = _standing(ctx.ledger, T0)
    kept, admitted = tick_budget.admit_plan(ctx.ledger, ctx.settings, SWEEP, now, plan, plans)
    assert [a.job_id for a in kept.assignments] == [jobs[0].id, jobs[1].id] and len(admitted.held) == 2
    for job in jobs[2:]:
        assert ctx.ledger.events(subject=job.id, exact=True)[-1].message.startswith("still queued: budget: ")
    found = [e for e in ctx.ledger.alerts() if e.rule == budget.RULE]
    assert [e.severity for e in found] == ["escalate"] and "2 job(s) stay queued (the next would cost about $0.50)" \
        in found[0].message and "$1.00 committed of $1.00" in found[0].message
    tick_budget.admit_plan(ctx.ledger, ctx.settings, SWEEP, now, plan, plans)  # the next tick says nothing new
    assert len([e for e in ctx.ledger.alerts() if e.rule == budget.RULE]) == 1
    assert sum(e.message.startswith("still queued") for e in ctx.ledger.events(subject=jobs[3].id, exact=True)) == 1
    assert [(h["event"], h["severity"], h["sweep"]) for h in hook] == [("budget", "escalate", SWEEP)]

    # a new cap starts over: at 80 % of it, one warning (and the sweep's end is not held up by it)
    api_budget.set_cap(ctx, SWEEP, 1.2)
    _run(ctx.ledger, jobs[0], "cheap", T0, T0 + 1.9 * HOUR)  # $0.95 spent: 79 %
    report = TickReport()
    tick_budget.check(ctx.ledger, ctx.settings, report)
    assert not report.actions
    ctx.ledger.update_attempt(jobs[0].id, 1, ended_at=T0 + 2 * HOUR)  # $1.00: 83 %
    tick_budget.check(ctx.ledger, ctx.settings, report)
    tick_budget.check(ctx.ledger, ctx.settings, report)
    assert len(report.actions) == 1 and "at 83% of its budget" in report.actions[0]
    assert [h["severity"] for h in hook] == ["escalate", "warn"] and hook[-1]["spent_usd"] == 1.0
    for job in jobs[1:]:
        ctx.ledger.transition(job.id, JobState.CANCELLED)
    sweeps_done(ctx, report)
    assert any(e.rule == "sweep_done" for e in ctx.ledger.alerts())


def test_a_stopped_sweep_is_not_resumed_and_set_cap_says_what_happens(ctx: Context) -> None:
    jobs = _sweep(ctx.ledger, 5.0, [60, 60])
    _run(ctx.ledger, jobs[0], "dear", T0 - HOUR, T0)  # $8 spent: past the cap
    ctx.ledger.start_attempt(jobs[1].id, host="cheap", bundle_sha="s")
    ctx.ledger.transition(jobs[1].id, JobState.PREEMPTED)
    stranded = ctx.ledger.jobs(sweep_id=SWEEP, states=[JobState.PREEMPTED])
    refused = api_budget.resume_refusals(ctx, stranded)
    assert list(refused) == [jobs[1].id] and "not resumed: sweep qbud0001 is at its budget" in refused[jobs[1].id]
    view = api_budget.set_cap(ctx, SWEEP, 4.0)  # lower still: allowed, and it says dispatch stops
    assert "dispatch stops" in view.note and view.standing.cap == 4.0
    raised = api_budget.set_cap(ctx, SWEEP, 20.0)
    assert "`gpuq resume --sweep qbud0001` continues its 1 preempted or lost job(s)" in raised.note
    assert api_budget.resume_refusals(ctx, stranded) == {}
    lines = "\n".join(raised.lines())
    assert "spent      $8.00" in lines and "remaining  1 job(s) not started" in lines


def test_a_move_to_a_dearer_host_goes_only_while_the_cap_fits_it(ctx: Context) -> None:
    jobs = _sweep(ctx.ledger, 9.0, [60, 60])
    for job in jobs:  # placed on cheap, waiting in its inbox: $0.50 committed each
        ctx.ledger.start_attempt(job.id, host="cheap", bundle_sha="s")
    ledger_jobs = {j.id: j for j in ctx.ledger.jobs(sweep_id=SWEEP)}
    moves = [Move(jobs[0].id, "cheap", "dear"), Move(jobs[1].id, "cheap", "dear"), Move(jobs[1].id, "cheap", "free")]
    kept = tick_budget.moves_within(ctx.ledger, ctx.settings, moves, ledger_jobs, epoch_rates([]))
    assert kept == [moves[0], moves[2]]  # $1 + $7.50 fits $9, another $7.50 does not; a move to no price goes
    assert "not moved to dear: budget" in ctx.ledger.events(subject=jobs[1].id, exact=True)[-1].message


def test_the_dry_run_range_comes_from_est_min_or_the_history_spread(ctx: Context) -> None:
    history = budget.spreads([("c0.yaml", "t", 2, 100.0), ("c0.yaml", "t", 4, 400.0), ("x.yaml", "u", 0, 50.0)])
    assert budget.duration_range(config="c0.yaml", task="t", epochs=2, est_min=None, history=history) == (100.0, 200.0)
    assert budget.duration_range(config="c9.yaml", task="t", epochs=1, est_min=None, history=history) == (50.0, 100.0)
    assert budget.duration_range(config="x.yaml", task="u", epochs=None, est_min=None, history=history) == (50.0, 50.0)
    assert budget.duration_range(config="c9.yaml", task="v", epochs=1, est_min=3, history=history) == (180.0, 180.0)
    assert budget.duration_range(config="c9.yaml", task="v", epochs=1, est_min=None, history=history) is None
    cheap = attempt_price(1, [ctx.ledger.host("cheap")])
    dear = attempt_price(1, [ctx.ledger.host("dear")])
    got = budget.project([budget.JobCostInput("a", [cheap], (HOUR, 2 * HOUR)),
                          budget.JobCostInput("b", [dear], (HOUR / 2, HOUR / 2)),
                          budget.JobCostInput("c", [None], None)])
    assert (got.low, got.high, got.unpriced) == (pytest.approx(4.5), pytest.approx(5.0), ("c",))
    assert got.fits(5.0) is True and got.fits(4.7) is None and got.fits(4.5) is None and got.fits(4.4) is False
    open_ = budget.project([budget.JobCostInput("a", [cheap], (HOUR, HOUR)), budget.JobCostInput("b", [dear], None)])
    assert open_.high is None and open_.unestimated == ("b",) and "$0.50 .. open" in open_.line()
    unpriced = budget.project([budget.JobCostInput("a", [None], None)])
    assert "no host these jobs may run on has a price" in unpriced.why_not
    assert "no job has an estimate" in budget.project([budget.JobCostInput("a", [dear], None)]).why_not
    either = budget.project([budget.JobCostInput("a", [None, dear], (HOUR, HOUR))])  # it may land on either
    assert (either.low, either.high) == (0.0, pytest.approx(8.0))


def test_only_the_user_sets_the_cap(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "gpuq.toml").write_text("budget_usd = 1000000\n")
    with pytest.raises(ConfigError, match="budget_usd can only be set in your own"):
        load_settings(env={"GPUQ_HOME": str(home)}, project_dir=project)
    (home / "config.toml").write_text("budget_usd = 25.5\n")
    assert load_settings(env={"GPUQ_HOME": str(home)}).budget_usd == 25.5
    assert load_settings(env={"GPUQ_HOME": str(home), "GPUQ_BUDGET_USD": "7"}).budget_usd == 7.0
    with pytest.raises(ConfigError, match="GPUQ_BUDGET_USD"):
        load_settings(env={"GPUQ_HOME": str(home), "GPUQ_BUDGET_USD": "-1"})


def test_status_and_the_dashboard_show_a_capped_sweeps_budget(ctx: Context) -> None:
    from rich.console import Console

    from orchestrator.api import status
    from orchestrator.cli import dashboard, statusjson
    from orchestrator.cli.dashboard import View

    jobs = _sweep(ctx.ledger, 10.0, [60, 60])
    _sweep(ctx.ledger, None, [60], sweep_id="qbud0002")
    _run(ctx.ledger, jobs[0], "dear", T0 - HOUR, T0)  # $8 spent: 80 % of $10
    snap = status(ctx, probe=False, all_jobs=True)
    doc = statusjson.status_doc(snap)
    assert {s["id"]: s["budget"] for s in doc["sweeps"]} == {
        SWEEP: {"cap": 10.0, "spent": pytest.approx(8.0), "committed": 0.0},
        "qbud0002": {"cap": None, "spent": 0.0, "committed": 0.0}}
    layout, _ = dashboard.screen(View(snap), T0, 160, 40)
    console = Console(width=160, height=40, record=True, color_system=None, file=io.StringIO())
    console.print(layout)
    frame = console.export_text()
    assert f"budget {SWEEP}: $8.00 spent + $0.00 committed of $10.00 (80%)" in frame
    assert "budget qbud0002" not in frame  # no cap: no line


def test_the_budget_command_shows_sets_and_removes_a_cap(ctx: Context) -> None:
    from tests.conftest import run_gpuq

    _sweep(ctx.ledger, None, [60])
    shown = run_gpuq("budget", SWEEP)
    assert shown.returncode == 0 and f"sweep {SWEEP}: budget none (no cap)" in shown.stdout, shown.stderr
    bad = run_gpuq("budget", SWEEP, "0")
    assert bad.returncode == 2 and "a budget is above $0" in bad.stderr
    assert run_gpuq("budget", SWEEP, "$1,250.50").returncode == 0
    assert ctx.ledger.sweep(SWEEP).budget_usd == 1250.5  # type: ignore[union-attr]
    removed = run_gpuq("budget", SWEEP, "none")
    assert removed.returncode == 0 and "no cap: every queued job may start" in removed.stdout
    assert ctx.ledger.sweep(SWEEP).budget_usd is None  # type: ignore[union-attr]
    finding = ctx.ledger.latest_finding(SWEEP, budget.RULE)
    assert finding is not None and finding.message == f"budget of sweep {SWEEP} removed (was $1,250.50)"


def test_what_waiting_jobs_may_cost_counts_only_hosts_their_gpus_take(ctx: Context) -> None:
    """`gpuq budget`'s remaining range prices a job with gpu=/gpu_mem= only on the hosts the scheduler would
    give it (gpumatch.host_matches on each host's recorded GPUs); one no host can take is named, not counted
    at some other host's price."""
    from orchestrator.scheduling.gpumatch import facts_json

    ctx.ledger.update_host("cheap", gpu_facts=facts_json([("NVIDIA A10", 23028.0)] * 4))
    ctx.ledger.update_host("dear", gpu_facts=facts_json([("NVIDIA H100 80GB HBM3", 81559.0)]))
    ctx.ledger.update_host("free", gpu_facts=facts_json([("NVIDIA A10", 23028.0)]))
    specs = [JobSpec(name="h100", config="c.yaml", task="t", epochs=2, est_min=60, gpu=("H100",)),
             JobSpec(name="big", config="c.yaml", task="t", epochs=2, est_min=60, gpu_mem=40),
             JobSpec(name="b200", config="c.yaml", task="t", epochs=2, est_min=60, gpu=("B200",)),
             JobSpec(name="any", config="c.yaml", task="t", epochs=2, est_min=60)]
    ctx.ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                         default_retries=0, bundle_sha="b" * 64)
    remaining = api_budget.show(ctx, SWEEP).remaining
    assert remaining is not None and remaining.unplaceable == ("b200",)
    # h100 and big only on `dear` ($8/h for an hour each); any from `free` ($0) up to `dear`
    assert remaining.low == pytest.approx(16.0) and remaining.high == pytest.approx(24.0)
    assert "1 job(s) no host can take now (b200: their gpu=/gpu_mem=) are not counted" in remaining.line()
    alone = api_budget._project(ctx, [j for j in ctx.ledger.jobs(sweep_id=SWEEP) if j.name == "b200"],
                                ctx.ledger.hosts())
    assert alone.why_not.startswith("no host of the sweep can take these jobs now")


def test_the_budget_view_says_cap_spent_committed_use_and_what_waits_in_words(ctx: Context) -> None:
    jobs = _sweep(ctx.ledger, 10.0, [60, 60, None])
    _run(ctx.ledger, jobs[0], "dear", T0 - HOUR, T0)  # $8 spent
    view = api_budget.show(ctx, SWEEP)
    assert view.waiting == 2 and view.note == ""
    assert view.lines() == [
        f"sweep {SWEEP}: budget $10.00",
        "  spent      $8.00  (attempts so far, at the price each fixed when it started)",
        "  committed  $0.00  (placed and running attempts, to their estimates)",
        "  used       80% (warn)",
        f"  remaining  2 job(s) not started: {view.remaining.line()}",  # type: ignore[union-attr]
    ]
    free = api_budget.BudgetView(SWEEP, budget.Standing(None, spent=1.0, committed=2.0, placeholders=3), 0, None,
                                 note="a note")
    assert free.lines() == [
        f"sweep {SWEEP}: budget none (no cap)",
        "  spent      $1.00  (attempts so far, at the price each fixed when it started)",
        "  committed  $2.00  (placed and running attempts, to their estimates)",
        "             3 of them without est_min= or history: counted at the scheduler's placeholder",
        "a note"]


def test_set_cap_records_what_it_changed_and_says_what_is_left(ctx: Context) -> None:
    _sweep(ctx.ledger, None, [60])
    with pytest.raises(UsageError, match=r"a budget is a number of dollars above 0 \(and at most 1e9\), not 0"):
        api_budget.set_cap(ctx, SWEEP, 0.0)
    with pytest.raises(UsageError, match="not 2e"):
        api_budget.set_cap(ctx, SWEEP, 2e9)
    assert api_budget.set_cap(ctx, SWEEP, 1e9).standing.cap == 1e9  # the top is allowed
    view = api_budget.set_cap(ctx, SWEEP, 12.5)
    assert view.note == ("$12.50 left under the cap for jobs not started; queued jobs it fits start at the next tick "
                         "(`gpuq status` or `gpuq watch`)")
    finding = ctx.ledger.latest_finding(SWEEP, budget.RULE)
    assert finding is not None and finding.severity == "info"
    assert finding.message == f"budget of sweep {SWEEP} set to $12.50 (was $1,000,000,000.00)"
    assert view.waiting == 1 and view.sweep_id == SWEEP and view.remaining is not None


def test_the_dry_run_projection_prices_each_job_at_its_planned_hosts_share(ctx: Context) -> None:
    from orchestrator.core.specs import job_id_for

    specs = [JobSpec(name="a", config="c.yaml", task="t", epochs=2, est_min=60),
             JobSpec(name="b", config="c.yaml", task="t", epochs=2, est_min=120, gpus=2),
             JobSpec(name="c", config="c.yaml", task="t", epochs=2, est_min=60)]
    placements = {job_id_for(SWEEP, "a"): "dear", job_id_for(SWEEP, "b"): "cheap"}  # c is not placed
    got = api_budget.projection(ctx, SWEEP, specs, placements, ctx.ledger.hosts())
    # a: 1 h at $8; b: 2 h at half of cheap's $2 ($1/h); c: unplaced, no price
    assert got.low == pytest.approx(10.0) and got.high == pytest.approx(10.0) and got.why_not == ""


def test_a_capped_submit_keeps_what_the_cap_fits_and_an_uncapped_one_everything(ctx: Context) -> None:
    _sweep(ctx.ledger, 5.0, [60, 60])
    jobs = {p.name: p for p in ctx.ledger.jobs(sweep_id=SWEEP)}
    plan_jobs = [PlanJob(jobs["j0"].id, 1, HOUR), PlanJob(jobs["j1"].id, 1, HOUR)]
    decided = Plan(assignments=(Assignment(job_id=jobs["j1"].id, host="cheap"),
                                Assignment(job_id=jobs["j0"].id, host="dear")), unplaced=())
    assert api_budget.admit_submitted(ctx, SWEEP, None, decided, plan_jobs) == (decided, {})
    kept, held = api_budget.admit_submitted(ctx, SWEEP, 5.0, decided, plan_jobs)
    assert [a.job_id for a in kept.assignments] == [jobs["j1"].id]  # $0.50 fits $5; then $8 does not
    assert list(held) == [jobs["j0"].id] and held[jobs["j0"].id].startswith("budget: ")


def test_a_joined_part_is_admitted_under_the_sweeps_one_cap_with_what_it_spent(ctx: Context) -> None:
    """``submit --into``: the part's jobs count against the cap the sweep's first part already spends from."""
    import time

    first = _sweep(ctx.ledger, 5.0, [60])
    start = time.time() - 2 * HOUR
    end = start + 0.53125 * HOUR
    _run(ctx.ledger, first[0], "dear", start, end)  # part 1 spent $4.25 of $5
    ctx.ledger.update_attempt(first[0].id, 1, dispatched_at=start, seen_running_at=start, seen_alive_at=end,
                              seen_ended_at=end)
    _, joined = ctx.ledger.join_sweep(sweep_id=SWEEP, queue_path="q2.txt", queue_text="", bundle_sha="c" * 64,
                                      jobs=[JobSpec(name=f"k{i}", config="c.yaml", task="t", epochs=2, est_min=60)
                                            for i in range(2)], default_retries=0, keys={}, reuse={})
    plan_jobs = [PlanJob(j.id, 1, HOUR) for j in joined]
    decided = Plan(assignments=tuple(Assignment(job_id=j.id, host="cheap") for j in joined), unplaced=())
    kept, held = api_budget.admit_joined(ctx, SWEEP, decided, plan_jobs)
    assert [a.job_id for a in kept.assignments] == [joined[0].id]  # $4.25 + $0.50 fits $5; another $0.50 does not
    assert list(held) == [joined[1].id] and held[joined[1].id].startswith("budget: ")
    # a fresh sweep's cap of the same size would have fitted both: it is the one budget that holds the second
    assert len(api_budget.admit_submitted(ctx, SWEEP, 5.0, decided, plan_jobs)[0].assignments) == 2


def test_after_submit_warns_once_the_placed_work_nears_the_cap(ctx: Context, hook: list[dict[str, Any]]) -> None:
    jobs = _sweep(ctx.ledger, 10.0, [60])
    _run(ctx.ledger, jobs[0], "dear", T0 - HOUR, T0)  # $8 of $10
    api_budget.after_submit(ctx, SWEEP)
    finding = ctx.ledger.latest_finding(SWEEP, budget.RULE)
    assert finding is not None and finding.severity == "warn" and "80% of its budget" in finding.message
    _sweep(ctx.ledger, None, [60], sweep_id="qfree001")
    api_budget.after_submit(ctx, "qfree001")  # no cap: nothing to say
    api_budget.after_submit(ctx, "qnone001")  # no such sweep: nothing either
    assert ctx.ledger.latest_finding("qfree001", budget.RULE) is None


def test_set_cap_bounds_its_words_and_the_sweep_it_names(ctx: Context) -> None:
    _sweep(ctx.ledger, None, [60])
    jobs = _sweep(ctx.ledger, None, [60], sweep_id="qbud0002")  # the newer sweep: what no ref names
    view = api_budget.set_cap(ctx, SWEEP, 0.5)  # under a dollar is a budget too
    first = ctx.ledger.latest_finding(SWEEP, budget.RULE)
    assert first is not None and first.message == f"budget of sweep {SWEEP} set to $0.50 (had none)"
    assert view.sweep_id == SWEEP and ctx.ledger.sweep("qbud0002").budget_usd is None  # type: ignore[union-attr]
    with pytest.raises(UsageError):
        api_budget.set_cap(ctx, SWEEP, 1e9 + 1)
    _run(ctx.ledger, jobs[0], "dear", T0 - HOUR / 4, T0)  # $2 spent of the other sweep's
    other = api_budget.set_cap(ctx, "qbud0002", 5.0)
    assert other.note.startswith("$3.00 left under the cap for jobs not started")
    assert api_budget.show(ctx, None).sweep_id == "qbud0002"
    removed = api_budget.set_cap(ctx, SWEEP, None)
    assert removed.note == "no cap: every queued job may start (at the next tick)" and removed.standing.cap is None
    last = ctx.ledger.latest_finding(SWEEP, budget.RULE)
    assert last is not None and last.message == f"budget of sweep {SWEEP} removed (was $0.50)"


# -- idle billed hours of rented machines -------------------------------------------------------------------------


def test_a_rented_machines_idle_billed_time_counts_in_the_sweeps_that_used_it(ctx: Context) -> None:
    from tests.support.rented import add_rented, rented_row

    rented = add_rented(ctx.ledger, rented_row("rp-a", price_per_hour=4.0, gpu_count=1))  # $4/h, billing since now
    start = rented.created_at
    mine = _sweep(ctx.ledger, 100.0, [60])
    other = _sweep(ctx.ledger, None, [60], sweep_id="qbud0002")
    _run(ctx.ledger, mine[0], "rp-a", start, start + HOUR)  # $4 of use
    _run(ctx.ledger, other[0], "rp-a", start + HOUR, start + 2 * HOUR)  # $4 of use, another sweep's
    now = start + 4 * HOUR  # $16 billed: $8 of it idle, half of it this sweep's
    assert budget.Standing(None).idle == 0.0
    standing = _standing(ctx.ledger, now)
    assert standing.spent == pytest.approx(4.0) and standing.idle == pytest.approx(4.0)
    assert standing.total == pytest.approx(8.0) and "$4.00 spent + $4.00 idle machine time + $0.00" in standing.line()
    assert _standing(ctx.ledger, now, "qbud0002").idle == pytest.approx(4.0)
    ctx.ledger.lease_transition("rp-a", LeaseState.TERMINATED, "gone", at=start + 2 * HOUR)  # ended: no more idle
    assert _standing(ctx.ledger, now).idle == pytest.approx(0.0)
    assert _standing(ctx.ledger, now, "qbud0002").idle == pytest.approx(0.0)


def test_a_machine_not_rented_by_gpuq_adds_no_idle_time(ctx: Context) -> None:
    jobs = _sweep(ctx.ledger, 10.0, [60])
    _run(ctx.ledger, jobs[0], "dear", T0, T0 + HOUR)  # a priced host the user brought: only its attempts count
    assert _standing(ctx.ledger, T0 + 10 * HOUR).idle == 0.0


@pytest.mark.parametrize(("billed", "used", "split"), [
    (10.0, {"a": 3.0, "b": 1.0}, {"a": 4.5, "b": 1.5}),
    (8.0, {"a": 2.0, "": 2.0}, {"a": 2.0}),  # a sweep not counted now takes its part, charged to nobody here
    (3.0, {"a": 4.0}, {"a": 0.0}),  # billed less than used (a price changed): no idle
    (5.0, {}, {}),  # nothing ran there: no sweep to charge
    (5.0, {"a": 0.0}, {}),
])
def test_idle_money_is_split_by_what_each_sweep_used(billed: float, used: dict[str, float],
                                                     split: dict[str, float]) -> None:
    assert budget.idle_split(billed, used) == pytest.approx(split)
