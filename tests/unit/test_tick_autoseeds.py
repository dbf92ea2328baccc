"""seeds=auto in the tick (orchestrator/tick/autoseeds.py): the decision glue on ledger rows, and the stage
on a real SQLite ledger (no processes): seeds only for the ambiguous cell, up to its MAX, within the budget,
each added once however often the tick decides."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec, job_id_for
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Job, Ledger
from orchestrator.ledger.sweep_records import job_row
from orchestrator.queue.queuefile import parse_bytes
from orchestrator.stopping.seeds import AutoSeeds
from orchestrator.tick import autoseeds
from orchestrator.tick.findings import TickReport, sweeps_done

SWEEP = "qauto001"
QUEUE = ("name=baseline seeds=auto:3..5 -- --lr 1\n"
         "name=worse seeds=auto:3..5 -- --lr 2\n"
         "name=unclear seeds=auto:3..5 -- --lr 3 --seed {seed}\n")
FINALS = {"baseline": [1.00, 1.01, 0.99], "worse": [2.00, 2.01, 1.99], "unclear": [1.05, 0.97, 1.03]}
AUTO = AutoSeeds(min_seeds=2, max_seeds=64)


def _specs(text: str = QUEUE) -> list[JobSpec]:
    return list(parse_bytes(text.encode(), label="q.txt", workdir=None, needs_config=False).jobs)


def _rows(finals: Mapping[str, list[float]]) -> tuple[list[Job], dict[str, float]]:
    """The sweep's jobs, every one SUCCEEDED, and their final values (seed k of a cell: finals[cell][k])."""
    jobs = [job_row(SWEEP, spec, 0, 0.0) for spec in _specs()]
    values: dict[str, float] = {}
    for job in jobs:
        job.state = JobState.SUCCEEDED.value
        values[job.id] = finals[job.cell][job.seed or 0]
    return jobs, values


def test_nothing_is_decided_while_a_seed_may_still_run() -> None:
    jobs, values = _rows(FINALS)
    jobs[4].state = JobState.RUNNING.value
    assert autoseeds.plan_round(AUTO, jobs, values, {}, None) is None


def test_only_the_ambiguous_cell_gets_its_next_seed_a_copy_of_its_first() -> None:
    jobs, values = _rows(FINALS)
    decided = autoseeds.plan_round(AUTO, jobs, values, {}, None)
    assert decided is not None and not decided.settled
    assert [(s.name, s.seed, s.seeds_max, s.cell) for s in decided.add] == [("unclear-seed3", 3, 5, "unclear")]
    assert decided.add[0].args == ("--lr", "3", "--seed", "{seed}")  # {seed} is rendered on the host: 3
    assert "ambiguous" in decided.why["unclear-seed3"]
    again = autoseeds.plan_round(AUTO, jobs, values, {}, None)  # a tick that decides again decides the same
    assert again is not None and [s.name for s in again.add] == ["unclear-seed3"]


def test_seeds_stop_at_the_max_and_the_sweep_is_settled_saying_why() -> None:
    finals = {**FINALS, "unclear": [1.05, 0.97, 1.03, 0.95, 1.07]}
    jobs, values = _rows(finals)
    for k in (3, 4):  # the two seeds the tick added, done
        decided = autoseeds.plan_round(AUTO, jobs, values, {}, None)
        assert decided is not None and [s.name for s in decided.add] == [f"unclear-seed{k}"]
        row = job_row(SWEEP, decided.add[0], 0, 1.0)
        row.state = JobState.SUCCEEDED.value
        jobs.append(row)
        values[row.id] = finals["unclear"][k]
    decided = autoseeds.plan_round(AUTO, jobs, values, {}, None)
    assert decided is not None and not decided.add
    assert decided.settled == "seeds=auto is done: clear: worse; still ambiguous at their most seeds: unclear"


