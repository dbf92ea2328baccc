"""`gpuq results` reads each table once for the whole sweep, and `Ledger.events(subject=…)` reads a range of
the subject index instead of scanning the table (docs/performance.md, "Results and report").

Both must answer exactly what they answered before: a varied sweep (several attempts, preempted and lost
ones, failed and succeeded jobs, final/best metrics with a name repeated, checkpoints, from-scratch
findings beyond the newest 200 events, multi-GPU and multi-node jobs, CPU slots, priced hosts, pulls) is
read by ``results`` and by the per-job algorithm it replaced, kept here as the oracle; events are compared
with the ``LIKE`` prefix query they replaced, run on the same SQLite file.
"""

from __future__ import annotations

import gc
import sqlite3
import time
from pathlib import Path

import pytest

from orchestrator import transfer
from orchestrator.api.jobs import ResultRow, collect_missing, cpu_slots, results
from orchestrator.context import Context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health import observed
from orchestrator.host_documents import Provenance, ResultCheckpoint
from orchestrator.ledger import HostRow, Ledger
from orchestrator.money.cost import job_cost
from orchestrator.tick.findings import FROM_SCRATCH

SWEEP = "qscale1"
T0 = 1_700_000_000.0
GPU = Provenance(slot_kind="gpu", gpu_model="NVIDIA H100", gpu_count=2, torch="2.4").stored()
CPU = Provenance(slot_kind="cpu", torch="2.4").stored()


def _attempt(ledger: Ledger, job: str, host: str, end: AttemptState, *, n: int, peers: tuple[str, ...] = (),
             provenance: str = "", ckpt: bool = False, last: bool = False) -> None:
    """One attempt that started and ended (``end``); the job is queued again unless it exited or
    this is its ``last`` (it is left LOST)."""
    ledger.start_attempt(job, host=host, bundle_sha="s", peers=peers)
    start = T0 + 1000 * n
    ledger.update_attempt(job, n, started_at=start, ended_at=start + 600, heartbeat_at=start + 500,
                          provenance=provenance)
    ledger.transition(job, AttemptState.RUNNING, attempt=n)
    ledger.transition(job, JobState.RUNNING)
    if ckpt:
        ledger.record_checkpoint(job, n, ResultCheckpoint.model_validate(
            {"file": f"e{n}.pt", "step": 10 * n, "sha256": f"{n:x}" * 64, "bytes": 10, "written_at": start + 200}))
    if end == AttemptState.EXITED:
        ledger.transition(job, end, attempt=n)
    elif last:
        ledger.transition(job, end, attempt=n)
        ledger.transition(job, JobState.LOST)
    else:
        ledger.requeue(job, message="gone", end_attempt=end,
                       via=JobState.PREEMPTED if end == AttemptState.PREEMPTED else JobState.LOST)


