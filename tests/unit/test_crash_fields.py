"""A crash finding's signature names and first log line are fields (ledger v17), written where the finding
is recorded and read as fields: a later tick's ``earlier_hits`` finds them whatever the action's words say.
Older crash findings get them from their words once, in the migration; "unknown" signatures where the
action does not name them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Ledger
from orchestrator.ledger.migrate import MIGRATIONS
from orchestrator.ledger.reader import LedgerReader
from orchestrator.tick.reconcile import earlier_hits


def _job(ledger: Ledger) -> str:
    (row,) = ledger.add_sweep(sweep_id="qcrash1", queue_path="q.txt", workdir="/w", queue_text="",
                              jobs=[JobSpec(name="lr-1", config="c.yaml", task="t")], default_retries=3)
    ledger.start_attempt(row.id, host="h", bundle_sha="s")
    return row.id


def test_earlier_hits_read_the_fields_not_the_words(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        job_id = _job(ledger)
        ledger.record_finding("job", job_id, severity="escalate", rule="crash", message="lr-1 a1: boom",
                              action="triage it: gpuq logs x", reason="RuntimeError: NCCL error",
                              signatures=("nccl", "traceback"), attempt=1)
        ledger.record_finding("job", job_id, severity="escalate", rule="crash", message="lr-1 a1: quiet",
                              action="signatures: cuda_oom; words only")  # names in the words alone: none
        hits = earlier_hits(ledger, ledger.job(job_id))
        assert [(h.signature, h.line) for h in hits] == [("nccl", "RuntimeError: NCCL error"),
                                                         ("traceback", "RuntimeError: NCCL error")]
        (event, quiet) = [e for e in ledger.events(job_id) if e.rule == "crash"]
        assert (event.signatures, quiet.signatures, quiet.signature_names) == ('["nccl", "traceback"]', "", ())
    finally:
        ledger.close()
    (read,) = [e for e in LedgerReader(tmp_path / "ledger.db").alerts() if e.signatures]
    assert read.signature_names == ("nccl", "traceback")  # the read path's record answers the same


def _v16(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for number, step in enumerate(MIGRATIONS[:16], start=1):
        step(conn)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.execute("INSERT INTO sweep (id, queue_path, workdir, queue_text, bundle_sha, job_count, created_at) "
                 "VALUES ('qold000', 'q', '/w', '', '', 1, 0)")
    conn.execute("INSERT INTO job (id, sweep_id, name, line, raw, config, config_sha256, task, epochs, gpus, nodes, "
                 "retries, spec_hash, state, attempt_count, created_at, updated_at) VALUES ('c1', 'qold000', "
                 "'lr-1', 1, '', 'a.yaml', '', 't', 1, 1, 1, 0, '', 'FAILED', 3, 0, 0)")
    return conn


OLD_CRASHES = [  # (subject, rule, message, action) -> (signatures, reason)
    (("c1", "crash", "lr-1 a2: torch.OutOfMemoryError: CUDA out of memory", "signatures: cuda_oom, traceback; "
      "triage from the traceback: gpuq logs c1"), ('["cuda_oom", "traceback"]', "torch.OutOfMemoryError: CUDA out "
                                                  "of memory")),
    (("c1", "crash", "a line of an older gpuq", "triage it"), ("unknown", "a line of an older gpuq")),
    (("c1", "failed", "lr-1 a2: exit 1 (class: gpu_oom)", "signatures: nccl"), ("", "")),  # not a crash: none
]


def test_v17_reads_older_crash_findings_words_once(tmp_path: Path) -> None:
    conn = _v16(tmp_path / "ledger.db")
    for (subject, rule, message, action), _ in OLD_CRASHES:
        conn.execute("INSERT INTO event (time, kind, subject, old, new, message, severity, rule, action) "
                     "VALUES (0, 'job', ?, '', '', ?, 'escalate', ?, ?)", (subject, message, rule, action))
    conn.close()
    ledger = Ledger(tmp_path / "ledger.db")  # migrates
    try:
        events = ledger.events("", limit=100)
        assert [(e.signatures, e.reason) for e in events] == [want for _, want in OLD_CRASHES]
        assert [e.signature_names for e in events] == [("cuda_oom", "traceback"), (), ()]
    finally:
        ledger.close()
