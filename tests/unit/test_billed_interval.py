"""The controller's clock bounds what a host says about time (docs/cost.md, "The billed interval"): an attempt's
billed start and end are clamped to what gpuq saw (its dispatch, its probes that saw the attempt running and
ended); a host's claims outside that are kept as claims, with a finding, and never billed.  On a real SQLite
ledger through the tick's own code (tick/attempts.apply) and the budget's (tick/budget.standings)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec
from orchestrator.host_documents import JobEntry
from orchestrator.ledger import Job
from orchestrator.money.cost import Seen, billed_interval, money_spent
from orchestrator.tick import attempts
from orchestrator.tick import budget as tick_budget

HOUR = 3600.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def ctx(gpuq_home: Path) -> Iterator[Context]:
    context = open_context()
    try:
        context.ledger.ensure_host("dear", kind="ssh", root="/r")
        context.ledger.update_host("dear", price_per_hour=8.0, gpu_count=1)  # $8/h
        yield context
    finally:
        context.close()


def _job(ctx: Context) -> tuple[Job, float]:
    (job,) = ctx.ledger.add_sweep(
        sweep_id="qclk0001",
        queue_path="q.txt",
        workdir="/w",
        queue_text="",
        jobs=[JobSpec(name="j", config="c.yaml", task="t")],
        default_retries=0,
        bundle_sha="b" * 64,
        budget_usd=2.0,
    )
    attempt = ctx.ledger.start_attempt(job.id, host="dear", bundle_sha="s")
    return ctx.ledger.job(job.id), attempt.created_at


def _look(ctx: Context, clock: Clock, at: float, **entry: object) -> None:
    clock.now = at
    attempts.apply(ctx.ledger, ctx.ledger.job(entry["job_id"]), JobEntry.model_validate(entry))  # type: ignore[arg-type]


def _run(ctx: Context, monkeypatch: pytest.MonkeyPatch, start: float, end: float) -> tuple[Job, float]:
    """Dispatched at T, seen running at T+60 s and T+1 h, seen ended at T+1 h+60 s; the host claims
    ``start`` and ``end`` (offsets from T) for its attempt."""
    job, t = _job(ctx)
    clock = Clock(t)
    monkeypatch.setattr(attempts, "time", clock)
    for at in (t + 60, t + HOUR):
        _look(ctx, clock, at, job_id=job.id, attempt=1, state="running", launched_at=t + start)
    _look(
        ctx,
        clock,
        t + HOUR + 60,
        job_id=job.id,
        attempt=1,
        state="exited",
        launched_at=t + start,
        exit={"wrapper_code": 0, "started_at": t + start, "ended_at": t + end},
    )
    return job, t


@pytest.mark.parametrize(("start", "end"), [(1e6, -1e6), (HOUR, HOUR), (-1e6, -1e6), (1e6, 1e6)])
def test_a_host_that_lies_about_its_times_cannot_switch_off_a_capped_sweeps_budget(
    ctx: Context, monkeypatch: pytest.MonkeyPatch, start: float, end: float
) -> None:
    job, t = _run(ctx, monkeypatch, start, end)
    att = ctx.ledger.attempt(job.id, 1)
    assert att is not None and att.state == "EXITED" and ctx.ledger.job(job.id).state == "SUCCEEDED"
    assert att.started_at is not None and att.ended_at is not None
    assert t <= att.started_at <= t + 60 and t + HOUR <= att.ended_at <= t + HOUR + 60  # what gpuq saw
    assert (att.host_started_at, att.host_ended_at) == (t + start, t + end)  # the claims, kept
    sweep = ctx.ledger.sweep(job.sweep_id)
    assert sweep is not None
    standing = tick_budget.standings(ctx.ledger, [sweep], t + 10 * HOUR)[job.sweep_id]
    assert standing.spent >= (HOUR - 60) / HOUR * 8.0 > 2.0  # at least what gpuq saw it run: over the cap
    findings = [e for e in ctx.ledger.events(subject=job.id) if e.rule == attempts.CLOCK_RULE]
    assert findings and all("never billed" in e.message for e in findings)


def test_an_honest_hosts_times_are_billed_as_it_says_and_raise_no_finding(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, t = _run(ctx, monkeypatch, 30.0, HOUR + 30)
    att = ctx.ledger.attempt(job.id, 1)
    assert att is not None and (att.started_at, att.ended_at) == (t + 30, t + HOUR + 30)
    assert (att.seen_running_at, att.seen_alive_at, att.seen_ended_at) == (t + 60, t + HOUR, t + HOUR + 60)
    assert money_spent([att], t + 10 * HOUR) == pytest.approx(8.0)
    assert not [e for e in ctx.ledger.events(subject=job.id) if e.rule == attempts.CLOCK_RULE]


def test_the_window_is_what_gpuq_saw() -> None:
    seen = Seen(dispatched=100.0, running=160.0, alive=3700.0, ended=3760.0)
    inside = billed_interval(130.0, 3730.0, seen, 9e9)
    assert (inside.started, inside.ended, inside.start_outside, inside.end_outside) == (130.0, 3730.0, False, False)
    early = billed_interval(0.0, 0.0, seen, 9e9)  # before the dispatch; ended before it was last seen running
    assert (early.started, early.ended, early.start_outside, early.end_outside) == (100.0, 3700.0, True, True)
    late = billed_interval(9e8, 9e8, seen, 9e9)  # started after gpuq saw it running; ended after gpuq saw it ended
    assert (late.started, late.ended, late.start_outside, late.end_outside) == (160.0, 3760.0, True, True)
    running = billed_interval(9e8, None, Seen(dispatched=100.0, running=160.0, alive=200.0), 300.0)
    assert (running.started, running.ended) == (160.0, None)  # still running: no end yet, cost runs to now
    silent = billed_interval(None, None, Seen(dispatched=100.0, running=160.0, alive=200.0, ended=260.0), 300.0)
    assert (silent.started, silent.ended) == (160.0, 260.0)  # a host that says nothing: what gpuq saw
    never = billed_interval(None, None, Seen(dispatched=100.0), 300.0)
    assert (never.started, never.ended) == (None, None)
    skew = billed_interval(100.0 - 20, 3760.0 + 20, seen, 9e9)  # a clock a few seconds off: clamped, no finding
    assert (skew.started, skew.ended, skew.start_outside, skew.end_outside) == (100.0, 3760.0, False, False)
    edge = billed_interval(100.0 - 30, 3760.0 + 31, seen, 9e9)  # the slack's edge: 30 s is skew, 31 s a claim
    assert (edge.start_outside, edge.end_outside) == (False, True)
    before_end = billed_interval(3000.0, 10.0, Seen(dispatched=100.0, running=None, alive=None, ended=3760.0), 9e9)
    assert before_end.started == 3000.0 and before_end.ended == 3000.0  # never before its start