def build(ctx: Context, tmp_path: Path, jobs: int = 24) -> list[str]:
    """A sweep of ``jobs`` jobs, each of a different mix (see the module's docstring); returns their ids."""
    led = ctx.ledger
    led.add_host(HostRow(name="gpu1", kind="ssh", target="x", root="/r", slots_kind="gpu", slots_total=8,
                         gpu_count=8, price_per_hour=16.0))
    led.add_host(HostRow(name="cpu1", kind="ssh", target="y", root="/r", slots_kind="cpu", slots_total=4))
    specs = [JobSpec(name=f"cell{i % 6}-seed{i // 6}", config="c.yaml", task="classify", config_sha256="0" * 64,
                     line=i + 1, gpus=2 if i % 5 == 1 else 1, nodes=2 if i % 7 == 3 else 1, cell=f"cell{i % 6}",
                     seed=i // 6)
             for i in range(jobs)]
    rows = led.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                         default_retries=3, run='{"metric": "loss", "mode": "min"}', git=("abc123", True))
    gone: list[str] = []
    for i, job in enumerate(rows):
        kind = i % 8
        host = "cpu1" if i % 3 == 2 else "gpu1"
        n = 0
        if kind == 0:
            continue  # still queued: no attempt, no metrics
        ends = {2: [AttemptState.PREEMPTED], 6: [AttemptState.PREEMPTED], 3: [AttemptState.LOST] * 3}.get(kind, [])
        for k, end in enumerate(ends):
            n += 1
            _attempt(led, job.id, host, end, n=n, provenance=CPU if host == "cpu1" else "", ckpt=kind != 6,
                     last=kind == 3 and k == len(ends) - 1)
            if n > 1 or kind == 6:
                led.record_finding("job", job.id, severity="escalate", rule=FROM_SCRATCH,
                                   message=f"{job.name} a{n + 1}: restarted from scratch")
        if kind == 3:
            led.transition(job.id, JobState.FAILED, message="lost three times")
            continue
        n += 1
        if kind == 4:  # still running: its hours run to now
            led.start_attempt(job.id, host=host, bundle_sha="s")
            led.update_attempt(job.id, n, started_at=T0 + 1000 * n, provenance=GPU)
            continue
        _attempt(led, job.id, host, AttemptState.EXITED, n=n, peers=("gpu2",) if job.nodes > 1 else (),
                 provenance=GPU if host == "gpu1" else CPU, ckpt=True)
        if kind == 5:
            led.transition(job.id, JobState.FAILED, message="exit 1")
            continue
        led.transition(job.id, JobState.SUCCEEDED)
        if kind == 7 and i % 2:  # succeeded on a host that is gone, never collected: its warning says why
            led.record_finding("job", job.id, severity="warn", rule=observed.METRICS_RULE,
                               message=f"{job.name}: succeeded, but no value of loss was found",
                               reason="no value of loss was found")
            gone.append(job.id)
            continue
        led.record_results(job.id, n, metrics=[
            ("final", "loss", 0.5 + i / 100, 100, 3), ("final", "acc", 0.1 * (i % 10), 100, 3),
            ("final", "loss", 0.4 + i / 100, 110, 3),  # a name written twice: the later value stands
            ("best", "loss", 0.3 + i / 100, 90, 2), ("curve", "loss", 1.0, 10, None)], artifacts=[])
        if i % 8 == 1:  # pulled: the verified copy is there, or was deleted since
            local = tmp_path / "pulled" / job.id
            if i % 16 == 1:
                local.mkdir(parents=True)
                (local / transfer.PULL_VERIFIED).write_text("{}")
            led.record_pull(job.id, attempt=n, host=host, state="verified", local_dir=str(local))
    # the newest 200 events of a job decide its from-scratch count (as `events(job)` always read them):
    # a job whose from-scratch findings are older than its newest 200 events counts none of them
    noisy = rows[6].id
    with sqlite3.connect(led.path) as raw:  # (one write: 205 record_event calls would take seconds)
        raw.executemany("INSERT INTO event (time, kind, subject, old, new, message, severity, rule, action) "
                        "VALUES (?, 'attempt', ?, '', '', ?, '', '', '')",
                        [(T0 + 9000 + k, f"{noisy}/a1", f"progress {k}") for k in range(205)])
        raw.executemany("UPDATE job SET host = 'gone' WHERE id = ?", [(job,) for job in gone])
    return [job.id for job in rows]


def _like_events(path: Path, subject: str, limit: int = 200) -> list[tuple[int, str, str]]:
    """(id, subject, rule) of ``events(subject, limit)`` as the ledger read them before: a LIKE prefix
    (escaped as SQLAlchemy's ``startswith(autoescape=True)`` did), of the subjects whose case matches
    too (LIKE ignores ASCII case; ids and names are matched as written now)."""
    pattern = subject.replace("/", "//").replace("%", "/%").replace("_", "/_")
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT id, subject, rule FROM event WHERE subject LIKE ? || '%' ESCAPE '/' "
                           "AND substr(subject, 1, ?) = ? ORDER BY id DESC LIMIT ?",
                           (pattern, len(subject), subject, limit)).fetchall()
    return rows[::-1]


