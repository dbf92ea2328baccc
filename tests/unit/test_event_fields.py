"""An event's failure class, a finding's reason and the attempt it speaks of are fields (ledger v15), set
where the event is written and read as fields: `gpuq explain` and `gpuq report` find a class and a
decision whatever the words say.  Older events get them from their words once, in the migration,
"unknown" where a finding's words do not say."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from orchestrator.api.explaining import stories
from orchestrator.context import Context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health import patrol
from orchestrator.ledger import Ledger
from orchestrator.ledger.migrate import MIGRATIONS
from orchestrator.tick.findings import TickReport, record
from orchestrator.tick.settle import settle


def _ran(ctx: Context, name: str = "a", retries: int = 2) -> str:
    (job,) = ctx.ledger.add_sweep(sweep_id="qevents", queue_path="q.txt", workdir="/w", queue_text="",
                                  jobs=[JobSpec(name=name, config="c.yaml", task="t", epochs=1, retries=retries)],
                                  default_retries=retries)
    ctx.ledger.start_attempt(job.id, host="local", bundle_sha="s")
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job.id, JobState.RUNNING)
    ctx.ledger.update_attempt(job.id, 1, exit_code=1, message="exit 1: CUDA out of memory")
    ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    return job.id


def test_explain_reads_the_class_decision_and_attempt_from_fields(ctx: Context) -> None:
    job_id = _ran(ctx)
    job = ctx.ledger.job(job_id)
    decision = settle(ctx.ledger, job_id, "transient", ctx.settings, attempt=1)
    ended = patrol.ended_badly("local", patrol.JobView(job_id, "a", 1), "failed", "transient", decision,
                               requeued=True, message="exit 1: CUDA out of memory")
    record(ctx, [ended], subjects=[], report=TickReport())
    ctx.ledger.start_attempt(job_id, host="local", bundle_sha="s")  # attempt 2: "attempt 2 on local"
    first, second = stories(ctx, ctx.ledger.job(job_id))
    assert (first.klass, first.decision) == ("transient", decision.reason) and decision.action == "requeue"
    assert [e.rule for e in first.evidence] == ["failed"] and second.evidence == []
    (found,) = [e for e in ctx.ledger.events(job.id) if e.rule == "failed"]
    assert (found.failure_class, found.attempt, found.reason) == ("transient", 1, "exit 1: CUDA out of memory")
    (assigned,) = [e for e in ctx.ledger.events(job.id) if e.new == JobState.ASSIGNED.value and e.attempt == 2]
    assert assigned.message == "attempt 2 on local"


def test_the_words_say_nothing_a_reader_takes(ctx: Context) -> None:
    job_id = _ran(ctx, retries=0)
    ctx.ledger.record_finding("job", job_id, severity="warn", rule="failed", message="a a1: gone (class: oom)",
                              attempt=1)  # a class in the words only: no class
    ctx.ledger.transition(job_id, JobState.FAILED, message="we gave up on this one", failure_class="config")
    (story,) = stories(ctx, ctx.ledger.job(job_id))
    assert (story.klass, story.decision) == ("config", "we gave up on this one")


def _v14(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for number, step in enumerate(MIGRATIONS[:14], start=1):
        step(conn)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.execute("INSERT INTO sweep (id, queue_path, workdir, queue_text, bundle_sha, job_count, created_at) "
                 "VALUES ('qold000', 'q', '/w', '', '', 1, 0)")
    conn.execute("INSERT INTO job (id, sweep_id, name, line, raw, config, config_sha256, task, epochs, gpus, nodes, "
                 "retries, spec_hash, state, attempt_count, created_at, updated_at) VALUES ('c1', 'qold000', "
                 "'lr-1', 1, '', 'a.yaml', '', 't', 1, 1, 1, 0, '', 'FAILED', 3, 0, 0)")
    return conn


OLD_EVENTS = [  # (kind, subject, new, rule, severity, message) -> (failure_class, reason, attempt)
    (("job", "c1", "ASSIGNED", "", "", "attempt 3 on gpu1"), ("", "", 3)),
    (("job", "c1", "QUEUED", "", "", "transient: requeued with resume (retry 1 of 2)"), ("transient", "", None)),
    (("job", "c1", "FAILED", "", "", "config error: never retried (fix it and submit again)"), ("config", "", None)),
    (("job", "c1", "LOST", "", "", "stalled: killed group of attempt 2 (killed)"), ("stalled", "", None)),
    (("job", "c1", "CANCELLED", "", "", "cancelled by the user"), ("", "", None)),
    (("job", "c1", "", "failed", "escalate", "lr-1 a2: exit 1 (class: gpu_oom)"), ("gpu_oom", "", 2)),
    (("job", "c1", "", "dead", "warn", "lr-1 lost its group"), ("unknown", "", None)),
    (("job", "c1", "", "metrics_missing", "warn", "lr-1: succeeded, but [run] metrics = 'm.csv' matched no file"),
     ("", "[run] metrics = 'm.csv' matched no file", None)),
    (("job", "c1", "", "metrics_missing", "warn", "no metric"), ("", "unknown", None)),
    (("job", "c1", "", "stalled", "escalate", "lr-1 a1: stalled: heartbeat never"), ("", "", 1)),
    (("host", "gpu1", "", "disk", "warn", "lr-1 a1: disk 95% full"), ("", "", None)),
]


def test_v15_reads_older_events_words_once(tmp_path: Path) -> None:
    conn = _v14(tmp_path / "ledger.db")
    for (kind, subject, new, rule, severity, message), _ in OLD_EVENTS:
        conn.execute("INSERT INTO event (time, kind, subject, old, new, message, severity, rule, action) "
                     "VALUES (0, ?, ?, '', ?, ?, ?, ?, '')", (kind, subject, new, message, severity, rule))
    conn.close()
    ledger = Ledger(tmp_path / "ledger.db")  # migrates
    got = [(e.failure_class, e.reason, e.attempt) for e in ledger.events("", limit=100)]
    assert got == [want for _, want in OLD_EVENTS]
