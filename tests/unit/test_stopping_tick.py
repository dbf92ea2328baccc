"""Early stopping's ledger side and tick stage on a real SQLite ledger (docs/stopping.md): looks recorded
once per (sweep, cell, rung), the STOPPED state ending its attempt, the decision read from collected
curves (never the baseline, never below min_seeds), a recorded stop carried out once, a cancelled exit
of a stopped cell's job recorded STOPPED, and the saving's estimate.  The farm flow is
tests/integration/test_early_stopping.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.core.specs import JobSpec
from orchestrator.core.states import JOB_TERMINAL, AttemptState, JobState, job_may
from orchestrator.host_documents import JobEntry
from orchestrator.ledger import Ledger, StopLook
from orchestrator.report.cells import group
from orchestrator.stopping.policy import StopPolicy
from orchestrator.stopping.savings import Spent, saved
from orchestrator.tick import attempts, stoplooks, stopping
from orchestrator.tick.findings import TickReport

SWEEP = "qstop01"
POLICY = StopPolicy(rule="baseline", rungs=(0.2,), min_seeds=2)
TOTAL = 50


def _sweep(ledger: Ledger, seeds: dict[str, int], policy: StopPolicy | None = POLICY) -> dict[str, list[str]]:
    """Cells of ``seeds[cell]`` seeds each (jobs named ``cell-seed<k>``); cell -> job ids."""
    specs = [JobSpec(name=f"{cell}-seed{k}", cell=cell, seed=k, config=f"{cell}.yaml", task="t",
                     config_sha256=f"{i:064x}",
                     line=i + 1) for i, (cell, n) in enumerate(seeds.items()) for k in range(n)]
    rows = ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="...", jobs=specs,
                            default_retries=0, stop=policy.model_dump_json() if policy else "")
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row.cell, []).append(row.id)
    return out


def _running(ledger: Ledger, job_id: str, curve: list[tuple[int, float]]) -> None:
    """The job runs on host h, ``TOTAL`` steps long, and its curve so far is recorded."""
    number = ledger.start_attempt(job_id, host="h", bundle_sha="s" * 64).number
    ledger.transition(job_id, AttemptState.RUNNING, attempt=number)
    ledger.transition(job_id, JobState.RUNNING)
    ledger.update_attempt(job_id, number, step=max(s for s, _ in curve), total_steps=TOTAL)
    ledger.record_curves(job_id, number, {"val_acc": curve})


def _curve(level: float, seed: int, upto: int = 12) -> list[tuple[int, float]]:
    return [(s, level + 1.5 * math.exp(-s / TOTAL / 0.3) + 0.01 * seed) for s in range(1, upto + 1)]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


def _look(cell: str, rung: int = 0, stop: bool = True) -> StopLook:
    return StopLook(sweep_id=SWEEP, cell=cell, rung=rung, step=10, rule="baseline", fraction=0.2, cell_mean=3.0,
                    baseline_mean=2.0, n_cell=2, n_baseline=2, statistic=40.0, threshold=0.025, p_value=1e-5,
                    stop=stop, decided_at=1.0)


def test_stopped_is_final_and_ends_the_attempt_in_the_same_transition(ledger: Ledger) -> None:
    assert JobState.STOPPED in JOB_TERMINAL and job_may(JobState.RUNNING, JobState.STOPPED)
    assert not job_may(JobState.SUCCEEDED, JobState.STOPPED) and not job_may(JobState.STOPPED, JobState.RUNNING)
    job = _sweep(ledger, {"a": 1})["a"][0]
    _running(ledger, job, _curve(2.0, 0))
    assert ledger.transition(job, JobState.STOPPED, message="stopped: worse than baseline at step 10")
    [attempt] = ledger.attempts(job)
    assert attempt.state == AttemptState.KILLED.value and attempt.ended_at is not None
    assert ledger.curves([job])[job]["val_acc"][-1][0] == 12  # the partial curve is kept


def test_a_look_is_recorded_once_per_cell_and_rung(ledger: Ledger) -> None:
    _sweep(ledger, {"baseline": 2, "worse": 2})
    assert ledger.record_looks([_look("worse"), _look("worse", rung=1, stop=False)]) == 2
    assert ledger.record_looks([_look("worse", stop=False)]) == 0  # another tick's look at the same rung
    looks = ledger.stop_looks([SWEEP])
    assert [(lk.cell, lk.rung, lk.stop) for lk in looks] == [("worse", 0, True), ("worse", 1, False)]


def test_curves_so_far_replace_the_earlier_ones(ledger: Ledger) -> None:
    job = _sweep(ledger, {"a": 1})["a"][0]
    ledger.record_curves(job, 1, {"val_acc": [(1, 0.5), (2, 0.6)]})
    ledger.record_curves(job, 1, {"val_acc": [(1, 0.5), (2, 0.6), (3, 0.7), (4, math.nan)]})
    assert ledger.curves([job])[job]["val_acc"] == [(1, 0.5), (2, 0.6), (3, 0.7)]  # a NaN is never kept


def _decide(ledger: Ledger, policy: StopPolicy = POLICY) -> list[StopLook]:
    jobs = ledger.jobs(sweep_id=SWEEP)
    return stopping.decide(ledger, policy, SWEEP, group(jobs), "baseline", ledger.stop_looks([SWEEP]))


def test_the_worse_cell_is_stopped_never_the_baseline_nor_the_good(ledger: Ledger) -> None:
    cells = _sweep(ledger, {"baseline": 2, "good": 2, "worse": 2})
    levels = {"baseline": 2.0, "good": 1.95, "worse": 3.0}  # the headline is val_acc ("max"): the policy says min
    for cell, ids in cells.items():
        for seed, job in enumerate(ids):
            _running(ledger, job, _curve(levels[cell], seed))
    due = _decide(ledger)
    assert {(lk.cell, lk.stop) for lk in due} == {("good", False), ("worse", True)}
    worse = next(lk for lk in due if lk.cell == "worse")
    assert worse.step == 10 and worse.n_cell == worse.n_baseline == 2 and worse.p_value is not None
    assert worse.p_value <= worse.threshold == pytest.approx(0.05 / 2)
    assert worse.cell_mean == pytest.approx(3.0 + 1.5 * math.exp(-10 / TOTAL / 0.3) + 0.005)
    assert stoplooks.reason(worse).startswith("stopped: worse than baseline at step 10 (rung 1): mean ")


def test_no_look_before_min_seeds_or_while_a_seed_has_yet_to_reach_the_rung(ledger: Ledger) -> None:
    cells = _sweep(ledger, {"baseline": 3, "worse": 3})
    for cell, ids in cells.items():
        for seed, job in enumerate(ids[:2]):
            _running(ledger, job, _curve(2.0 if cell == "baseline" else 3.0, seed))
    assert _decide(ledger) == []  # the third seeds are queued: they may yet reach the rung
    assert _decide(ledger, POLICY.model_copy(update={"min_seeds": 3})) == []
    for cell, ids in cells.items():
        _running(ledger, ids[2], _curve(2.0 if cell == "baseline" else 3.0, 2, upto=5))  # below the rung
    assert _decide(ledger) == []
    ledger.record_curves(cells["baseline"][2], 1, {"val_acc": _curve(2.0, 2)})
    ledger.record_curves(cells["worse"][2], 1, {"val_acc": _curve(3.0, 2)})
    assert [(lk.cell, lk.stop, lk.n_cell) for lk in _decide(ledger)] == [("worse", True, 3)]


def test_a_recorded_stop_of_unplaced_jobs_is_carried_out_once(ledger: Ledger, tmp_path: Path) -> None:
    """Jobs never placed on a host end STOPPED in the ledger alone; a second pass (the next tick after a
    crash) changes nothing and writes no second event; the baseline is never touched."""
    from orchestrator.context import Context

    cells = _sweep(ledger, {"baseline": 2, "worse": 2})
    ledger.record_looks([_look("worse"), _look("baseline")])  # a baseline look (never made) stops nothing
    ctx = Context.__new__(Context)
    ctx.ledger = ledger
    jobs = ledger.jobs(sweep_id=SWEEP)
    for _ in range(2):
        report = TickReport()
        stopping.carry_out(ctx, group(jobs), "baseline", ledger.stop_looks([SWEEP]), report)
    states: dict[str, set[str]] = {j.cell: set() for j in jobs}
    for job in ledger.jobs(sweep_id=SWEEP):
        states[job.cell].add(job.state)
    assert states == {"baseline": {"QUEUED"}, "worse": {"STOPPED"}}
    for job_id in cells["worse"]:
        assert [e.new for e in ledger.events(subject=job_id)].count("STOPPED") == 1


def test_a_cancelled_exit_of_a_stopped_cells_job_is_recorded_stopped(ledger: Ledger) -> None:
    """gpuq killed after the agent's cancel and before its own STOPPED: reconcile reads the cancelled exit
    and, the cell's stop being recorded, ends the job STOPPED (a user's cancel stays CANCELLED)."""
    cells = _sweep(ledger, {"baseline": 1, "worse": 1, "other": 1})
    for ids in cells.values():
        _running(ledger, ids[0], _curve(2.0, 0))
    ledger.record_looks([_look("worse")])
    for cell, want in (("worse", "STOPPED"), ("other", "CANCELLED")):
        job = ledger.job(cells[cell][0])
        seen = JobEntry.model_validate({"job_id": job.id, "attempt": 1, "state": "exited", "cancel_requested": True,
                                        "exit": {"wrapper_code": 143, "wrapper_signal": 15}})
        attempts.apply(ledger, job, seen)
        assert ledger.job(job.id).state == want
    said = next(e for e in ledger.events(subject=cells["worse"][0]) if e.new == "STOPPED")
    assert said.message.startswith("stopped: worse than baseline at step 10")


def test_a_sweep_without_a_policy_is_not_watched(ledger: Ledger) -> None:
    _sweep(ledger, {"baseline": 1}, policy=None)
    assert stopping.watched(ledger, ledger.jobs(sweep_id=SWEEP)) == {}


def test_the_saving_is_each_jobs_own_rate_times_the_steps_it_did_not_run() -> None:
    assert saved([]) is None
    found = saved([Spent(gpu_hours=0.5, cost_usd=1.0, step=10, total_steps=50),
                   Spent(gpu_hours=0.2, cost_usd=None, step=20, total_steps=40),
                   Spent(gpu_hours=0.3, step=None, total_steps=None)])
    assert found is not None
    assert found.gpu_hours == pytest.approx(0.5 * 4 + 0.2 * 1) and found.cost_usd == pytest.approx(4.0)
    assert (found.counted, found.uncounted) == (2, 1)
    assert found.basis.startswith("estimate: ") and "1 without a known step and total left out" in found.basis


def test_explain_says_why_a_job_was_stopped(gpuq_home: Path) -> None:
    from tests.conftest import run_gpuq

    ledger = Ledger(gpuq_home / "ledger.db")
    cells = _sweep(ledger, {"baseline": 1, "worse": 1})
    job = cells["worse"][0]
    _running(ledger, job, _curve(3.0, 0))
    ledger.record_looks([_look("worse")])
    ledger.transition(job, JobState.STOPPED, message="stopped")
    ran = run_gpuq("explain", job)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].endswith(": STOPPED, 1 attempt")
    assert lines[1] == ("stopped: worse than baseline at step 10 (rung 1): mean 3 vs baseline 2, t=40, "
                        "p=1e-05 <= 0.025"), lines
    listed = run_gpuq("results")
    assert listed.returncode == 0, listed.stderr
    assert "STOPPED" in listed.stdout and "early stopping saved about " in listed.stdout, listed.stdout
    assert "(estimate: each of 1 stopped job" in " ".join(listed.stdout.split()), listed.stdout
