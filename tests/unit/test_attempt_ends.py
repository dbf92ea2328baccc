"""An attempt always ends with its job (docs/cost.md): a cancel, a settle or a withdrawal that ends the job
ends its current attempt in the same transaction, with an end time, so its cost stops growing; and the
ledger invariant the integration suite checks after every test (tests/support/ledger_invariants.py)
fails on a ledger that breaks it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Ledger
from orchestrator.money.cost import job_cost
from tests.support.ledger_invariants import broken, check_all


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "home" / "ledger.db")


def _job(ledger: Ledger, *, running: bool) -> str:
    rows = ledger.add_sweep(
        sweep_id="qend0001",
        queue_path="q.txt",
        workdir="/w",
        queue_text="",
        jobs=[JobSpec(name="j", config="c.yaml", task="t")],
        default_retries=0,
    )
    job_id = rows[0].id
    ledger.start_attempt(job_id, host="local", bundle_sha="s")
    if running:
        ledger.transition(job_id, AttemptState.RUNNING, attempt=1)
        ledger.transition(job_id, JobState.RUNNING)
        ledger.update_attempt(job_id, 1, started_at=1000.0)
    return job_id


@pytest.mark.parametrize(
    ("new", "ends_as"),
    [
        (JobState.CANCELLED, AttemptState.KILLED),
        (JobState.FAILED, AttemptState.LOST),
        (JobState.SUCCEEDED, AttemptState.EXITED),
    ],
)
def test_a_job_that_ends_ends_its_running_attempt_and_its_cost_stops(
    ledger: Ledger, new: JobState, ends_as: AttemptState
) -> None:
    job_id = _job(ledger, running=True)
    ledger.transition(job_id, new, message="cancelled by user (killed)")
    attempt = ledger.attempt(job_id, 1)
    assert attempt is not None and attempt.state == ends_as.value
    assert attempt.ended_at is not None and attempt.ended_at >= 1000.0
    later = [job_cost(1, [attempt], [], now).gpu_hours for now in (attempt.ended_at + 10, attempt.ended_at + 1e6)]
    assert later[0] == later[1]
    assert any(e.new == ends_as.value for e in ledger.events(subject=f"{job_id}/a1"))


def test_a_job_cancelled_before_it_started_ends_its_starting_attempt(ledger: Ledger) -> None:
    job_id = _job(ledger, running=False)
    ledger.transition(job_id, JobState.CANCELLED, message="cancelled")
    attempt = ledger.attempt(job_id, 1)
    assert attempt is not None and attempt.state == AttemptState.KILLED.value
    assert job_cost(1, [attempt], [], 1e12).gpu_hours == 0.0


def test_an_end_the_host_recorded_is_kept(ledger: Ledger) -> None:
    job_id = _job(ledger, running=True)
    ledger.update_attempt(job_id, 1, ended_at=1500.0)
    ledger.transition(job_id, AttemptState.EXITED, attempt=1)
    ledger.transition(job_id, JobState.SUCCEEDED)
    attempt = ledger.attempt(job_id, 1)
    assert attempt is not None and attempt.ended_at == 1500.0


def test_a_look_that_began_before_the_end_never_unends_the_attempt(ledger: Ledger) -> None:
    """Two commands tick at once: one ends the attempt, the other (its probe read before that end) then
    writes the progress it saw, with no end; the end stays (the race the concurrent-commands test met)."""
    job_id = _job(ledger, running=True)
    ledger.transition(job_id, JobState.CANCELLED, message="cancelled by user (killed)")
    ended = ledger.attempt(job_id, 1)
    assert ended is not None and ended.ended_at is not None
    ledger.update_attempt(job_id, 1, started_at=1000.0, ended_at=None, seen_ended_at=None, step=3)
    after = ledger.attempt(job_id, 1)
    assert after is not None and after.ended_at == ended.ended_at and after.step == 3
    assert not broken(ledger.path)


def test_the_invariant_holds_on_a_good_ledger_and_names_each_breach(ledger: Ledger, tmp_path: Path) -> None:
    job_id = _job(ledger, running=True)
    ledger.transition(job_id, JobState.CANCELLED)
    db = tmp_path / "home" / "ledger.db"
    assert broken(db) == [] and check_all(tmp_path) == []
    conn = sqlite3.connect(db)
    with conn:  # what main left: the job CANCELLED, its attempt RUNNING with no end
        conn.execute("UPDATE attempt SET state = 'RUNNING', ended_at = NULL")
    conn.close()
    lines = check_all(tmp_path)
    assert len(lines) == 1 and f"job {job_id} is CANCELLED but its attempt 1 is still RUNNING" in lines[0]
    conn = sqlite3.connect(db)
    with conn:  # ended, but no end time: its cost grows with the clock
        conn.execute("UPDATE attempt SET state = 'KILLED'")
    conn.close()
    lines = broken(db)
    assert len(lines) == 1 and "no end time" in lines[0]
