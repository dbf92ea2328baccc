"""The ledger: transitions, events, atomic sweeps, 0600 file, schema versioning."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from orchestrator.core.errors import IllegalTransition, JobNotFound, LedgerError, LedgerVersionError
from orchestrator.core.specs import JobSpec, job_id_for
from orchestrator.core.states import ATTEMPT_ALLOWED, JOB_ALLOWED, AttemptState, JobState
from orchestrator.host_documents import ResultCheckpoint
from orchestrator.ledger import Ledger
from orchestrator.ledger.migrate import SCHEMA_VERSION


def _specs(n: int) -> list[JobSpec]:
    return [JobSpec(name=f"job{i}", config=f"c{i}.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
            for i in range(n)]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "home" / "ledger.db")


def _sweep(ledger: Ledger, sweep_id: str = "qaaaaaa", n: int = 3) -> list[str]:
    rows = ledger.add_sweep(sweep_id=sweep_id, queue_path="q.txt", workdir="/w", queue_text="...",
                            jobs=_specs(n), default_retries=1)
    return [r.id for r in rows]


def test_file_is_private_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_existing_loose_permissions_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.touch(mode=0o644)
    path.chmod(0o644)
    Ledger(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerVersionError, match="newer than this gpuq"):
        Ledger(path)


def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ids = _sweep(Ledger(path))
    again = Ledger(path)
    assert [j.id for j in again.jobs()] == ids


def test_add_sweep_ids_are_stable_and_queued(ledger: Ledger) -> None:
    ids = _sweep(ledger)
    assert ids == [job_id_for("qaaaaaa", f"job{i}") for i in range(3)]
    assert {j.state for j in ledger.jobs()} == {"QUEUED"}
    assert [e.new for e in ledger.events()] == ["submitted"]


def test_add_sweep_is_all_or_nothing(ledger: Ledger) -> None:
    dup = [*_specs(2), _specs(1)[0]]  # the same name twice violates the primary key mid-insert
    with pytest.raises(LedgerError, match=r"ledger error: IntegrityError: .*UNIQUE constraint failed: job\.id"):
        ledger.add_sweep(sweep_id="qbbbbbb", queue_path="q", workdir="/w", queue_text="",
                         jobs=dup, default_retries=1)
    assert ledger.jobs() == []
    assert ledger.sweeps() == []


def test_transition_appends_events_and_refuses_illegal(ledger: Ledger) -> None:
    job = _sweep(ledger, n=1)[0]
    attempt = ledger.start_attempt(job, host="local", bundle_sha="s" * 64)
    assert attempt.number == 1 and ledger.job(job).state == "ASSIGNED"
    assert ledger.transition(job, AttemptState.RUNNING, attempt=1)
    assert ledger.transition(job, JobState.RUNNING)
    assert not ledger.transition(job, JobState.RUNNING)  # idempotent, no event
    with pytest.raises(IllegalTransition, match="cannot go from RUNNING to QUEUED"):
        ledger.transition(job, JobState.QUEUED)
    ledger.transition(job, AttemptState.EXITED, attempt=1, message="exit 0")
    ledger.transition(job, JobState.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        ledger.transition(job, JobState.CANCELLED)
    changes = [(e.kind, e.old, e.new) for e in ledger.events(job)]
    assert changes == [
        ("job", "QUEUED", "ASSIGNED"), ("attempt", "", "STARTING"), ("attempt", "STARTING", "RUNNING"),
        ("job", "ASSIGNED", "RUNNING"), ("attempt", "RUNNING", "EXITED"), ("job", "RUNNING", "SUCCEEDED"),
    ]


@pytest.mark.parametrize("old", list(JobState))
@pytest.mark.parametrize("new", list(JobState))
def test_every_job_transition_follows_the_table(tmp_path: Path, old: JobState, new: JobState) -> None:
    ledger = Ledger(tmp_path / "l.db")
    job = _sweep(ledger, n=1)[0]
    with ledger.session() as s:  # put the row in ``old`` directly, bypassing the rules on purpose
        from orchestrator.ledger import Job

        row = s.get(Job, job)
        assert row is not None
        row.state = old.value
    if old == new:
        assert ledger.transition(job, new) is False
    elif new in JOB_ALLOWED[old]:
        assert ledger.transition(job, new) is True
        assert ledger.job(job).state == new.value
    else:
        with pytest.raises(IllegalTransition):
            ledger.transition(job, new)
        assert ledger.job(job).state == old.value


def test_attempt_table_terminal_states_have_no_exit() -> None:
    late = {AttemptState.EXITED, AttemptState.LOST}  # a spot preemption the provider reports a tick late
    for state in AttemptState:
        assert bool(ATTEMPT_ALLOWED[state]) != (state.terminal and state not in late)
    for state in late:
        assert ATTEMPT_ALLOWED[state] == {AttemptState.PREEMPTED}


def test_update_attempt_cannot_change_state(ledger: Ledger) -> None:
    job = _sweep(ledger, n=1)[0]
    ledger.start_attempt(job, host="local", bundle_sha="s")
    with pytest.raises(Exception, match=r"use Ledger\.transition"):
        ledger.update_attempt(job, 1, state="EXITED")


def test_resolve_job_references(ledger: Ledger) -> None:
    ids = _sweep(ledger)
    assert ledger.resolve_job(ids[0]).name == "job0"
    assert ledger.resolve_job("qaaaaaa:JOB1").id == ids[1]
    with pytest.raises(JobNotFound, match="at least 4"):
        ledger.resolve_job("c1")
    with pytest.raises(JobNotFound, match="no job matches"):
        ledger.resolve_job("cfffffffffff9")
    with pytest.raises(JobNotFound, match="no sweeps yet"):
        Ledger(ledger.path.parent / "other.db").resolve_sweep(None)


def test_results_replace_previous(ledger: Ledger) -> None:
    job = _sweep(ledger, n=1)[0]
    ledger.record_results(job, 1, metrics=[("final", "val_acc", 0.5, 10, 1)], artifacts=[("a", 1, "x")])
    ledger.record_results(job, 2, metrics=[("final", "val_acc", 0.9, 20, 2)], artifacts=[],
                          checkpoint=ResultCheckpoint(file="latest.pt", step=20, sha256="ab", bytes=3))
    assert [(m.attempt, m.value) for m in ledger.metrics([job])] == [(2, 0.9)]
    assert ledger.artifacts(job) == []
    assert [c.step for c in ledger.checkpoints(job)] == [20]


def test_migrated_schema_equals_the_tables(tmp_path: Path) -> None:
    """Migrations are frozen SQL; tables.py is the model.  They must describe the same columns."""
    import sqlite3

    from sqlmodel import SQLModel

    from orchestrator.ledger import tables  # noqa: F401
    from orchestrator.ledger.migrate import migrate

    conn = sqlite3.connect(str(tmp_path / "schema.db"), isolation_level=None)
    migrate(conn, "schema.db")
    for table in SQLModel.metadata.sorted_tables:
        have = {row[1]: (row[3], row[5]) for row in conn.execute(f"PRAGMA table_info({table.name})")}
        want = {c.name: (int(not c.nullable), int(c.primary_key)) for c in table.columns}
        assert set(have) == set(want), table.name
        for name, (notnull, pk) in want.items():
            assert have[name] == (notnull, pk), f"{table.name}.{name}"
    conn.close()


def test_repeated_conditions_are_recorded_once(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    for _ in range(5):  # a tick re-discovers the same condition every time
        ledger.record_event("job", "c1", "still queued: no usable host", unless_repeated=True)
    ledger.record_event("job", "c1", "still queued: host a is unreachable", unless_repeated=True)
    ledger.record_event("job", "c1", "still queued: no usable host", unless_repeated=True)
    assert [e.message for e in ledger.events(subject="c1")].count("still queued: no usable host") == 2
    assert len(ledger.events(subject="c1")) == 3


def _attempt_ending(ledger: Ledger, job: str, state: AttemptState, *, exit_code: int | None = None,
                    phase: str | None = None) -> None:
    """One attempt of ``job`` that ends in ``state``; the job is queued again afterwards."""
    number = ledger.start_attempt(job, host="h", bundle_sha="s" * 64).number
    ledger.update_attempt(job, number, exit_code=exit_code, phase=phase)
    ledger.transition(job, state, attempt=number)
    ledger.transition(job, JobState.LOST)
    ledger.transition(job, JobState.QUEUED)


def test_failed_attempts_counts_only_lost_and_nonzero_exits_outside_project_setup(ledger: Ledger) -> None:
    job = _sweep(ledger, n=1)[0]
    assert ledger.failed_attempts(job) == 0
    steps: list[tuple[AttemptState, int | None, str | None, int]] = [
        (AttemptState.EXITED, 1, None, 1),      # a non-zero exit counts
        (AttemptState.LOST, None, None, 2),     # so does a vanished attempt
        (AttemptState.EXITED, 0, None, 2),      # a clean exit does not
        (AttemptState.EXITED, None, None, 2),   # nor an exit with no code recorded
        (AttemptState.KILLED, None, None, 2),   # stolen (moved to another host)
        (AttemptState.PREEMPTED, None, None, 2),
        (AttemptState.EXITED, 3, "project_setup", 2),  # the host's project setup failed: the host is held
        (AttemptState.LOST, None, "project_setup", 2),
        (AttemptState.EXITED, 137, "train", 3),
    ]
    for state, code, phase, expected in steps:
        _attempt_ending(ledger, job, state, exit_code=code, phase=phase)
        assert ledger.failed_attempts(job) == expected, (state, code, phase)
    other = _sweep(ledger, sweep_id="qcccccc", n=2)[1]
    assert ledger.failed_attempts(other) == 0  # per job, not per ledger


def test_move_job_kills_the_unstarted_attempt_and_starts_the_next_on_the_new_host(ledger: Ledger) -> None:
    job = _sweep(ledger, n=1)[0]
    ledger.start_attempt(job, host="busy", bundle_sha="s" * 64, resume_from="ckpt/last.pt")
    moved = ledger.move_job(job, from_attempt=1, to_host="idle", bundle_sha="t" * 64, message="stolen by idle")
    assert (moved.number, moved.host, moved.state, moved.bundle_sha, moved.resume_from) == (
        2, "idle", AttemptState.STARTING.value, "t" * 64, "ckpt/last.pt")
    row = ledger.job(job)
    assert (row.state, row.host, row.attempt_count) == (JobState.ASSIGNED.value, "idle", 2)
    old = ledger.attempt(job, 1)
    assert old is not None and (old.state, old.message) == (AttemptState.KILLED.value, "stolen by idle")
    assert old.ended_at is not None


def test_move_job_refuses_a_stale_attempt_and_leaves_the_ledger_as_it_was(ledger: Ledger) -> None:
    job = _sweep(ledger, n=1)[0]
    ledger.start_attempt(job, host="busy", bundle_sha="s" * 64)
    ledger.move_job(job, from_attempt=1, to_host="idle", bundle_sha="s" * 64, message="stolen")
    before = [(a.number, a.host, a.state) for a in ledger.attempts(job)]
    # a second mover acting on what it read before the first move: attempt 1 is no longer current
    stale = r"^job .*: cannot go from ASSIGNED to moved \(attempt 1 is not current\)$"
    with pytest.raises(IllegalTransition, match=stale):
        ledger.move_job(job, from_attempt=1, to_host="third", bundle_sha="s" * 64, message="stolen again")
    assert [(a.number, a.host, a.state) for a in ledger.attempts(job)] == before
    assert (ledger.job(job).host, ledger.job(job).attempt_count) == ("idle", 2)
    with pytest.raises(JobNotFound, match=r"^no attempt 7 of job "):
        ledger.move_job(job, from_attempt=7, to_host="third", bundle_sha="s" * 64, message="x")
    # a job the busy host claimed meanwhile (RUNNING) stays where it is
    ledger.transition(job, AttemptState.RUNNING, attempt=2)
    ledger.transition(job, JobState.RUNNING)
    with pytest.raises(IllegalTransition, match=r"cannot go from RUNNING to moved \(attempt 2 is not current\)$"):
        ledger.move_job(job, from_attempt=2, to_host="third", bundle_sha="s" * 64, message="x")
    assert ledger.job(job).host == "idle" and len(ledger.attempts(job)) == 2
