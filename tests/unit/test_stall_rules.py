"""The rules that end a running attempt (issue 25): a stall before the first step is a
``deadlock_at_start`` with its own short limit and one retry at most; a non-finite loss in a
project's own metrics files ends the attempt as a divergence; the stacks saved before a stall kill
come home with the attempt's evidence.  tests/integration/test_stall_ends.py runs them end to end."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.context import Context
from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health.patrol import JobView, Thresholds
from orchestrator.health.verdicts import DEADLOCK_AT_START
from orchestrator.transfer import evidence
from tests.support.agentmodule import load_agent_module
from tests.support.fakehost import FakeHost
from tests.support.jobtree import SHA
from tests.support.wire import patrol, verdicts

NF = load_agent_module("gpuq_watch.gpuq_nonfinite")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
RUN_OF = jobspec.parse_run  # the spec's "run" as the agent reads it

TH = Thresholds()  # stall 900 s, start-up grace 600 s, a stall before the first step 300 s
NOW = 1_800_000_000.0
JOB = JobView("c000000000001", "baseline", 1, launched_at=NOW - 3600)


def _quiet(silent_s: float, **kw: Any) -> dict[str, Any]:
    """A running attempt whose heartbeat, log and checkpoint are all ``silent_s`` old."""
    entry: dict[str, Any] = {"state": "running", "heartbeat_age_s": silent_s, "log_mtime": NOW - silent_s,
                             "heartbeat": {"step": 0, "phase": "train"}}
    entry.update(kw)
    return entry


def _ends(entry: dict[str, Any], job: JobView = JOB, th: Thresholds = TH) -> list[tuple[str, str]]:
    return [(f.rule, f.klass) for f in patrol.job_findings("h1", job, entry, NOW, th)]


@pytest.mark.parametrize(("silent_s", "ends"), [(300.0, []), (301.0, [("stalled", DEADLOCK_AT_START)])])
def test_before_the_first_step_a_stall_has_its_own_shorter_limit(silent_s: float, ends: list[Any]) -> None:
    assert _ends(_quiet(silent_s)) == ends
    # past the first step the same silence is no stall: the normal limit holds
    assert _ends(_quiet(silent_s, heartbeat={"step": 1})) == []
    assert _ends(_quiet(901.0, heartbeat={"step": 1})) == [("stalled", "stalled")]


def test_the_deadlock_finding_says_what_it_is_and_what_to_try() -> None:
    (found,) = patrol.job_findings("h1", JOB, _quiet(400.0, heartbeat=None, heartbeat_age_s=None,
                                                     progress={"line": "Epoch 0:   0%|  | 0/100"}), NOW, TH)
    assert found.message == ("baseline a1: stalled before its first step (deadlock_at_start): heartbeat never, "
                             "nothing written for 400s; last log line: Epoch 0:   0%|  | 0/100")
    assert "num_workers=0" in found.action and "NCCL" in found.action and "saved stacks" in found.action


@pytest.mark.parametrize(("more", "job"), [
    ({"ckpt": {"mtime": NOW - 5000}}, JOB),  # the payload's checkpoint pointer (an earlier attempt's)
    ({"run_ckpt_mtime": NOW - 5000}, JOB),  # a checkpoint-glob match
    ({"heartbeat": None, "progress": {"step": 3}}, JOB),
    ({"heartbeat": None, "progress": {"pct": 1}}, JOB),
    ({"heartbeat": None, "progress": {"epoch": 2}}, JOB),
    ({"heartbeat": None, "progress": {"epoch": 0, "source": "metrics"}}, JOB),  # a row of its metrics files
    ({}, JobView("c000000000001", "baseline", 2, launched_at=NOW - 3600, stepped=True)),  # the ledger saw one
])
def test_any_sign_of_a_step_makes_it_an_ordinary_stall(more: dict[str, Any], job: JobView) -> None:
    assert _ends(_quiet(400.0, **more), job) == []
    assert _ends(_quiet(901.0, **more), job) == [("stalled", "stalled")]


@pytest.mark.parametrize("progress", [{"step": 0, "total": 100, "pct": 0, "source": "tqdm"}, {"epoch": 1},
                                      {"epoch": 0, "source": "pattern"}])
def test_a_bar_at_zero_or_a_first_epoch_line_is_no_step(progress: dict[str, Any]) -> None:
    assert _ends(_quiet(400.0, heartbeat=None, progress=progress)) == [("stalled", DEADLOCK_AT_START)]


def test_a_trainer_without_a_heartbeat_keeps_its_start_up_grace_and_the_lower_limit_wins() -> None:
    young = JobView("c1", "j", 1, launched_at=NOW - 500)
    quiet = _quiet(450.0, heartbeat=None, heartbeat_age_s=None)
    assert _ends(quiet, young) == []  # 500 s < the 600 s grace
    assert _ends(quiet, JobView("c1", "j", 1, launched_at=NOW - 601)) == [("stalled", DEADLOCK_AT_START)]
    low = Thresholds(stall_after_s=60, start_stall_after_s=300, startup_grace_s=30)
    assert _ends(_quiet(61.0), JOB, low) == [("stalled", DEADLOCK_AT_START)]  # never later than a stall


def test_a_deadlock_at_start_is_retried_once_at_most() -> None:
    first = verdicts.decide(DEADLOCK_AT_START, 1, 2)
    assert first.action == "requeue" and first.reason.startswith("deadlock_at_start: requeued (retry 1 of 1")
    again = verdicts.decide(DEADLOCK_AT_START, 2, 2)
    assert again.action == "fail" and again.reason.startswith("deadlock_at_start: ") and "num_workers=0" in again.reason
    assert verdicts.decide(DEADLOCK_AT_START, 1, 0).action == "fail"  # retries=0: none at all


def test_a_non_finite_loss_ends_a_running_attempt_as_divergence() -> None:
    scan = {"nonfinite": [{"field": "train_loss", "value": "nan", "step": 2, "kind": "run/metrics.csv"}]}
    (found,) = patrol.job_findings("h1", JOB, _quiet(5.0, heartbeat={"step": 2}, scan=scan), NOW, TH)
    assert (found.rule, found.klass) == ("nan", "divergence")
    assert found.message == "baseline: non-finite train_loss=nan at step 2"
    assert "gradient clipping" in found.action and "loss scaling" in found.action
    (gone,) = patrol.job_findings("h1", JOB, {"state": "exited", "scan": scan}, NOW, TH)
    assert gone.klass == ""  # it ended by itself: reconcile classes it


# --- the agent: a non-finite loss in a project's own metrics ----------------------------------------------


def _job_dir(tmp_path: Path, launched: float) -> Path:
    jdir = tmp_path / "jobs" / "c1"
    (jdir / protocol.ATTEMPTS_DIR / "1").mkdir(parents=True)
    (jdir / protocol.RUN_DIR).mkdir()
    (jdir / protocol.ATTEMPTS_DIR / "1" / protocol.LAUNCH_FILE).write_text(json.dumps({"time": launched}))
    return jdir


def test_the_agent_reports_a_loss_whose_newest_value_is_not_finite(tmp_path: Path) -> None:
    jdir = _job_dir(tmp_path, 1000.0)
    csv = jdir / protocol.RUN_DIR / "metrics.csv"
    run = {"metrics": "metrics.csv"}
    csv.write_text("epoch,step,train_loss,val_loss\n0,1,0.9,\n0,2,nan,\n0,2,,0.8\n")
    assert NF.nonfinite_losses(str(jdir), RUN_OF(run), 1, 1000.0) == [
        {"step": 2, "epoch": 0, "kind": "run/metrics.csv", "field": "train_loss", "value": "nan"}]
    csv.write_text(csv.read_text() + "0,3,0.7,\n")  # a NaN the trainer recovered from: not ended for it
    assert NF.nonfinite_losses(str(jdir), RUN_OF(run), 1, 1000.0) == []
    csv.write_text(csv.read_text() + "0,4,,inf\n")
    found = NF.nonfinite_losses(str(jdir), RUN_OF(run), 1, 1000.0)
    assert [(b["field"], b["value"]) for b in found] == [("val_loss", "inf")]
    os.utime(csv, (900.0, 900.0))  # written before this attempt started: an earlier attempt's rows
    assert NF.nonfinite_losses(str(jdir), RUN_OF(run), 1, 1000.0) == []


def test_json_lines_and_log_metrics_are_read_the_same_way(tmp_path: Path) -> None:
    jdir = _job_dir(tmp_path, 0.0)
    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": math.inf}]
    (jdir / protocol.RUN_DIR / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [(b["step"], b["value"]) for b in NF.nonfinite_losses(str(jdir), RUN_OF({"metrics": "m.jsonl"}), 1, 0)] == [
        (2, "inf")]
    log = jdir / protocol.ATTEMPTS_DIR / "1" / protocol.JOB_LOG
    log.write_text("iter 10: loss 2.31\niter 20: loss nan\n")
    run = {"metrics": "log", "metrics_regex": r"iter (?P<step>\d+): loss (?P<loss>\S+)"}
    assert [(b["step"], b["kind"]) for b in NF.nonfinite_losses(str(jdir), RUN_OF(run), 1, 0)] == [(20, "log")]
    assert NF.nonfinite_losses(str(jdir), RUN_OF({}), 1, 0) == []  # gpuq's own payload: gpuq_scan reads its metrics


# --- the stacks travel home with the evidence -------------------------------------------------------------


def test_the_stacks_of_a_killed_attempt_come_home_verified_with_its_log(ctx: Context, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", name="h1")
    spec = JobSpec(name="hangs", config="c.yaml", task="classify", config_sha256="0" * 64, line=1)
    (job,) = ctx.ledger.add_sweep(sweep_id="qstall1", queue_path="q.txt", workdir="/w", queue_text="", jobs=[spec],
                                  default_retries=0)
    ctx.ledger.start_attempt(job.id, host="h1", bundle_sha=SHA)
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job.id, JobState.RUNNING)
    ctx.ledger.transition(job.id, AttemptState.LOST, attempt=1, message="deadlock_at_start: no step reached")
    ctx.ledger.transition(job.id, JobState.FAILED)
    adir = Path(host.root) / protocol.JOBS_DIR / job.id / protocol.ATTEMPTS_DIR / "1"
    adir.mkdir(parents=True)
    (adir / protocol.JOB_LOG).write_text("epoch 0\n")
    (adir / protocol.STACKS_FILE).write_text("process 7: state S (sleeping), wchan do_wait\n")
    att = ctx.ledger.attempt(job.id, 1)
    assert att is not None
    (got,) = evidence.fetch_evidence(ctx.ledger, host, [(ctx.ledger.job(job.id), att)], tmp_path / "results",
                                     tmp_path / "quarantine")
    assert got.verified and got.files == 2, got
    home = Path(got.local_dir)
    assert (home / protocol.STACKS_FILE).read_bytes() == (adir / protocol.STACKS_FILE).read_bytes()
    listed = json.loads((home / evidence.EVIDENCE_VERIFIED).read_text())["files"]
    assert sorted(f["path"] for f in listed) == [protocol.JOB_LOG, protocol.STACKS_FILE]