def oracle(ctx: Context, sweep_id: str) -> list[ResultRow]:
    """The per-job algorithm ``results`` replaced (every job scanned every metric and attempt, and read
    its own checkpoints and events), the events read as they were (LIKE prefix)."""
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    errors = collect_missing(ctx, jobs)
    metrics = ctx.ledger.metrics(j.id for j in jobs)
    every = ctx.ledger.attempts_of(j.id for j in jobs)
    latest = {a.job_id: a for a in every}
    verified = ctx.ledger.verified_jobs(sweep_id)
    sweep_row = ctx.ledger.sweep(sweep_id)
    metric, mode = observed.headline(sweep_row.run_config() if sweep_row is not None else None)
    git = (sweep_row.git_commit, sweep_row.git_dirty) if sweep_row is not None else ("", None)
    on_cpu = cpu_slots(ctx)
    warned = ctx.ledger.open_findings(j.id for j in jobs)
    for job in jobs:
        event = warned.get((job.id, observed.METRICS_RULE))
        if event is not None and job.id not in errors:
            errors[job.id] = event.reason
    now = time.time()
    rows = []
    for job in jobs:
        final = {m.name: m.value for m in metrics if m.job_id == job.id and m.scope == "final"}
        best = {m.name: m.value for m in metrics if m.job_id == job.id and m.scope == "best"}
        newest = latest.get(job.id)
        entry = ResultRow(job, final, best, newest, metric=metric, mode=mode, error=errors.get(job.id, ""),
                          provenance=Provenance.from_stored(newest.provenance) if newest is not None else None,
                          git=git)
        entry.cost = job_cost(job.gpus * job.nodes, [a for a in every if a.job_id == job.id],
                              ctx.ledger.checkpoints(job.id), now, on_cpu)
        entry.restarts_from_scratch = sum(1 for e in _like_events(ctx.ledger.path, job.id) if e[2] == FROM_SCRATCH)
        mark = verified.get(job.id)
        if mark is not None:
            present = (Path(mark.local_dir) / transfer.PULL_VERIFIED).is_file()
            entry.pulled, entry.local_dir = ("verified" if present else "missing"), mark.local_dir
        rows.append(entry)
    return rows


def _view(row: ResultRow) -> tuple[object, ...]:
    att = row.attempt
    return (row.job.id, row.job.state, list(row.final.items()), list(row.best.items()),
            None if att is None else (att.job_id, att.number, att.state), row.pulled, row.local_dir, row.cost,
            row.metric, row.mode, row.error, row.provenance, row.git, row.restarts_from_scratch)


def test_results_rows_equal_the_per_job_algorithm(ctx: Context, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ids = build(ctx, tmp_path)
    monkeypatch.setattr(time, "time", lambda: T0 + 50_000)  # a running attempt's hours run to "now": the same now
    got = [_view(r) for r in results(ctx, sweep=SWEEP)]
    want = [_view(r) for r in oracle(ctx, SWEEP)]
    assert got == want
    assert gc.isenabled()  # paused only while the rows were read
    # the sweep is as varied as the docstring says (else the comparison proves little)
    rows = {r.job.id: r for r in results(ctx, sweep=SWEEP)}
    assert {r.job.state for r in rows.values()} >= {"QUEUED", "ASSIGNED", "SUCCEEDED", "FAILED"}
    assert any(r.cost and r.cost.preemptions for r in rows.values())
    assert any(r.cost and r.cost.lost_gpu_hours for r in rows.values())
    assert any(r.cost and r.cost.cpu_hours for r in rows.values())
    assert any(r.cost and r.cost.cost for r in rows.values())
    assert {r.restarts_from_scratch for r in rows.values()} >= {0, 1, 2}
    assert rows[ids[6]].restarts_from_scratch == 0  # its finding is older than its newest 200 events
    assert {r.pulled for r in rows.values()} == {"", "verified", "missing"}
    assert any(r.error for r in rows.values()) and any(r.provenance for r in rows.values())
    assert any(list(r.final.items()) == [("loss", 0.4 + i / 100), ("acc", 0.1 * (i % 10))]
               for i, r in enumerate(rows.values()))


SUBJECTS = ["c1", "c12", "c1/a1", "c1/a2", "C1", "c1x", "h_1", "hx1", "h%", "h%2", "a/b", "a//b", "gpu1",
            "gpu10", "ü", "üb", "a\ud7ff", "a\ud7ffz", "a\ue000", "z\U0010ffff", "z\U0010ffffq", "{"]


@pytest.fixture
def events_ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path / "events.db")
    for k in range(3):
        for subject in SUBJECTS:
            ledger.record_event("job", subject, f"{subject} {k}")
            if k == 1:
                ledger.record_finding("job", subject, severity="warn", rule="r", message="found")
    return ledger


@pytest.mark.parametrize("limit", [1, 4, 200])
def test_events_read_what_the_like_prefix_read(events_ledger: Ledger, limit: int) -> None:
    for prefix in [*SUBJECTS, "c", "h", "h_", "h%", "a/", "z", "z\U0010ffff", "a\ud7ff", "gpu", "x"]:
        got = [(e.id, e.subject, e.rule) for e in events_ledger.events(prefix, limit=limit)]
        assert got == _like_events(events_ledger.path, prefix, limit), prefix
        assert all(subject.startswith(prefix) for _, subject, _ in got)
    every = events_ledger.events(limit=1000)
    assert [e.id for e in events_ledger.events("", limit=1000)] == [e.id for e in every]


