"""A job starts once: the ledger's check-and-change writes are atomic across gpuq processes.

Each test here fails when the state a write checks is read outside its write transaction, or when
`start_attempt` accepts a job that is not QUEUED (issue: "A job can start twice")."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from orchestrator.agent.launcher import record_attempts
from orchestrator.core.config import Settings
from orchestrator.core.errors import IllegalTransition, JobNotFound
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Job, Ledger


def _sweep(ledger: Ledger, n: int = 2) -> list[str]:
    specs = [JobSpec(name=f"job{i}", config=f"c{i}.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i in range(n)]
    rows = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="...", jobs=specs,
                            default_retries=1)
    return [r.id for r in rows]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "home" / "ledger.db")


def test_start_attempt_only_from_queued(ledger: Ledger) -> None:
    job_id = _sweep(ledger, 1)[0]
    ledger.start_attempt(job_id, host="a", bundle_sha="s")
    with pytest.raises(IllegalTransition, match="ASSIGNED"):
        ledger.start_attempt(job_id, host="b", bundle_sha="s")
    job = ledger.job(job_id)
    assert (job.state, job.attempt_count, job.host) == (JobState.ASSIGNED.value, 1, "a")
    assert [(a.number, a.host) for a in ledger.attempts(job_id)] == [(1, "a")]
    ledger.transition(job_id, JobState.RUNNING)
    with pytest.raises(IllegalTransition):
        ledger.start_attempt(job_id, host="b", bundle_sha="s")
    assert len(ledger.attempts(job_id)) == 1


def test_a_writing_session_holds_the_write_lock_from_its_first_read(ledger: Ledger) -> None:
    """The state a session checks cannot change before it writes: another connection's write
    waits (here: fails at once, no busy timeout) while the session is open, even before it wrote."""
    job_id = _sweep(ledger, 1)[0]
    other = sqlite3.connect(ledger.path, timeout=0, isolation_level=None)
    try:
        with ledger.session() as s:
            assert s.get(Job, job_id) is not None  # read only, nothing written yet
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("UPDATE job SET state = 'CANCELLED' WHERE id = ?", (job_id,))
        other.execute("UPDATE job SET updated_at = updated_at WHERE id = ?", (job_id,))  # free again
        with ledger.reading() as s:  # a read-only session blocks no writer (WAL)
            assert s.get(Job, job_id) is not None
            other.execute("UPDATE job SET updated_at = updated_at WHERE id = ?", (job_id,))
    finally:
        other.close()


def _start(args: tuple[str, str, str, object]) -> str:
    path, job_id, host, barrier = args
    ledger = Ledger(Path(path))
    barrier.wait(timeout=30)  # type: ignore[attr-defined]
    try:
        if host.startswith("move-"):
            ledger.move_job(job_id, from_attempt=1, to_host=host, bundle_sha="s", message="steal")
        else:
            ledger.start_attempt(job_id, host=host, bundle_sha="s")
        return "started"
    except IllegalTransition:
        return "refused"
    finally:
        ledger.close()


def _race(ledger: Ledger, job_id: str, hosts: list[str]) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(hosts))
        with ctx.Pool(len(hosts)) as pool:
            return sorted(pool.map(_start, [(str(ledger.path), job_id, h, barrier) for h in hosts]))


def test_racing_processes_start_a_queued_job_once(ledger: Ledger) -> None:
    job_id = _sweep(ledger, 1)[0]
    assert _race(ledger, job_id, [f"h{i}" for i in range(4)]) == ["refused", "refused", "refused", "started"]
    assert len(ledger.attempts(job_id)) == 1
    starts = [e for e in ledger.events(job_id) if e.new == AttemptState.STARTING.value]
    assert len(starts) == 1


def test_dispatch_from_a_stale_queued_list_enqueues_nothing_twice(ledger: Ledger) -> None:
    """A tick that read QUEUED jobs seconds ago gets no spec for one another command started since."""
    ids = _sweep(ledger, 2)
    stale = ledger.jobs(states=[JobState.QUEUED])
    ledger.start_attempt(ids[0], host="a", bundle_sha="s")  # `gpuq status` elsewhere, meanwhile
    specs = record_attempts(ledger, "b", "s", stale, Settings())
    assert [s.job_id for s in specs] == [ids[1]]
    assert [(a.number, a.host) for a in ledger.attempts(ids[0])] == [(1, "a")]
    assert any("not started on b" in e.message for e in ledger.events(ids[0]))


def test_move_job_moves_only_the_current_attempt(ledger: Ledger) -> None:
    job_id = _sweep(ledger, 1)[0]
    ledger.start_attempt(job_id, host="a", bundle_sha="s")
    ledger.move_job(job_id, from_attempt=1, to_host="b", bundle_sha="s", message="steal")
    with pytest.raises(IllegalTransition):  # a second steal of the same withdrawn attempt
        ledger.move_job(job_id, from_attempt=1, to_host="c", bundle_sha="s", message="steal")
    assert [(a.number, a.host, a.state) for a in ledger.attempts(job_id)] == [
        (1, "a", AttemptState.KILLED.value), (2, "b", AttemptState.STARTING.value)]


def test_racing_steals_move_an_attempt_once(ledger: Ledger) -> None:
    job_id = _sweep(ledger, 1)[0]
    ledger.start_attempt(job_id, host="a", bundle_sha="s")
    assert _race(ledger, job_id, [f"move-{i}" for i in range(4)]) == ["refused", "refused", "refused", "started"]
    assert [a.number for a in ledger.attempts(job_id)] == [1, 2]


def test_news_of_an_old_attempt_never_ends_a_newer_one(ledger: Ledger) -> None:
    """A tick that probed while attempt 1 was ending settles it after another command already
    requeued the job and started attempt 2: nothing changes (no LOST, no attempt 3)."""
    from orchestrator.tick.settle import settle

    job_id = _sweep(ledger, 1)[0]
    ledger.start_attempt(job_id, host="a", bundle_sha="s")
    ledger.transition(job_id, AttemptState.LOST, attempt=1, message="group gone")
    ledger.transition(job_id, JobState.LOST, message="group gone", of_attempt=1)
    first = settle(ledger, job_id, "vanished", Settings(), attempt=1)
    assert first.action == "requeue" and ledger.job(job_id).state == JobState.QUEUED.value
    ledger.start_attempt(job_id, host="b", bundle_sha="s")
    # the stale tick, one step behind
    assert ledger.transition(job_id, JobState.LOST, message="group gone", of_attempt=1) is False
    again = settle(ledger, job_id, "vanished", Settings(), attempt=1)
    assert again.action == "stale"
    job = ledger.job(job_id)
    assert (job.state, job.attempt_count, job.host) == (JobState.ASSIGNED.value, 2, "b")
    with pytest.raises(IllegalTransition):
        ledger.start_attempt(job_id, host="c", bundle_sha="s")


def test_a_delivery_starts_its_jobs_in_one_transaction(ledger: Ledger) -> None:
    """``start_attempts`` (one delivery): every QUEUED job gets attempt n+1 at the price its host has
    now, a job started meanwhile is answered with its refusal and left as it was, and a job that does
    not exist fails the whole delivery with nothing written."""
    ids = _sweep(ledger, 4)
    ledger.ensure_host("h", kind="ssh", root="/r")
    ledger.update_host("h", price_per_hour=8.0, gpu_count=4)
    ledger.start_attempt(ids[1], host="a", bundle_sha="s")
    with pytest.raises(JobNotFound):
        ledger.start_attempts([ids[0], "cmissing00000", ids[2]], host="h", bundle_sha="s")
    assert [ledger.job(i).state for i in (ids[0], ids[2])] == [JobState.QUEUED.value] * 2
    assert ledger.attempts(ids[0]) == [] and ledger.attempts(ids[2]) == []
    started = ledger.start_attempts(ids, host="h", bundle_sha="s2")
    assert isinstance(started[ids[1]], IllegalTransition)
    assert [(a.number, a.host) for a in ledger.attempts(ids[1])] == [(1, "a")]
    for job_id in (ids[0], ids[2], ids[3]):
        attempt = ledger.attempts(job_id)[-1]
        assert (attempt.number, attempt.host, attempt.bundle_sha, attempt.state) == (1, "h", "s2", "STARTING")
        assert (attempt.price_per_hour, attempt.gpu_share) == (8.0, 0.25)
        assert ledger.job(job_id).state == JobState.ASSIGNED.value


def _deliver(args: tuple[str, list[str], str, object]) -> list[str]:
    path, ids, host, barrier = args
    barrier.wait()  # type: ignore[attr-defined]
    got = Ledger(Path(path)).start_attempts(ids, host=host, bundle_sha="s")
    return sorted(job_id for job_id, a in got.items() if not isinstance(a, IllegalTransition))


def test_racing_deliveries_start_each_job_once(ledger: Ledger) -> None:
    ids = _sweep(ledger, 6)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(3)
        with ctx.Pool(3) as pool:
            won = pool.map(_deliver, [(str(ledger.path), ids[i:] + ids[:i], f"h{i}", barrier) for i in range(3)])
    assert sorted(j for w in won for j in w) == sorted(ids)  # every job started by exactly one delivery
    assert all(len(ledger.attempts(j)) == 1 for j in ids)
