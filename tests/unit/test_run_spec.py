"""Ledger v6 fields and the job spec's args/run fields; forwarded secrets travel beside the specs."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.agent import launcher
from orchestrator.agent.spec import RunSection
from orchestrator.core import protocol
from orchestrator.core.config import load_settings
from orchestrator.core.errors import GpuqError
from orchestrator.ledger import Ledger
from orchestrator.queue.queuefile import parse_bytes
from orchestrator.queue.runconfig import RunConfig
from tests.support.jobspecs import outbound_spec


def _ledger(tmp_path: Path, run: str = "") -> tuple[Ledger, list[str]]:
    ledger = Ledger(tmp_path / "ledger.db")
    parsed = parse_bytes(b"name=g -- --lr {1,2} 'a b'\n", label="q.txt", workdir=None, needs_config=False)
    rows = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="", jobs=parsed.jobs,
                            default_retries=1, run=run, verify=())
    return ledger, [r.id for r in rows]


def test_v6_stores_args_cell_and_run(tmp_path: Path) -> None:
    ledger, ids = _ledger(tmp_path, run=json.dumps({"command": ["t.py"]}))
    job = ledger.job(ids[1])
    assert (job.name, job.cell, job.arg_list()) == ("g-lr2", "g", ["--lr", "2", "a b"])
    sweep = ledger.sweep("qaaaaaa")
    assert sweep is not None and json.loads(sweep.run) == {"command": ["t.py"]}
    conn = sqlite3.connect(tmp_path / "ledger.db")
    columns = {row[1]: row[4] for row in conn.execute("PRAGMA table_info(job)")}
    assert columns["args"] == "'[]'" and columns["cell"] == "''"


def test_spec_without_run_is_the_legacy_spec_plus_empty_args(tmp_path: Path) -> None:
    ledger, ids = _ledger(tmp_path)
    job = ledger.job(ids[0])
    attempt = ledger.start_attempt(job.id, host="local", bundle_sha="s")
    spec = launcher.job_spec(job, attempt, load_settings(env={"GPUQ_HOME": str(tmp_path)}),
                             sweep=ledger.sweep("qaaaaaa"))
    doc = spec.as_document()
    assert doc["protocol"] == protocol.PROTOCOL_VERSION == "1.1"
    assert doc["args"] == ["--lr", "1", "a b"] and doc["run"] is None
    assert launcher.enqueue_payload([spec], environ={}) == json.dumps([doc]).encode()


def test_spec_run_carries_the_table_names_only_and_secrets_travel_beside(tmp_path: Path) -> None:
    run = RunConfig(command="train.py {args}", forward_env=["TOKEN"], checkpoint="snap.pt", setup="pip install x",
                    env={"NCCL_DEBUG": "WARN", "PIP_NO_INDEX": "1"})
    ledger, ids = _ledger(tmp_path, run=json.dumps({**run.wire(), "setup_key": "ab" * 32}))
    job = ledger.job(ids[0])
    attempt = ledger.start_attempt(job.id, host="local", bundle_sha="s")
    spec = launcher.job_spec(job, attempt, load_settings(env={"GPUQ_HOME": str(tmp_path)}),
                             sweep=ledger.sweep("qaaaaaa"))
    doc = spec.as_document()
    assert doc["run"] == {
        "command": ["train.py", "{args}"], "launcher": "torchrun", "resume_args": [], "checkpoint": ["snap.pt"],
        "outputs": [], "metrics": "", "metrics_regex": "", "metric": "", "mode": "max", "progress": "",
        "setup": "pip install x", "setup_key": "ab" * 32, "forward_env": ["TOKEN"],
    }
    assert doc["verify"] == []
    assert doc["env"] == {"NCCL_DEBUG": "WARN", "PIP_NO_INDEX": "1"}  # [run] env: the job's run.env
    payload = json.loads(launcher.enqueue_payload([spec], environ={"TOKEN": "s3cret"}, allowed=["TOK*"]))
    assert payload == {"specs": [doc], "secrets": {"qaaaaaa": {"TOKEN": "s3cret"}}}
    assert "s3cret" not in json.dumps(doc)
    with pytest.raises(GpuqError) as info:
        launcher.enqueue_payload([spec], environ={}, allowed=["TOKEN"])
    assert "TOKEN" in str(info.value)


@pytest.mark.parametrize(("names", "allowed", "refused"), [
    (["TOKEN"], [], "TOKEN is not in your forward_env_allow"),  # the user's config allows nothing
    (["RUNPOD_API_KEY"], ["*"], "RUNPOD_API_KEY is gpuq's RunPod API credential"),  # a sweep recorded before the rule
    (["GPUQ_RUNPOD_API_KEY"], ["GPUQ_RUNPOD_API_KEY"], "gpuq never sends it"),
    (["GPUQ_WEBHOOK_URL"], ["*"], "GPUQ_WEBHOOK_URL is gpuq's own setting or credential"),
    (["LAMBDA_API_KEY"], ["LAMBDA_API_KEY"], "gpuq's Lambda Cloud API credential"),
])
def test_enqueue_never_sends_a_name_the_user_did_not_allow_or_gpuqs_own(names: list[str], allowed: list[str],
                                                                         refused: str) -> None:
    spec = replace(outbound_spec(), queue_id="qaaaaaa", run=RunSection(forward_env=tuple(names)))
    environ = {name: "s3cret" for name in names}
    with pytest.raises(GpuqError) as info:
        launcher.enqueue_payload([spec], environ=environ, allowed=allowed)
    assert refused in str(info.value) and "s3cret" not in str(info.value)


def test_a_v5_ledger_upgrades_with_defaults(tmp_path: Path) -> None:
    from orchestrator.ledger.migrate import MIGRATIONS

    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for number, step in enumerate(MIGRATIONS[:5], start=1):
        step(conn)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.execute("INSERT INTO sweep (id, queue_path, workdir, queue_text, bundle_sha, job_count, created_at) "
                 "VALUES ('qold000', 'q', '/w', '', '', 1, 0)")
    conn.execute("INSERT INTO job (id, sweep_id, name, line, raw, config, config_sha256, task, epochs, gpus, nodes, "
                 "retries, spec_hash, state, attempt_count, created_at, updated_at) VALUES ('c1', 'qold000', 'a', 1, "
                 "'', 'a.yaml', '', 't', 1, 1, 1, 0, '', 'QUEUED', 0, 0, 0)")
    conn.close()
    ledger = Ledger(path)
    job = ledger.job("c1")
    sweep = ledger.sweep("qold000")
    assert (job.args, job.arg_list(), job.cell) == ("[]", [], "")
    assert sweep is not None and sweep.run == "" and launcher.run_spec(sweep) is None