def test_the_baseline_gets_a_seed_when_every_comparison_is_ambiguous() -> None:
    finals = {"baseline": [1.00, 1.04, 0.97], "worse": [1.02, 0.98, 1.03], "unclear": [1.05, 0.97, 1.03]}
    jobs, values = _rows(finals)
    decided = autoseeds.plan_round(AUTO, jobs, values, {}, None)
    assert decided is not None
    assert decided.add[0].name == "baseline-seed3"
    assert sorted(s.name for s in decided.add) == ["baseline-seed3", "unclear-seed3", "worse-seed3"]


def test_a_fixed_cell_and_a_failed_seed_count_towards_the_bound() -> None:
    text = "name=baseline seeds=3 -- a\nname=unclear seeds=auto:3..4 -- b\n"
    jobs = [job_row(SWEEP, spec, 0, 0.0) for spec in _specs(text)]
    values = {}
    for job in jobs:
        job.state = JobState.SUCCEEDED.value
        values[job.id] = FINALS[job.cell][job.seed or 0]
    decided = autoseeds.plan_round(AUTO, jobs, values, {}, None)
    assert decided is not None and [s.name for s in decided.add] == ["unclear-seed3"]  # never the fixed baseline
    failed = job_row(SWEEP, decided.add[0], 0, 1.0)
    failed.state = JobState.FAILED.value
    decided = autoseeds.plan_round(AUTO, [*jobs, failed], values, {}, None)
    assert decided is not None and not decided.add and "unclear" in decided.settled


def test_no_seed_is_added_when_no_seed_reported_the_metric() -> None:
    jobs, _ = _rows(FINALS)
    decided = autoseeds.plan_round(AUTO, jobs, {}, {}, None)
    assert decided is not None and not decided.add and "no seed reported a final value" in decided.settled


def test_a_cancelled_job_settles_the_sweep() -> None:
    jobs, values = _rows(FINALS)
    jobs[0].state = JobState.CANCELLED.value
    decided = autoseeds.plan_round(AUTO, jobs, values, {}, None)
    assert decided is not None and not decided.add and "cancelled" in decided.settled


def test_the_budget_holds_what_it_does_not_afford_in_order() -> None:
    finals = {"baseline": [1.00, 1.04, 0.97], "worse": [1.02, 0.98, 1.03], "unclear": [1.05, 0.97, 1.03]}
    jobs, values = _rows(finals)
    cost = {j.id: 1.0 for j in jobs}
    decided = autoseeds.plan_round(AUTO, jobs, values, cost, 2.5)
    assert decided is not None and decided.add[0].name == "baseline-seed3" and len(decided.add) == 2
    assert "the budget holds" in decided.why["baseline-seed3"]
    decided = autoseeds.plan_round(AUTO, jobs, values, cost, 0.5)
    assert decided is not None and not decided.add
    assert decided.settled.startswith("the budget leaves $0.50, less than one more seed of baseline")


# ---------------------------------------------------------------- the stage, on a real ledger


@pytest.fixture
def ctx(gpuq_home: Path) -> Iterator[Context]:
    context = open_context()
    try:
        context.ledger.ensure_host("priced", kind="ssh", root="/r")
        context.ledger.update_host("priced", price_per_hour=3600.0, gpu_count=1)  # $1 a second
        yield context
    finally:
        context.close()


def _submit(ledger: Ledger, cap: float | None) -> list[Job]:
    return ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text=QUEUE, jobs=_specs(),
                            default_retries=0, bundle_sha="b" * 64, budget_usd=cap)


def _finish(ledger: Ledger, job: Job, value: float, seconds: float = 1.0) -> None:
    """One attempt on the priced host of ``seconds`` (so many dollars), SUCCEEDED with its final ``value``."""
    ledger.start_attempt(job.id, host="priced", bundle_sha="s")
    ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ledger.transition(job.id, JobState.RUNNING)
    now = time.time()
    ledger.update_attempt(job.id, 1, started_at=now - seconds)
    ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    ledger.transition(job.id, JobState.SUCCEEDED)
    ledger.update_attempt(job.id, 1, ended_at=now)
    ledger.record_results(job.id, 1, metrics=[("final", "val_acc", value, 10, None)], artifacts=[])


