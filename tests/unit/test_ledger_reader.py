"""The ledger's read path without the ORM (orchestrator/ledger/reader.py) answers every read of a ledger-only
snapshot exactly as the Ledger does on the same file: the same rows in the same order, every column with the
same value and Python type, the same row methods; a whole ``ledger_status`` snapshot equal; one read
snapshot while a writer goes on; and it refuses a ledger it cannot read as it is, so the command opens the
Ledger instead.  ``gpuq status --no-probe`` takes it and loads no ORM."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.snapshot import ledger_status
from orchestrator.cli.ctx import open_reader
from orchestrator.context import Context, open_context
from orchestrator.core.errors import JobNotFound
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, HoldChange, HoldKind, JobState, LeaseState
from orchestrator.ledger import HostRow, Ledger
from orchestrator.ledger.migrate import SCHEMA_VERSION
from orchestrator.ledger.reader import LedgerReader, ReaderUnavailable, record_columns
from tests.support.rented import add_rented

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0


def _fill(ledger: Ledger) -> None:
    """Rows of every kind a snapshot reads, with the values that differ between SQLite and Python (booleans,
    None, floats, JSON, odd characters in ids)."""
    ledger.ensure_host("gpu-a", kind="ssh", root="/r", target="a")
    ledger.update_host("gpu-a", price_per_hour=2.5, gpu_count=4, spot=True, down_when_done=False, slots_total=4,
                       health="pass", disk_free_bytes=123_456_789, unreachable_since=T0)
    ledger.ensure_host("gpu-b", kind="ssh", root="/r", target="b")
    ledger.change_hold("gpu-b", HoldChange(HoldKind.DISK, "97% used"), slots_total=2, spot=False)
    specs = [JobSpec(name=f"cell{i}", config="c.yaml", task="t", epochs=3, est_min=[None, 1.5, 2.0][i % 3],
                     seed=i if i % 2 else None, args=["--lr", str(i)]) for i in range(7)]
    ledger.add_sweep(sweep_id="q_b%0001", queue_path="q.txt", workdir="/w", queue_text="x", jobs=specs[:4],
                     default_retries=1, bundle_sha="b" * 64, hosts=["gpu-a", "gpu-b"], git=("abc", True),
                     budget_usd=10.0, run=json.dumps({"command": ["t.py", "{args}"], "metric": "loss", "mode": "min",
                                                      "data": {"d": {"tree": "d" * 64, "file": "x.bin"}}}))
    jobs = ledger.add_sweep(sweep_id="qb000002", queue_path="q2.txt", workdir="/w", queue_text="y",
                            jobs=specs[4:], default_retries=0, git=("", None))
    first = ledger.jobs(sweep_id="q_b%0001")
    for n, job in enumerate(first[:3]):
        ledger.start_attempt(job.id, host="gpu-a", bundle_sha="s")
        ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
        ledger.transition(job.id, JobState.RUNNING)
        ledger.update_attempt(job.id, 1, started_at=T0 + n, step=10 * n, loss=0.5 / (n + 1),
                              nodes=json.dumps(["gpu-a", "gpu-b"]) if n == 1 else "")
        if n == 0:
            ledger.update_attempt(job.id, 1, ended_at=T0 + 100, exit_code=0)
            ledger.transition(job.id, AttemptState.EXITED, attempt=1)
            ledger.transition(job.id, JobState.SUCCEEDED)
    ledger.start_attempt(jobs[0].id, host="gpu-b", bundle_sha="s")
    ledger.record_finding("host", "gpu-b", severity="warn", rule="disk", message="disk 95% full", action="free it",
                          at=T0 - 100)
    ledger.record_finding("job", first[1].id, severity="escalate", rule="stall", message="no step for 600 s", at=T0)


@pytest.fixture
def ctx(gpuq_home: Path) -> Iterator[Context]:
    context = open_context()
    try:
        _fill(context.ledger)
        yield context
    finally:
        context.close()


@pytest.fixture
def reader(ctx: Context) -> Iterator[LedgerReader]:
    found = LedgerReader(ctx.settings.ledger_path)
    try:
        yield found
    finally:
        found.close()


def _columns(row: Any) -> dict[str, Any]:
    return {name: getattr(row, name) for name in type(row).model_fields}


def _same_rows(orm: list[Any], read: list[Any]) -> None:
    assert len(orm) == len(read) and orm
    for a, b in zip(orm, read, strict=True):
        want = _columns(a)
        assert set(record_columns(b)) == set(want), type(a).__name__  # every column, none more
        for name, value in want.items():
            got = getattr(b, name)
            assert (type(got), got) == (type(value), value), (type(a).__name__, name)


def test_every_read_answers_as_the_ledger_does(ctx: Context, reader: LedgerReader) -> None:
    ledger = ctx.ledger
    _same_rows(ledger.hosts(), reader.hosts())
    _same_rows(ledger.sweeps(), reader.sweeps())
    _same_rows(ledger.sweep_parts(), reader.sweep_parts())
    assert [(p.number, p.job_count) for p in reader.sweep_parts()][:1] == [(1, ledger.sweeps()[0].job_count)]
    _same_rows(ledger.jobs(), reader.jobs())
    for sweep in ledger.sweeps():
        _same_rows(ledger.jobs(sweep_id=sweep.id), reader.jobs(sweep_id=sweep.id))
        assert reader.sweeps()[0].host_set() == ledger.sweeps()[0].host_set() == {"gpu-a", "gpu-b"}
    running = [JobState.RUNNING, JobState.ASSIGNED]
    _same_rows(ledger.jobs(states=running), reader.jobs(states=running))
    assert reader.jobs(states=[]) == ledger.jobs(states=[]) == []
    assert [j.arg_list() for j in reader.jobs()] == [j.arg_list() for j in ledger.jobs()]
    runs = [s.run_config() for s in reader.sweeps()]
    assert runs == [s.run_config() for s in ledger.sweeps()]
    assert runs[0] is not None and (runs[0].command, runs[0].mode, runs[0].data["d"].file) == (("t.py", "{args}"),
                                                                                                 "min", "x.bin")
    assert runs[1] is None  # a sweep without [run]
    ids = [j.id for j in ledger.jobs()]
    _same_rows(ledger.attempts_of(ids), reader.attempts_of(ids))
    assert [a.node_hosts() for a in reader.attempts_of(ids)] == [a.node_hosts() for a in ledger.attempts_of(ids)]
    assert any(a.node_hosts() for a in reader.attempts_of(ids))
    _same_rows(ledger.alerts(), reader.alerts())
    _same_rows(ledger.alerts(1), reader.alerts(1))
    assert len(reader.alerts(since=T0 - 1)) == 1  # the host finding is older
    _same_rows(ledger.alerts(since=T0 - 1), reader.alerts(since=T0 - 1))
    assert reader.state_counts() == ledger.state_counts()
    sweeps = [s.id for s in ledger.sweeps()]
    assert reader.priced_attempts(sweeps) == ledger.priced_attempts(sweeps) != {}
    assert reader.run_history() == ledger.run_history() != []


def test_a_hosts_lease_and_hold_read_as_the_ledger_reads_them(ctx: Context) -> None:
    """The row methods on both paths: a rented host's lease, a hold's kind and its line for people."""
    add_rented(ctx.ledger, HostRow(name="rp-c", kind="ssh", target="root@c", root="/r", provider="runpod",
                                   instance_id="pod-c", lease_state="preempted", lease_reason="Outbid"))
    ctx.ledger.change_hold("rp-c", HoldChange(HoldKind.REPLACED, "lease preempted, by rp-d"))
    reader = LedgerReader(ctx.settings.ledger_path)
    try:
        _same_rows(ctx.ledger.hosts(), reader.hosts())
        leases = [(h.name, h.lease, h.hold, h.held, h.hold_text) for h in ctx.ledger.hosts()]
        assert [(h.name, h.lease, h.hold, h.held, h.hold_text) for h in reader.hosts()] == leases
    finally:
        reader.close()
    assert leases == [("gpu-a", LeaseState.NONE, HoldKind.NONE, False, ""),
                      ("gpu-b", LeaseState.NONE, HoldKind.DISK, True, "disk: 97% used"),
                      ("rp-c", LeaseState.PREEMPTED, HoldKind.REPLACED, True, "replaced: lease preempted, by rp-d")]


@pytest.mark.parametrize("ref", [None, "q_b", "Q_B", "qb0", "q", "q_", "q%", "qb%", "nope", "qb000002"])
def test_sweep_references_resolve_as_the_ledger_resolves_them(ctx: Context, reader: LedgerReader,
                                                              ref: str | None) -> None:
    """Prefixes with SQL wildcards match only themselves (``q%`` is no prefix of ``qb000002``)."""
    def answer(source: Any) -> Any:
        try:
            found = source.resolve_sweep(ref)
            return _columns(found) if source is ctx.ledger else record_columns(found)
        except JobNotFound as exc:
            return str(exc)

    assert answer(reader) == answer(ctx.ledger)


@pytest.mark.parametrize("shown", [{}, {"all_jobs": True}, {"sweep": "qb0"}, {"states": (JobState.QUEUED,)}])
def test_a_ledger_only_snapshot_is_the_same_either_way(ctx: Context, reader: LedgerReader,
                                                       shown: dict[str, Any]) -> None:
    orm, read = ledger_status(ctx.ledger, **shown), ledger_status(reader, **shown)
    assert [j.id for j in read.jobs] == [j.id for j in orm.jobs] != []
    assert {k: record_columns(v) for k, v in read.attempts.items()} == {k: _columns(v) for k, v in orm.attempts.items()}
    assert read.counts == orm.counts and read.budgets == orm.budgets
    assert [record_columns(e) for e in read.alerts] == [_columns(e) for e in orm.alerts]
    assert {k: [a.id for a in v] for k, v in read.attempt_history.items()} == \
        {k: [a.id for a in v] for k, v in orm.attempt_history.items()}


def test_the_reader_reads_one_snapshot_and_writes_nothing(ctx: Context, reader: LedgerReader) -> None:
    before = reader.state_counts()
    job = ctx.ledger.jobs(states=[JobState.QUEUED])[0]
    ctx.ledger.transition(job.id, JobState.CANCELLED)  # a writer goes on while the reader holds its snapshot
    assert reader.state_counts() == before != ctx.ledger.state_counts()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._conn.execute("UPDATE job SET state = 'QUEUED'")


def test_a_ledger_it_cannot_read_as_it_is_is_left_to_the_ledger(gpuq_home: Path, tmp_path: Path) -> None:
    with pytest.raises(ReaderUnavailable, match="no ledger yet"):
        LedgerReader(tmp_path / "none.db")
    assert open_reader() is None  # no ledger under GPUQ_HOME yet: `gpuq status` opens (creates) it
    ctx = open_context()
    ctx.ledger.ensure_host("gpu-a", kind="ssh", root="/r")
    path = ctx.settings.ledger_path
    ctx.close()
    found = open_reader()
    assert found is not None
    found.close()
    older = tmp_path / "older.db"
    conn = sqlite3.connect(older)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    conn.close()
    with pytest.raises(ReaderUnavailable, match=f"schema v{SCHEMA_VERSION - 1}, this gpuq reads v{SCHEMA_VERSION}"):
        LedgerReader(older)  # the Ledger migrates it first
    ledger = Ledger(path)
    ledger.update_host("gpu-a", provider="runpod", instance_id="pod1")
    ledger.close()
    assert open_reader() is None  # a rented host: its idle time is the billing stage's


def test_status_no_probe_answers_without_the_orm(ctx: Context) -> None:
    code = ("import sys; from orchestrator.cli.main import main\n"
            "try:\n    main(['status', '--once', '--no-probe'])\n"
            "finally:\n"
            "    print('ORM' if {'sqlalchemy', 'sqlmodel'} & set(sys.modules) else 'no ORM', file=sys.stderr)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "COLUMNS": "200"}, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip().splitlines()[-1] == "no ORM"
    for job in ctx.ledger.jobs(sweep_id="qb000002"):  # the unfinished sweeps' jobs are listed
        assert job.id[:13] in run.stdout


def test_the_ledger_package_reexports_each_name_from_its_home_on_first_use() -> None:
    import importlib

    from orchestrator import ledger

    assert sorted(ledger.__all__) == sorted(ledger._HOME)
    for name in ledger.__all__:
        assert getattr(ledger, name) is getattr(importlib.import_module(ledger._HOME[name]), name), name


def test_a_sweep_submitted_between_the_ledgers_reads_is_left_to_the_next_snapshot(ctx: Context) -> None:
    """The Ledger reads each table in a transaction of its own: a submit that lands after the sweeps were
    read and before the jobs are is not half in the snapshot (it was a KeyError under concurrent submits)."""
    ledger = ctx.ledger

    class SubmitMeanwhile:
        def __getattr__(self, name: str) -> Any:
            return getattr(ledger, name)

        def jobs(self, **kwargs: Any) -> Any:
            if not any(s.id == "qlate001" for s in ledger.sweeps()):
                ledger.add_sweep(sweep_id="qlate001", queue_path="late.txt", workdir="/w", queue_text="",
                                 jobs=[JobSpec(name="late", config="c.yaml", task="t", epochs=1)], default_retries=0)
            return ledger.jobs(**kwargs)

    snap = ledger_status(SubmitMeanwhile(), all_jobs=True)
    assert snap.jobs and all(j.sweep_id != "qlate001" for j in snap.jobs)
    assert {j.sweep_id for j in snap.jobs} == {s.id for s in snap.sweeps} - {"qlate001"}
    assert "qlate001" in {j.sweep_id for j in ledger_status(ledger, all_jobs=True).jobs}  # the next one has it