def test_a_job_reads_its_own_events_and_its_attempts_not_another_jobs(events_ledger: Ledger) -> None:
    mine = {e.subject for e in events_ledger.events("c1/a1")}
    assert mine == {"c1/a1"}
    job_ids = [f"c{n:012x}" for n in (1, 2)]  # ids of one length: none is another's prefix
    for job in job_ids:
        events_ledger.record_event("job", job, "placed")
        events_ledger.record_event("attempt", f"{job}/a1", "started")
    assert {e.subject for e in events_ledger.events(job_ids[0])} == {job_ids[0], f"{job_ids[0]}/a1"}


def test_events_of_many_subjects_are_each_subjects_events(events_ledger: Ledger) -> None:
    wanted = [*SUBJECTS, "c", "h_", "nothing"]
    for limit in (1, 2, 200):
        many = events_ledger.events_of(wanted, limit=limit)
        assert {s: [e.id for e in rows] for s, rows in many.items()} == {
            s: [e.id for e in events_ledger.events(s, limit)] for s in wanted if events_ledger.events(s, limit)}
        counts = events_ledger.rule_counts(wanted, "r", limit)
        assert counts == {s: n for s in wanted
                          if (n := sum(e.rule == "r" for e in events_ledger.events(s, limit)))}
    assert events_ledger.events_of([]) == {} and events_ledger.rule_counts([], "r") == {}


def test_batched_checkpoints_and_metrics_are_the_per_job_reads(ctx: Context, tmp_path: Path) -> None:
    ids = build(ctx, tmp_path, jobs=16)
    led = ctx.ledger
    assert led.checkpoints_of(ids) == {j: led.checkpoints(j) for j in ids if led.checkpoints(j)}
    by_job = sorted(led.metric_values(ids), key=lambda row: row[0])  # stable: each job's rows in their order
    assert by_job == [(m.job_id, m.scope, m.name, m.value, m.step) for j in sorted(ids) for m in led.metrics([j])]
    curves = sorted(led.metric_values(ids, ("curve",), names=["loss"]), key=lambda row: row[0])
    assert curves == [(m.job_id, m.scope, m.name, m.value, m.step) for j in sorted(ids)
                      for m in led.metrics([j], ("curve",))] != []
    assert [row for row in led.metric_values(ids, names=["acc"])] == [
        row for row in led.metric_values(ids) if row[2] == "acc"] != []
    assert led.with_metrics(ids) == {m.job_id for m in led.metrics(ids)} != set()


def test_a_v10_ledger_gains_the_metric_index_and_keeps_its_rows(tmp_path: Path) -> None:
    from orchestrator.ledger.migrate import MIGRATIONS

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for number, step in enumerate(MIGRATIONS[:10], start=1):
        step(conn)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.execute("INSERT INTO sweep (id, queue_path, workdir, queue_text, bundle_sha, job_count, created_at) "
                 "VALUES ('qold000', 'q', '/w', '', '', 1, 0)")
    conn.execute("INSERT INTO job (id, sweep_id, name, line, raw, config, config_sha256, task, epochs, gpus, nodes, "
                 "retries, spec_hash, state, attempt_count, created_at, updated_at) VALUES ('c1', 'qold000', 'a', 1, "
                 "'', 'a.yaml', '', 't', 1, 1, 1, 0, '', 'SUCCEEDED', 1, 0, 0)")
    conn.executemany("INSERT INTO metric (job_id, attempt, scope, name, value, step) VALUES ('c1', 1, ?, ?, ?, ?)",
                     [("final", "acc", 0.5, 10), ("curve", "acc", 0.1, 1), ("best", "acc", 0.6, 8)])
    conn.close()
    ledger = Ledger(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 11
        assert ("ix_metric_job_id_scope",) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        plan = " ".join(str(row) for row in raw.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM metric WHERE job_id = 'c1' AND scope = 'final'"))
    assert "ix_metric_job_id_scope" in plan
    assert ledger.metric_values(["c1"]) == [("c1", "final", "acc", 0.5, 10), ("c1", "best", "acc", 0.6, 8)]
    assert ledger.with_metrics(["c1", "c2"]) == {"c1"}
