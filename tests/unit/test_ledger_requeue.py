"""``Ledger.requeue``: the one way a job whose attempt ended goes back to the queue (the retry policy,
a setup failure, a gang that never started, a Slurm time-limit chunk, ``gpuq resume``), in ONE
transaction: the attempt's end, the job's pass through LOST (or PREEMPTED) and QUEUED, all or nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import IllegalTransition
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Ledger


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "home" / "ledger.db")


def _running(ledger: Ledger) -> str:
    spec = JobSpec(name="job0", config="c0.yaml", task="classify", config_sha256="0" * 64, line=1)
    (row,) = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="...", jobs=[spec],
                              default_retries=1)
    ledger.start_attempt(row.id, host="a", bundle_sha="s")
    ledger.transition(row.id, AttemptState.RUNNING, attempt=1)
    ledger.transition(row.id, JobState.RUNNING)
    return row.id


def _changes(ledger: Ledger, job_id: str) -> list[tuple[str, str, str, str]]:
    return [(e.subject, e.old, e.new, e.message) for e in ledger.events(limit=50)
            if e.subject.startswith(job_id) and e.new]


def test_a_requeue_ends_the_attempt_and_passes_the_job_through_lost(ledger: Ledger) -> None:
    job_id = _running(ledger)
    before = len(_changes(ledger, job_id))
    assert ledger.requeue(job_id, message="gave up", of_attempt=1, end_attempt=AttemptState.KILLED,
                          attempt_fields={"message": "gave up", "ended_at": 5.0})
    assert _changes(ledger, job_id)[before:] == [
        (f"{job_id}/a1", "RUNNING", "KILLED", "gave up"),
        (job_id, "RUNNING", "LOST", "gave up"),
        (job_id, "LOST", "QUEUED", "gave up"),
    ]
    attempt = ledger.attempt(job_id, 1)
    assert attempt is not None
    assert (attempt.state, attempt.message, attempt.ended_at) == ("KILLED", "gave up", 5.0)
    assert ledger.job(job_id).state == JobState.QUEUED.value


def test_a_time_limit_chunk_passes_through_preempted(ledger: Ledger) -> None:
    job_id = _running(ledger)
    ledger.requeue(job_id, message="chunk", of_attempt=1, end_attempt=AttemptState.PREEMPTED, via=JobState.PREEMPTED)
    assert [c[1:3] for c in _changes(ledger, job_id)[-3:]] == [("RUNNING", "PREEMPTED"), ("RUNNING", "PREEMPTED"),
                                                               ("PREEMPTED", "QUEUED")]


def test_a_job_already_lost_goes_straight_to_the_queue(ledger: Ledger) -> None:
    job_id = _running(ledger)
    ledger.transition(job_id, JobState.LOST, message="vanished")
    before = len(_changes(ledger, job_id))
    ledger.requeue(job_id, message="retry 1 of 1")
    assert _changes(ledger, job_id)[before:] == [(job_id, "LOST", "QUEUED", "retry 1 of 1")]
    ledger.start_attempt(job_id, host="a", bundle_sha="s")
    ledger.transition(job_id, JobState.PREEMPTED, message="spot")
    ledger.requeue(job_id, message="gpuq resume", via=None)  # resume: already PREEMPTED
    assert ledger.job(job_id).state == JobState.QUEUED.value


def test_a_requeue_that_cannot_finish_changes_nothing(ledger: Ledger) -> None:
    """Four writes once (attempt fields, attempt state, LOST, QUEUED): a job cancelled meanwhile left
    its attempt KILLED with a message although the job never went back to the queue."""
    job_id = _running(ledger)
    ledger.transition(job_id, JobState.CANCELLED, message="gpuq cancel")  # ends its attempt too (KILLED)
    before = _changes(ledger, job_id)
    cancelled = ledger.attempt(job_id, 1)
    assert cancelled is not None and cancelled.state == "KILLED" and cancelled.ended_at is not None
    with pytest.raises(IllegalTransition):
        ledger.requeue(job_id, message="gave up", of_attempt=1, end_attempt=AttemptState.LOST,
                       attempt_fields={"message": "gave up", "ended_at": 5.0})
    attempt = ledger.attempt(job_id, 1)
    assert attempt is not None
    assert (attempt.state, attempt.message, attempt.ended_at) == ("KILLED", "", cancelled.ended_at)
    assert _changes(ledger, job_id) == before
    assert ledger.job(job_id).state == JobState.CANCELLED.value


def test_news_of_an_old_attempt_requeues_nothing(ledger: Ledger) -> None:
    job_id = _running(ledger)
    ledger.requeue(job_id, message="retry", of_attempt=1, end_attempt=AttemptState.LOST)
    ledger.start_attempt(job_id, host="b", bundle_sha="s")
    assert not ledger.requeue(job_id, message="stale news", of_attempt=1)
    job = ledger.job(job_id)
    assert (job.state, job.attempt_count) == (JobState.ASSIGNED.value, 2)
    assert all(c[3] != "stale news" for c in _changes(ledger, job_id))
