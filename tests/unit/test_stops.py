"""Stops and kills from outside (orchestrator/health/stops.py): what an exit record says, and the provider's
late word turning a just-failed attempt on a preempted host into PREEMPTED."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.core.config import Settings
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Ledger
from orchestrator.tick.settle import settle
from tests.support.wire import stops


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "home" / "ledger.db")


def _jobs(ledger: Ledger, n: int) -> list[str]:
    specs = [JobSpec(name=f"j{i}", config=f"c{i}.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i in range(n)]
    rows = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="...", jobs=specs,
                            default_retries=2)
    return [r.id for r in rows]


def _ended(ledger: Ledger, job: str, host: str, code: int, klass: str) -> None:
    """Run one attempt on ``host`` to a non-zero exit and settle it as reconcile does."""
    ledger.start_attempt(job, host=host, bundle_sha="s")
    number = ledger.job(job).attempt_count
    ledger.transition(job, AttemptState.RUNNING, attempt=number)
    ledger.transition(job, JobState.RUNNING)
    ledger.update_attempt(job, number, exit_code=code, message=f"exit {code}")
    ledger.transition(job, AttemptState.EXITED, attempt=number)
    settle(ledger, job, klass, Settings())


def test_exit_records() -> None:
    assert stops.wrapper_signal({"wrapper_signal": 15}) == 15
    assert stops.wrapper_signal({"wrapper_signal": None}) is None
    assert stops.wrapper_signal({"wrapper_signal": True}) is None  # not a number
    assert stops.wrapper_signal({"wrapper_signal": "15"}) is None
    assert stops.wrapper_signal({}) is None
    assert stops.death_signal(137, -9) == 9
    assert stops.death_signal(137, None) == 9
    assert stops.death_signal(1, 1) is None
    assert stops.death_signal(82, 0) is None


@pytest.mark.parametrize(("entry", "yes"), [
    ({"state": "exited", "exit": {"wrapper_code": 1, "trainer_code": 1, "wrapper_signal": 15}}, True),
    ({"state": "exited", "exit": {"wrapper_code": 143, "trainer_code": -15}}, True),
    ({"state": "exited", "exit": {"wrapper_code": 137, "trainer_code": -9}}, True),
    ({"state": "exited", "exit": {"wrapper_code": 1, "trainer_code": 1}}, False),  # the code's own failure
    ({"state": "exited", "exit": {"wrapper_code": 0, "trainer_code": 0, "wrapper_signal": 15}}, False),
    ({"state": "exited", "cancel_requested": True, "exit": {"wrapper_code": 143, "wrapper_signal": 15}}, False),
    ({"state": "running"}, False),
    ({"state": "exited", "exit": ["not", "a", "record"]}, False),
])
def test_interrupted_entries(entry: dict[str, object], yes: bool) -> None:
    assert stops.interrupted(entry) is yes


def test_a_late_preemption_turns_the_just_failed_attempt_into_preempted(ledger: Ledger) -> None:
    failed, requeued, elsewhere, config, second = _jobs(ledger, 5)
    _ended(ledger, failed, "pod", 1, "unknown")  # a rank exited 1 before anything said "preempted"
    _ended(ledger, requeued, "pod", 143, "stopped")
    _ended(ledger, elsewhere, "other", 1, "unknown")
    _ended(ledger, config, "pod", 4, "config")
    assert ledger.job(failed).state == "FAILED" and ledger.job(requeued).state == "QUEUED"
    assert ledger.failed_attempts(requeued) == 1
    now = time.time()
    _ended(ledger, second, "pod", 1, "unknown")
    changed = stops.reclaim_preempted(ledger, "pod", "Outbid", within_s=60, now=now + 3600)  # too late: none
    assert changed == []

    changed = stops.reclaim_preempted(ledger, "pod", "Outbid", within_s=60, now=now + 1)
    assert sorted(changed) == sorted([failed, requeued, second])
    assert ledger.job(failed).state == "PREEMPTED"  # `gpuq resume` / auto-resume continue it
    assert ledger.attempt(failed, 1).state == "PREEMPTED"
    assert ledger.job(requeued).state == "QUEUED"
    assert ledger.attempt(requeued, 1).state == "PREEMPTED"
    assert ledger.failed_attempts(requeued) == 0  # counted as a preemption, not against retries=
    assert ledger.job(elsewhere).state == "FAILED"  # another host: untouched
    assert ledger.job(config).state == "FAILED"  # a config error stays the code's
    assert stops.reclaim_preempted(ledger, "pod", "Outbid", within_s=60, now=now + 1) == []  # idempotent


def test_kernel_oom_kills_are_evidence() -> None:
    assert stops.kernel_oom_kills({"kernel": {"oom_kills": [{"ts": 2.0, "pid": 22, "line": "x"}]}})
    assert not stops.kernel_oom_kills({"kernel": {"xids": []}})
    assert not stops.kernel_oom_kills({"kernel": {"oom_kills": "lots"}})
    assert not stops.kernel_oom_kills({})
