"""The evidence of failed attempts (transfer/evidence.py) is bounded by what a host cannot choose
(docs/security.md): an exit record is parsed only up to MAX_EXIT_BYTES, and copies that did not verify
are counted and pruned, oldest first (transfer/quarantine.py), on a real ledger and a FakeHost root."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Attempt, Job, Ledger
from orchestrator.transfer import evidence, quarantine
from tests.support.fakehost import FakeHost
from tests.support.jobtree import SHA


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger(tmp_path / "ledger.db")
    yield led
    led.close()


def _failed(ledger: Ledger, host: FakeHost, name: str, exit_doc: dict[str, object] | None = None,
            pad: int = 0) -> tuple[Job, Attempt]:
    """A job whose attempt 1 exited 1 on ``host``, its log and exit record there (``exit_doc`` changes it;
    ``pad`` characters of padding make it as big as a host likes)."""
    spec = JobSpec(name=name, config="c.yaml", task="classify", config_sha256="0" * 64, line=1)
    (job,) = ledger.add_sweep(sweep_id=f"q{name}", queue_path="q.txt", workdir="/w", queue_text="", jobs=[spec],
                              default_retries=0)
    ledger.start_attempt(job.id, host=host.name, bundle_sha=SHA)
    ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ledger.update_attempt(job.id, 1, exit_code=1)
    ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    ledger.transition(job.id, JobState.FAILED)
    adir = Path(host.root) / protocol.JOBS_DIR / job.id / protocol.ATTEMPTS_DIR / "1"
    adir.mkdir(parents=True)
    (adir / protocol.JOB_LOG).write_text("Traceback (most recent call last):\nValueError: bad shape\n")
    record = {"job_id": job.id, "attempt": 1, "wrapper_code": 1, "trainer_code": 1, "phase": "train",
              "message": "", **(exit_doc or {})}
    if pad:
        record["padding"] = "x" * pad
    (adir / protocol.EXIT_FILE).write_text(json.dumps(record))
    att = ledger.attempt(job.id, 1)
    assert att is not None
    return ledger.job(job.id), att


def _fetch(ledger: Ledger, host: FakeHost, items: list[tuple[Job, Attempt]],
           tmp_path: Path) -> list[evidence.EvidenceOutcome]:
    return evidence.fetch_evidence(ledger, host, items, tmp_path / "results", tmp_path / "quarantine")


def test_an_exit_record_over_its_bound_is_neither_copied_nor_parsed(ledger: Ledger, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", name="h1")
    fine = _failed(ledger, host, "fine", pad=evidence.MAX_EXIT_BYTES // 2)
    huge = _failed(ledger, host, "huge", pad=evidence.MAX_EXIT_BYTES)  # a valid record, padded past the bound
    ok, refused = _fetch(ledger, host, [fine, huge], tmp_path)
    assert ok.verified, ok
    assert refused.state == evidence.UNVERIFIED and not refused.verified
    assert f"{protocol.EXIT_FILE} on h1 is " in refused.reason
    assert f"over the {evidence.MAX_EXIT_BYTES}" in refused.reason
    assert not evidence.is_home(tmp_path / "results", huge[0], 1)
    assert not (tmp_path / "quarantine").exists()  # refused before a byte moved: nothing to set aside


def test_the_evidence_quarantine_keeps_the_newest_copies_only(ledger: Ledger, tmp_path: Path) -> None:
    """A host that lies about every exit record of more failed attempts than the quarantine keeps: each copy
    is set aside, the oldest are pruned, and each outcome says what the quarantine keeps."""
    host = FakeHost(tmp_path / "host", name="h1")
    items = [_failed(ledger, host, f"j{i:03d}", {"wrapper_code": 0}) for i in range(quarantine.MAX_COPIES + 5)]
    other = tmp_path / "quarantine" / "cjob--a1--sha256-mismatch"  # a pull's quarantined copy: not evidence
    other.mkdir(parents=True)
    outcomes = _fetch(ledger, host, items, tmp_path)
    assert all(o.state == evidence.UNVERIFIED and "says exit 0, the ledger recorded 1" in o.reason for o in outcomes)
    kept = sorted(p.name for p in (tmp_path / "quarantine").iterdir() if quarantine.EVIDENCE_TAG in p.name)
    assert len(kept) == quarantine.MAX_COPIES
    assert kept == sorted(f"{job.id}--a1--evidence" for job, _ in items[-quarantine.MAX_COPIES:])  # the newest
    assert other.is_dir()
    assert f"the quarantine keeps {quarantine.MAX_COPIES} evidence copies" in outcomes[-1].reason
    assert "; 1 older pruned" in outcomes[-1].reason


def test_the_evidence_quarantine_is_bounded_in_bytes(ledger: Ledger, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(tmp_path / "host", name="h1")
    monkeypatch.setattr(quarantine, "MAX_BYTES", 250_000)
    items = [_failed(ledger, host, f"b{i}", {"wrapper_code": 0}, pad=100_000) for i in range(4)]
    outcomes = _fetch(ledger, host, items, tmp_path)
    kept = sorted(p.name for p in (tmp_path / "quarantine").iterdir())
    assert kept == sorted(f"{job.id}--a1--evidence" for job, _ in items[-2:])
    assert "the quarantine keeps 2 evidence copies" in outcomes[-1].reason
    # the same attempt set aside again and again (a person pulls it by hand each time) is bounded too
    for _ in range(3):
        _fetch(ledger, host, items[-1:], tmp_path)
    assert len(list((tmp_path / "quarantine").iterdir())) == 2


def test_evidence_never_fills_this_machines_disk(ledger: Ledger, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Verified evidence is bounded per attempt only: what would leave less than KEEP_FREE_BYTES free on
    this machine is not copied (a passing failure), and is once there is room."""
    host = FakeHost(tmp_path / "host", name="h1")
    item = _failed(ledger, host, "big", pad=1000)
    monkeypatch.setattr(evidence, "KEEP_FREE_BYTES", shutil.disk_usage(tmp_path).total)  # never that much free
    (short,) = _fetch(ledger, host, [item], tmp_path)
    assert short.state == evidence.INCOMPLETE and "bytes free under" in short.reason and "not copied" in short.reason
    assert not (tmp_path / "results").exists() and not (tmp_path / "quarantine").exists()
    monkeypatch.setattr(evidence, "KEEP_FREE_BYTES", 0)
    (done,) = _fetch(ledger, host, [item], tmp_path)
    assert done.verified, done