def _finish_all(ledger: Ledger, finals: Mapping[str, list[float]]) -> None:
    for job in ledger.jobs(sweep_id=SWEEP, states=[JobState.QUEUED]):
        _finish(ledger, job, finals[job.cell][job.seed or 0])


def test_the_stage_adds_the_seed_once_and_the_sweep_is_not_announced_meanwhile(ctx: Context) -> None:
    _submit(ctx.ledger, None)
    _finish_all(ctx.ledger, FINALS)
    report = TickReport()
    unsettled = autoseeds.add_seeds(ctx, report)
    added = ctx.ledger.job(job_id_for(SWEEP, "unclear-seed3"))
    assert (added.state, added.seed, added.seeds_max, added.arg_list()) == (
        JobState.QUEUED.value, 3, 5, ["--lr", "3", "--seed", "{seed}"])
    assert len(ctx.ledger.jobs(sweep_id=SWEEP)) == 10 and unsettled == {SWEEP}
    assert any("seeds=auto added unclear-seed3" in a for a in report.actions)
    # a crash after the decision: the tick decides again from the same rows and inserts the same seed once
    sweep = ctx.ledger.sweep(SWEEP)
    assert sweep is not None and sweep.job_count == 10
    decided = autoseeds.plan_round(AUTO, [j for j in ctx.ledger.jobs(sweep_id=SWEEP) if j.id != added.id],
                                   autoseeds._finals(ctx.ledger, sweep, ctx.ledger.jobs(sweep_id=SWEEP)), {}, None)
    assert decided is not None and [s.name for s in decided.add] == ["unclear-seed3"]
    assert ctx.ledger.add_seeds(SWEEP, decided.add, 0, decided.why) == []
    assert len(ctx.ledger.jobs(sweep_id=SWEEP)) == 10
    sweeps_done(ctx, TickReport(), autoseeds.add_seeds(ctx, TickReport()))  # the seed is queued: not done
    assert ctx.ledger.latest_finding(SWEEP, "sweep_done") is None


def test_the_stage_runs_to_the_max_then_settles_once_and_the_sweep_is_done(ctx: Context) -> None:
    _submit(ctx.ledger, None)
    finals = {**FINALS, "unclear": [1.05, 0.97, 1.03, 0.95, 1.07]}
    _finish_all(ctx.ledger, finals)
    for _ in range(3):
        sweeps_done(ctx, TickReport(), autoseeds.add_seeds(ctx, TickReport()))
        _finish_all(ctx.ledger, finals)
    names = sorted(j.name for j in ctx.ledger.jobs(sweep_id=SWEEP) if j.cell == "unclear")
    assert names == [f"unclear-seed{k}" for k in range(5)]
    assert len(ctx.ledger.jobs(sweep_id=SWEEP)) == 11
    settled = ctx.ledger.latest_finding(SWEEP, autoseeds.RULE)
    assert settled is not None and "still ambiguous at their most seeds: unclear" in settled.message
    assert ctx.ledger.latest_finding(SWEEP, "sweep_done") is not None


def test_the_budget_stops_the_seeds(ctx: Context) -> None:
    _submit(ctx.ledger, 9.4)  # nine $1 seeds spent: $0.40 left, less than one more seed's measured $1
    _finish_all(ctx.ledger, FINALS)
    assert autoseeds.add_seeds(ctx, TickReport()) == set()
    assert len(ctx.ledger.jobs(sweep_id=SWEEP)) == 9
    settled = ctx.ledger.latest_finding(SWEEP, autoseeds.RULE)
    assert settled is not None and settled.message.startswith("the budget leaves $0.40, less than one more seed")


def test_a_budget_with_room_for_one_seed_adds_it(ctx: Context) -> None:
    _submit(ctx.ledger, 10.5)
    _finish_all(ctx.ledger, FINALS)
    autoseeds.add_seeds(ctx, TickReport())
    assert [j.name for j in ctx.ledger.jobs(sweep_id=SWEEP, states=[JobState.QUEUED])] == ["unclear-seed3"]
