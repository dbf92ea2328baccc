"""The patrol's pure rules (orchestrator/health/patrol.py) and the agent's incremental log/metrics scan."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.health.patrol import HostView, JobView, Severity, Thresholds
from tests.support.wire import host_lines, patrol, verdicts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "payload" / "agent"))

from gpuq_watch import gpuq_scan

TH = Thresholds(stall_after_s=900, startup_grace_s=600)
NOW = 1_800_000_000.0
JOB = JobView("c000000000001", "baseline", 1, launched_at=NOW - 3600)


def _rules(findings: list[patrol.Finding]) -> list[tuple[str, str]]:
    return [(f.rule, f.severity.value) for f in findings]


@pytest.mark.parametrize(("used", "inodes", "expected"), [
    (50, 10, []),
    (90, 10, [("disk", "warn")]),
    (95, 10, [("disk", "escalate")]),
    (99.5, 96, [("disk", "escalate"), ("inodes", "escalate")]),
    (10, 91, [("inodes", "warn")]),
])
def test_disk_and_inode_thresholds(used: float, inodes: float, expected: list[tuple[str, str]]) -> None:
    doc = {"disk": {"used_pct": used, "inodes_used_pct": inodes, "path": "/data"}}
    assert _rules(patrol.host_findings(HostView("h"), doc, TH)) == expected


def test_memory_warns_above_90_and_a_new_oom_kill_escalates() -> None:
    assert _rules(patrol.host_findings(HostView("h", oom_kill=0), {"memory": {"used_pct": 90.0, "oom_kill": 0}},
                                       TH)) == []
    found = patrol.host_findings(HostView("h", oom_kill=2), {"memory": {"used_pct": 93.0, "oom_kill": 3}}, TH)
    assert _rules(found) == [("memory", "warn"), ("oom_kill", "escalate")]
    # the first probe of a host has no previous count: no verdict on a counter that was already high
    assert _rules(patrol.host_findings(HostView("h"), {"memory": {"oom_kill": 7}}, TH)) == []
    assert (found[1].message, found[1].host) == ("host OOM: oom_kill counter 2 -> 3", "h")


@pytest.mark.parametrize(("before", "now", "escalates"), [
    (2, 3, True), (2, 2, False),
    (5, 0, False),  # the counter went back (a reboot resets it): no new kill, nothing to escalate
    (5, 4, False),
])
def test_only_a_rising_oom_kill_counter_escalates(before: int, now: int, escalates: bool) -> None:
    found = patrol.host_findings(HostView("h", oom_kill=before), {"memory": {"oom_kill": now}}, TH)
    assert _rules(found) == ([("oom_kill", "escalate")] if escalates else [])


def test_xid_48_and_79_escalate_other_xids_warn() -> None:
    doc = {"kernel": {"xids": [{"code": 79, "line": "NVRM: Xid (PCI:0000:3b:00): 79"},
                               {"code": 13, "line": "NVRM: Xid (PCI:0000:3b:00): 13"},
                               {"code": 48, "line": "NVRM: Xid (PCI:0000:3b:00): 48"}]}}
    assert _rules(patrol.host_findings(HostView("h"), doc, TH)) == [
        ("xid", "escalate"), ("xid", "warn"), ("xid", "escalate")]


def _running(**kw: object) -> dict[str, object]:
    entry: dict[str, object] = {"state": "running", "heartbeat_age_s": 5.0, "log_mtime": NOW - 5,
                                "heartbeat": {"step": 41}, "ckpt": {"mtime": NOW - 100}}
    entry.update(kw)
    return entry


def test_stalled_needs_every_signal_stale_while_the_group_lives() -> None:
    assert patrol.job_findings("h", JOB, _running(), NOW, TH) == []
    # a stale heartbeat alone is not a stall: the log still moves (an eval loop, a slow loader)
    assert patrol.job_findings("h", JOB, _running(heartbeat_age_s=2000.0), NOW, TH) == []
    stale = _running(heartbeat_age_s=2000.0, log_mtime=NOW - 1000, ckpt={"mtime": NOW - 1500})
    (found,) = patrol.job_findings("h", JOB, stale, NOW, TH)
    assert found.rule == "stalled" and found.severity == Severity.ESCALATE and "step 41" in found.message
    # a job that exited is never "stalled", whatever its files say
    assert patrol.job_findings("h", JOB, dict(stale, state="exited"), NOW, TH) == []


def test_a_starting_job_gets_its_grace() -> None:
    young = JobView("c1", "j", 1, launched_at=NOW - 300)
    entry = {"state": "running", "heartbeat_age_s": None, "log_mtime": NOW - 300, "ckpt": None}
    assert patrol.job_findings("h", young, entry, NOW, TH) == []
    old = JobView("c1", "j", 1, launched_at=NOW - 2000)
    (found,) = patrol.job_findings("h", old, dict(entry, log_mtime=NOW - 2000), NOW, TH)
    assert found.rule == "stalled" and "heartbeat never" in found.message


def test_the_start_up_grace_covers_only_a_job_without_a_heartbeat_yet() -> None:
    """With a grace longer than the stall limit, a job that has not beaten yet is left alone for the
    whole grace, even with a quiet log; one that has a heartbeat is judged by the stall limit."""
    th = Thresholds(stall_after_s=900, startup_grace_s=1200)
    starting = JobView("c1", "j", 1, launched_at=NOW - 1000)
    quiet = {"state": "running", "heartbeat_age_s": None, "log_mtime": NOW - 950, "ckpt": None}
    assert patrol.job_findings("h", starting, quiet, NOW, th) == []
    (found,) = patrol.job_findings("h", starting, dict(quiet, heartbeat_age_s=950.0), NOW, th)
    assert found.rule == "stalled" and "heartbeat 950s ago" in found.message
    late = JobView("c1", "j", 1, launched_at=NOW - 1300)
    (found,) = patrol.job_findings("h", late, quiet, NOW, th)
    assert found.rule == "stalled" and "heartbeat never" in found.message


def test_crash_signatures_and_nan_from_the_scan() -> None:
    entry = _running(scan={"hits": [{"signature": "cuda_oom", "line": "torch.OutOfMemoryError: CUDA out of memory"}],
                           "traceback": ["Traceback (most recent call last):", "torch.OutOfMemoryError: x"],
                           "nonfinite": [{"field": "loss", "value": "nan", "step": 7}]})
    found = patrol.job_findings("h", JOB, entry, NOW, TH)
    assert _rules(found) == [("crash", "escalate"), ("nan", "escalate")]
    assert found[0].signatures == ("cuda_oom",) and found[0].action.startswith("signatures: cuda_oom; ")
    assert found[0].reason == "torch.OutOfMemoryError: CUDA out of memory"  # the first hit's line, without the name
    assert found[0].evidence[0].startswith("Traceback")


@pytest.mark.parametrize(("code", "trainer", "hits", "tb", "kw", "klass"), [
    (4, 4, [], [], {}, "config"),
    (3, 3, [], [], {}, "transient"),
    (1, None, ["nccl"], [], {}, "transient"),
    (1, None, ["traceback"], ["Traceback (most recent call last):", "KeyError: 'lr'"], {}, "config"),
    (1, None, ["nonfinite_loss"], [], {}, "divergence"),
    (1, None, ["cuda_oom"], [], {}, "gpu_oom"),
    (1, None, ["disk_full"], [], {}, "disk_full"),
    (81, None, [], [], {}, "disk_full"),
    (82, None, [], [], {}, "control_plane"),
    (143, 143, [], [], {}, "stopped"),
    (143, 1, ["stopped_by_signal"], [], {}, "stopped"),
    (137, None, [], [], {"oom_kill_rose": True}, "host_oom"),
    (137, -9, [], [], {"oom_kill_rose": True}, "host_oom"),
    (137, -9, ["killed"], [], {}, "host_oom"),  # a bare "Killed" in the log
    (137, -9, [], [], {}, "killed"),  # kill -9 of the ranks, the wrapper survives: no OOM evidence
    (134, -6, [], [], {}, "killed"),
    (1, 1, [], [], {"wrapper_signal": 15}, "stopped"),  # a peer vanished first: the survivor exits 1
    (4, 4, [], [], {"wrapper_signal": 15}, "stopped"),  # a stop whatever the trainer's code
    (137, -9, [], [], {"wrapper_signal": 15}, "stopped"),  # the grace ran out
    (130, -2, [], [], {}, "stopped"),
    (137, -9, ["cuda_oom"], [], {}, "gpu_oom"),
    (1, 1, ["child_failed", "rank_killed"], [], {}, "killed"),  # torchrun: a rank died of SIGKILL
    (1, 1, ["child_failed", "rank_killed"], [], {"oom_kill_rose": True}, "host_oom"),
    (1, 1, ["child_failed", "rank_terminated"], [], {}, "stopped"),
    (None, None, ["rank_killed"], [], {}, "vanished"),  # no exit record: the vanished rules decide
    (None, None, [], [], {}, "vanished"),
    (None, None, [], [], {"rebooted": True}, "transient"),
    (1, None, ["traceback"], ["Traceback (most recent call last):", "RuntimeError: boom"], {}, "unknown"),
])
def test_classification(code: int | None, trainer: int | None, hits: list[str], tb: list[str],
                        kw: dict[str, Any], klass: str) -> None:
    assert verdicts.classify(code, trainer, [{"signature": h} for h in hits], tb, **kw) == klass


def test_retry_policy() -> None:
    assert verdicts.decide("vanished", 1, 2).action == "requeue"
    assert verdicts.decide("stalled", 2, 2).action == "requeue"
    assert verdicts.decide("stalled", 3, 2).action == "keep_lost"
    assert verdicts.decide("stopped", 1, 2).action == "requeue"  # a SIGTERM from outside is no verdict
    assert verdicts.decide("config", 1, 10).action == "fail"  # never blind-retried
    assert verdicts.decide("divergence", 1, 10).action == "fail"
    assert verdicts.decide("gpu_oom", 1, 10).action == "none"
    # a signal death gpuq did not cause: retried with resume within retries=
    assert verdicts.decide("killed", 2, 2).action == "requeue"
    assert verdicts.decide("killed", 3, 2).action == "keep_lost"
    assert verdicts.decide("host_oom", 1, 2).action == "requeue"


def test_early_finish_only_under_half_the_expectation() -> None:
    found = patrol.early_finish("h", JOB, 100.0, 300.0, TH)
    assert found is not None
    assert (found.rule, found.severity, found.host, found.job) == ("early_finish", Severity.WARN, "h", JOB.job_id)
    assert found.message == "baseline: succeeded in 100s, under 50% of the expected 300s"
    assert found.action.startswith("suspect early finish: check the metrics")
    assert patrol.early_finish("h", JOB, 149.0, 300.0, TH) is not None
    assert patrol.early_finish("h", JOB, 150.0, 300.0, TH) is None  # exactly half is not early
    assert patrol.early_finish("h", JOB, 160.0, 300.0, TH) is None
    assert patrol.early_finish("h", JOB, 100.0, None, TH) is None
    assert patrol.early_finish("h", JOB, 100.0, 0.0, TH) is None
    assert patrol.early_finish("h", JOB, None, 300.0, TH) is None


def test_unreachable_warns_then_escalates_after_three_failures_and_ten_minutes() -> None:
    early = patrol.unreachable(HostView("h", unreachable_since=NOW - 60, probe_failures=3), "timed out", NOW, TH)
    late = patrol.unreachable(HostView("h", unreachable_since=NOW - 900, probe_failures=3), "timed out", NOW, TH)
    auth = patrol.unreachable(HostView("h", unreachable_since=NOW, probe_failures=1), "auth failed", NOW, TH)
    assert (early.severity, late.severity, auth.severity) == (Severity.WARN, Severity.ESCALATE, Severity.ESCALATE)
    assert "provider console" in late.action


def test_one_line_per_host() -> None:
    doc = {"jobs": [{"state": "running", "name": "det", "attempt": 1,
                     "heartbeat": {"step": 41200, "epoch": 17, "epochs": 50}}],
           "disk": {"used_pct": 71, "inodes_used_pct": 8}, "memory": {"used_pct": 64},
           "gpus": [{"util_pct": 96}, {"util_pct": 98}]}
    line = host_lines.host_line("h2", doc, [])
    assert line == "PATROL h2 running det:a1=step=41200 ep=17/50 disk=71% ino=8% mem=64% gpu=97%"
    down = host_lines.host_line("h3", None, [], unreachable_since=NOW, failures=3, next_try=NOW + 480)
    assert down.startswith("PATROL h3 unreachable since ") and "3 failures, next try" in down


# --- the agent's scan ---------------------------------------------------------------------------


def test_scan_reads_only_new_whole_lines_and_shrinks_restart(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("epoch 1 ok\nTraceback (most recent call last):\n  File \"x\", line 1\nKeyError: 'lr'\npart")
    first = gpuq_scan.scan_log(str(log), 0)
    assert [h["signature"] for h in first["hits"]] == ["traceback"]
    assert first["traceback"][-1] == "KeyError: 'lr'"
    assert first["log_to"] == log.stat().st_size - len("part")  # the half line waits for the next tick
    again = gpuq_scan.scan_log(str(log), first["log_to"])
    assert again["hits"] == [] and again["log_to"] == first["log_to"]
    log.write_text("Killed\n")  # shorter than the offset: a new file, scanned from 0
    assert [h["signature"] for h in gpuq_scan.scan_log(str(log), first["log_to"])["hits"]] == ["killed"]


def test_scan_never_matches_a_bare_error_word(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("val error rate 0.1\nErrorHandler ready\nmean_error=0.3 loss=0.25\n")
    assert gpuq_scan.scan_log(str(log), 0)["hits"] == []


def test_metrics_scan_finds_nan_and_inf(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [{"kind": "train", "step": 1, "loss": 0.5}, {"kind": "train", "step": 2, "loss": float("nan")},
             {"kind": "eval", "step": 2, "val_loss": float("inf")}]
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"kind": "train", "st')
    out = gpuq_scan.scan_metrics(str(metrics), 0)
    assert [(x["step"], x["field"]) for x in out["nonfinite"]] == [(2, "loss"), (2, "val_loss")]
    assert out["metrics_to"] == metrics.stat().st_size - len('{"kind": "train", "st')
    assert gpuq_scan.scan_metrics(str(metrics), out["metrics_to"])["nonfinite"] == []


def test_scan_args_are_validated() -> None:
    assert gpuq_scan.parse_scan_args(["c1:2:30:40"]) == {"c1": (2, 30, 40)}
    for bad in ("c1:2:30", "../x:1:0:0", ":1:0:0", "c1:a:0:0"):
        with pytest.raises(ValueError):
            gpuq_scan.parse_scan_args([bad])


def test_a_traceback_that_ends_in_a_signal_is_a_stop_not_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\n  File \"run.py\", line 9\n"
                   "torch.distributed.elastic.multiprocessing.api.SignalException: Process 48 got signal: 15\n")
    scan = gpuq_scan.scan_log(str(log), 0)
    assert [h["signature"] for h in scan["hits"]] == ["stopped_by_signal"]
    assert patrol.job_findings("h", JOB, _running(scan=scan), NOW, TH) == []


def test_torchrun_reports_which_signal_killed_a_rank() -> None:
    def names(text: str) -> set[str]:
        return {name for name, rx in gpuq_scan.SIGNATURES if rx.search(text)}

    killed = "E1123 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 20576) of binary: python"
    assert "rank_killed" in names(killed) and "rank_terminated" not in names(killed)
    assert "rank_killed" in names("  traceback : Signal 9 (SIGKILL) received by PID 20576")
    assert "rank_killed" in names("  traceback : Signal 6 (SIGABRT) received by PID 1")
    term = "  traceback : Signal 15 (SIGTERM) received by PID 20576"
    assert "rank_terminated" in names(term) and "rank_killed" not in names(term)
    assert "rank_terminated" in names("failed (exitcode: -15) local_rank: 1 (pid: 7)")
    assert not names("failed (exitcode: 1) local_rank: 0 (pid: 7)") & {"rank_killed", "rank_terminated"}


def test_a_trainer_without_heartbeat_lives_by_its_log_and_checkpoint_glob() -> None:
    """A project's own trainer writes no heartbeat: its log growth and the mtime of the files its
    checkpoint globs match keep it alive; when both are quiet it is stalled, with its last log line."""
    quiet_log = {"state": "running", "heartbeat": None, "heartbeat_age_s": None, "log_mtime": NOW - 2000,
                 "ckpt": None, "progress": {"step": 120, "line": "Epoch 3 | step 120"}}
    assert patrol.job_findings("h", JOB, dict(quiet_log, run_ckpt_mtime=NOW - 60), NOW, TH) == []
    assert patrol.job_findings("h", JOB, dict(quiet_log, log_mtime=NOW - 10), NOW, TH) == []
    (found,) = patrol.job_findings("h", JOB, dict(quiet_log, run_ckpt_mtime=NOW - 1800), NOW, TH)
    assert found.rule == "stalled" and "last step 120" in found.message
    assert "last log line: Epoch 3 | step 120" in found.message


def test_a_real_torchrun_stopped_by_sigterm_is_a_stop_and_its_resume_is_read() -> None:
    """torchrun 2.11 on an H200 (scripts/gpu_check.py's resume check, 2026-11-26): SIGTERM to torchrun, the
    payload's checkpoint at the signal, torchrun's SignalException traceback, then the relaunch's marker."""
    log = Path(__file__).resolve().parents[1] / "fixtures" / "torchrun" / "sigterm-h200-torch-2.11.log"
    scan = gpuq_scan.scan_log(str(log), 0)
    assert [h["signature"] for h in scan["hits"]] == ["stopped_by_signal"]
    assert scan["traceback"][-1].startswith("torch.distributed.elastic.multiprocessing.api.SignalException: "
                                            "Process 641 got signal: 15")
    assert scan["resumed"] == {"step": 9, "epoch": 0,
                               "sha256": "907dfdb78d865378bc631d5a5df3a9ad5929d2f660e841a8a673d2637cc66081"}
    assert patrol.job_findings("h", JOB, _running(scan=scan), NOW, TH) == []
