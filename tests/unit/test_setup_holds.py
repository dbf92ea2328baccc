"""A project's setup that fails on a host holds the host for that bundle and loses nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health.setup_holds import held_bundles, is_held, is_setup_failure, release, settle_setup_failure
from orchestrator.host_documents import ExitRecord
from orchestrator.ledger import Ledger

SHA = "ab" * 32
EXIT = ExitRecord.model_validate({"wrapper_code": 80, "phase": "setup", "setup_failed": True, "setup_key": "k" * 64,
        "message": "setup failed (exit 1) on g1: ERROR: No matching distribution found for hydra-core",
        "setup_tail": "Collecting hydra-core\nERROR: No matching distribution found for hydra-core"})


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


def _failed_setup(ledger: Ledger, host: str = "g1") -> str:
    rows = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="",
                            jobs=[JobSpec(name="a", config="", task="")], default_retries=0, bundle_sha=SHA)
    job = rows[0].id
    ledger.start_attempt(job, host=host, bundle_sha=SHA)
    ledger.transition(job, AttemptState.RUNNING, attempt=1)
    ledger.transition(job, JobState.RUNNING)
    ledger.update_attempt(job, 1, exit_code=80, phase="setup")
    ledger.transition(job, AttemptState.EXITED, attempt=1, message="exit 80")
    return job


def test_a_failed_setup_holds_the_host_for_that_bundle_and_requeues_without_a_retry(ledger: Ledger) -> None:
    job = _failed_setup(ledger)
    assert is_setup_failure(EXIT) and not is_setup_failure(ExitRecord(wrapper_code=80, phase="setup"))
    decision = settle_setup_failure(ledger, job, "g1", SHA, EXIT, "exit 80: setup failed (exit 1) on g1")
    assert decision.action == "requeue"
    assert ledger.job(job).state == JobState.QUEUED.value  # retries=0, yet nothing is lost
    assert ledger.failed_attempts(job) == 0
    holds = held_bundles(ledger, ["g1", "g2"])
    assert holds == {"g1": {SHA[:12]}}
    assert is_held(holds, "g1", SHA) and not is_held(holds, "g1", "cd" * 32) and not is_held(holds, "g2", SHA)
    alert = ledger.alerts(limit=1)[0]
    assert (alert.subject, alert.severity, alert.rule) == ("g1", "escalate", "setup:" + SHA[:12])
    assert "No matching distribution found for hydra-core" in alert.message
    assert "gpuq hosts release g1" in alert.action


def test_a_second_failure_does_not_repeat_the_alert_and_release_clears_it(ledger: Ledger) -> None:
    job = _failed_setup(ledger)
    settle_setup_failure(ledger, job, "g1", SHA, EXIT, "first")
    ledger.start_attempt(job, host="g1", bundle_sha=SHA)
    ledger.transition(job, AttemptState.EXITED, attempt=2, message="exit 80")
    settle_setup_failure(ledger, job, "g1", SHA, EXIT, "second")
    assert sum(e.rule.startswith("setup:") for e in ledger.alerts()) == 1
    assert ledger.failed_attempts(job) == 0
    assert release(ledger, "g1") == [SHA[:12]]
    assert held_bundles(ledger, ["g1"]) == {}
    assert release(ledger, "g1") == []


def test_hosts_release_clears_the_hold_and_the_failed_setup_record(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import api
    from orchestrator.cli.main import main

    monkeypatch.setenv("GPUQ_HOME", str(tmp_path / "home"))
    ctx = api.open_context()
    try:
        root = Path(ctx.fleet.local().root)
        failed = root / "setup" / ("k" * 64) / "failed.json"
        failed.parent.mkdir(parents=True)
        failed.write_text("{}")
        (failed.parent / "setup.log").write_text("kept for the user\n")
        job = _failed_setup(ctx.ledger, host="local")
        settle_setup_failure(ctx.ledger, job, "local", SHA, EXIT, "exit 80")
    finally:
        ctx.close()
    main(["hosts", "release", "local"])
    assert not failed.exists() and (failed.parent / "setup.log").is_file()
    ctx = api.open_context()
    try:
        assert held_bundles(ctx.ledger, ["local"]) == {}
    finally:
        ctx.close()
