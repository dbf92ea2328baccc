"""A sweep's stored ``[run]`` table (orchestrator/ledger/sweeprun.py) is read in one place,
``Sweep.run_config()``: what submit records reads back as the project's RunConfig, an older gpuq's JSON
stays readable, and a value that is not such a table is *unreadable*: `gpuq status` and `gpuq results`
still answer, and its jobs are never sent (they would run as the bundled payload)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.agent import launcher
from orchestrator.context import open_context
from orchestrator.core.config import load_settings
from orchestrator.core.errors import LedgerError
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import JobState
from orchestrator.ledger import Ledger
from orchestrator.ledger.sweeprun import SweepRun, parse_run
from orchestrator.queue.runconfig import RunConfig
from tests.conftest import run_gpuq

TOML = """[run]
command = "train.py --name {name} {args}"
launcher = "python"
setup = "pip install -r requirements.txt"
env = {NCCL_DEBUG = "WARN"}
checkpoint = "ckpt/*.pt"
resume_args = "--resume {checkpoint}"
outputs = ["out/*"]
metrics = "metrics.csv"
metric = "loss"
mode = "min"
progress = "step (?P<step>\\\\d+)"
verify = ["metrics"]
"""


def test_the_stored_model_has_every_key_of_run_and_what_submit_adds() -> None:
    stored = SweepRun.model_fields
    extra = {"setup_key", "data", "unreadable"}
    assert set(stored) - extra == set(RunConfig.model_fields)
    for name, field in RunConfig.model_fields.items():
        assert (stored[name].annotation, stored[name].get_default(call_default_factory=True)) == \
            (field.annotation, field.get_default(call_default_factory=True)), name


def test_what_submit_records_reads_back_as_the_projects_table(tmp_path: Path, gpuq_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "gpuq.toml").write_text(TOML)
    (tmp_path / "q.txt").write_text("name=a -- --lr 1\n")
    monkeypatch.setenv("GPUQ_LOCAL_CPU_SLOTS", "2")
    ctx = open_context()
    try:
        result = api.submit(ctx, tmp_path / "q.txt", dry_run=True)
    finally:
        ctx.close()
    assert result.run is not None
    run = parse_run(result.run_json)
    assert run is not None and not run.unreadable
    assert run.model_dump(include=set(RunConfig.model_fields)) == result.run.model_dump()
    assert len(run.setup_key) == 64 and run.data == {}
    assert parse_run(run.text()) == run  # written back as read
    assert result.run_json == run.text()  # submit records through the same model


def test_no_run_an_old_gpuqs_json_and_a_newer_key(tmp_path: Path) -> None:
    assert parse_run("") is None
    old = {"project": ".", "command": ["t.py"], "launcher": "torchrun", "setup": "", "env": {}, "forward_env": ["TOK"],
           "checkpoint": [], "resume_args": [], "outputs": [], "metrics": "", "metrics_regex": "", "metric": "",
           "mode": "max", "progress": "", "verify": [], "setup_key": ""}  # ledger v6's first [run]: no smoke_args
    run = parse_run(json.dumps({**old, "a_later_key": 1}))
    assert run is not None and not run.unreadable
    assert (run.command, run.forward_env, run.smoke_args) == (("t.py",), ("TOK",), ())


@pytest.mark.parametrize(("stored", "why"), [
    ("{not json", "Invalid JSON"),
    ("[]", "Input should be an object"),
    ('{"command": "t.py --x"}', "command: Input should be a valid array"),
    ('{"metric": 3}', "metric: Input should be a valid string"),
    ('{"mode": "sideways"}', "mode: Input should be 'max' or 'min'"),
    ('{"data": {"d": {"tree": "t", "path": "/home/me"}}}', "data.d.path: Extra inputs are not permitted"),
    ('{"command": ["\\u001b[2Jx"], "env": {"A": 1}}', "env.A: Input should be a valid string"),
])
def test_a_corrupt_value_is_unreadable_never_a_crash(stored: str, why: str) -> None:
    run = parse_run(stored)
    assert run is not None and run.unreadable.startswith(why)
    assert run.unreadable.isprintable() and run.command == () and run.metric == ""


def _sweep(ledger: Ledger, run: str) -> str:
    (row,) = ledger.add_sweep(sweep_id="qbad0000", queue_path="q.txt", workdir="/w", queue_text="",
                              jobs=[JobSpec(name="a", config="c.yaml", task="t", epochs=1)], default_retries=0,
                              run=run)
    return row.id


def test_a_corrupt_sweep_is_not_sent_and_its_jobs_stay_queued(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    job_id = _sweep(ledger, '{"command": "t.py"}')
    settings = load_settings(env={"GPUQ_HOME": str(tmp_path)})
    assert launcher.record_attempts(ledger, "local", "s" * 64, [ledger.job(job_id)], settings) == []
    job = ledger.job(job_id)
    assert (job.state, job.attempt_count) == (JobState.QUEUED.value, 0)
    (event,) = [e for e in ledger.events(job_id) if e.message.startswith("not started: ")]
    assert "sweep qbad0000: its recorded [run] table cannot be read (command: Input should be a valid array)" \
        in event.message and "gpuq cancel --sweep qbad0000" in event.message
    attempt = ledger.start_attempt(job_id, host="local", bundle_sha="s")  # a spec asked for anyway
    with pytest.raises(LedgerError, match="cannot be read"):
        launcher.job_spec(job, attempt, settings, sweep=ledger.sweep("qbad0000"))


def test_status_and_results_answer_for_a_corrupt_sweep(gpuq_home: Path) -> None:
    ledger = Ledger(gpuq_home / "ledger.db")
    _sweep(ledger, '{"metric": ')
    ledger.close()
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    assert conn.execute("SELECT run FROM sweep").fetchone() == ('{"metric": ',)
    conn.close()
    for args in (("status", "--once", "--no-probe"), ("status", "--once"), ("results", "--sweep", "qbad0000")):
        done = run_gpuq(*args, env={"COLUMNS": "200", "GPUQ_LOCAL_CPU_SLOTS": "2"})
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        assert "qbad0000" in done.stdout
    assert "best val_acc (max)" in done.stdout  # results: the payload's headline, as for a sweep without [run]
