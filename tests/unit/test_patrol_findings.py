"""The patrol's findings word for word: what `gpuq status`, the event log and the escalations show.

tests/unit/test_patrol_rules.py checks which rule fires; this file checks each finding's exact
message, action, severity, subject and evidence, the boundaries of every threshold, and the one
line per host, so a changed word or an off-by-one in a rule fails here (scripts/mutation.py patrol).
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.health.patrol import Finding, HostView, JobView, Severity, Thresholds
from orchestrator.health.verdicts import Decision
from orchestrator.ledger import migrate
from tests.support.wire import host_lines, patrol, verdicts

TH = Thresholds()
NOW = 1_800_000_000.0  # 2027-01-15 08:00:00Z
JOB = JobView("c000000000001", "baseline", 2, launched_at=NOW - 3600)


# --- unreachable --------------------------------------------------------------------------------


def test_unreachable_warns_with_its_stamp_and_the_retry_promise() -> None:
    found = patrol.unreachable(HostView("h1", unreachable_since=NOW - 900, probe_failures=2), "timed out", NOW, TH)
    assert found == Finding("unreachable", Severity.WARN, "h1", "unreachable since 07:45Z: timed out",
                            "jobs keep running detached; gpuq retries with backoff")
    first = patrol.unreachable(HostView("h1"), "refused", NOW, TH)  # no `since` yet: now
    assert first.message == "unreachable since 08:00Z: refused" and first.severity == Severity.WARN


@pytest.mark.parametrize(("failures", "since_s", "severity"), [
    (3, 600.0, Severity.ESCALATE),  # both limits reached exactly
    (3, 599.0, Severity.WARN),
    (2, 6000.0, Severity.WARN),
    (9, 0.0, Severity.WARN),
])
def test_unreachable_escalates_only_after_three_failures_and_ten_minutes(
        failures: int, since_s: float, severity: Severity) -> None:
    found = patrol.unreachable(HostView("h1", unreachable_since=NOW - since_s, probe_failures=failures),
                               "timed out", NOW, TH)
    assert found.severity == severity
    if severity == Severity.ESCALATE:
        assert found.message == f"unreachable since 07:50Z ({failures} failed probes): timed out"
        assert found.action == "check the provider console for balance, power or preemption"


@pytest.mark.parametrize("error", ["Authentication failed.", "AUTH denied", "Host key for [h]:22 changed"])
def test_an_auth_or_host_key_failure_escalates_at_once(error: str) -> None:
    found = patrol.unreachable(HostView("h1", unreachable_since=NOW, probe_failures=1), error, NOW, TH)
    assert found == Finding("unreachable", Severity.ESCALATE, "h1", f"unreachable (auth) since 08:00Z: {error}",
                            "fix the key or credentials; gpuq will not retry blindly")


# --- host rules ---------------------------------------------------------------------------------


def test_disk_and_inode_findings_word_for_word() -> None:
    doc = {"disk": {"used_pct": 95.4, "inodes_used_pct": 90.0, "path": "/workspace"}}
    disk, inodes = patrol.host_findings(HostView("h1"), doc, TH)
    assert disk == Finding("disk", Severity.ESCALATE, "h1", "disk 95% used on /workspace",
                           "the host gets no new job until space is freed: prune *.tmp, rolling checkpoints of "
                           "finished jobs, caches; or move to a bigger disk")
    assert inodes == Finding("inodes", Severity.WARN, "h1", "inodes 90% used on /workspace",
                             "free space before it fills")
    (unnamed,) = patrol.host_findings(HostView("h1"), {"disk": {"used_pct": 91}}, TH)
    assert unnamed.message == "disk 91% used on the data dir"


@pytest.mark.parametrize(("pct", "rules"), [
    (89.9, []), (90.0, [("disk", Severity.WARN)]), (94.9, [("disk", Severity.WARN)]),
    (95.0, [("disk", Severity.ESCALATE)]),
    (True, []), ("97", []), (None, []),  # not a number: no verdict
])
def test_disk_thresholds_are_inclusive(pct: Any, rules: list[tuple[str, Severity]]) -> None:
    found = patrol.host_findings(HostView("h1"), {"disk": {"used_pct": pct}}, TH)
    assert [(f.rule, f.severity) for f in found] == rules


def test_memory_is_strictly_above_its_limit_and_names_the_source() -> None:
    assert patrol.host_findings(HostView("h1"), {"memory": {"used_pct": 90.0}}, TH) == []
    (found,) = patrol.host_findings(HostView("h1"), {"memory": {"used_pct": 90.6}}, TH)
    assert found == Finding("memory", Severity.WARN, "h1", "memory 91% of the cgroup limit",
                            "OOM risk: see the attempt's mem.tsv; fewer loader workers or smaller eval buffers")
    (host,) = patrol.host_findings(HostView("h1"), {"memory": {"used_pct": 97, "source": "host"}}, TH)
    assert host.message == "memory 97% of the host limit"
    custom = Thresholds(memory_warn_pct=50.0, disk_warn_pct=10.0, disk_escalate_pct=20.0)
    assert [f.rule for f in patrol.host_findings(HostView("h1"), {"memory": {"used_pct": 51}}, custom)] == ["memory"]
    found = patrol.host_findings(HostView("h1"), {"disk": {"used_pct": 15}}, custom)
    assert [(f.rule, f.severity) for f in found] == [("disk", Severity.WARN)]


def test_an_oom_kill_counter_that_is_not_an_integer_is_ignored() -> None:
    assert patrol.host_findings(HostView("h1", oom_kill=1), {"memory": {"oom_kill": "5"}}, TH) == []
    (found,) = patrol.host_findings(HostView("h1", oom_kill=0), {"memory": {"oom_kill": 1}}, TH)
    assert found == Finding("oom_kill", Severity.ESCALATE, "h1", "host OOM: oom_kill counter 0 -> 1",
                            "show the memory trace; retry only once the cause is removed")


def test_xid_findings_word_for_word() -> None:
    doc = {"kernel": {"xids": [{"code": 48, "line": "NVRM: Xid 48"}, {"code": 79, "line": "NVRM: Xid 79"},
                               {"code": 31, "line": "NVRM: Xid 31"}, {"line": "no code"}, "NVRM: a bare string"]}}
    ecc, bus, other = patrol.host_findings(HostView("h1"), doc, TH)
    action = "host marked unhealthy: no new jobs; its jobs resume elsewhere"
    assert ecc == Finding("xid", Severity.ESCALATE, "h1", "Xid 48 (double-bit ECC error)", action,
                          evidence=("NVRM: Xid 48",))
    assert bus == Finding("xid", Severity.ESCALATE, "h1", "Xid 79 (GPU fell off the bus)", action,
                          evidence=("NVRM: Xid 79",))
    assert other == Finding("xid", Severity.WARN, "h1", "Xid 31 in the kernel log",
                            "usually an application fault; check the job's log", evidence=("NVRM: Xid 31",))


def test_an_older_crash_findings_signatures_are_the_names_before_the_first_semicolon() -> None:
    """v17 moves them from a v4-v16 crash finding's action into its ``signatures`` field."""
    assert migrate._v17_signatures_of("signatures: cuda_oom, traceback; triage: x, y") == '["cuda_oom", "traceback"]'
    assert migrate._v17_signatures_of("signatures: nccl") == '["nccl"]'
    assert migrate._v17_signatures_of("signatures: , ; z") == "unknown"
    assert migrate._v17_signatures_of("triage: signatures: nccl") == "unknown"


# --- job rules ----------------------------------------------------------------------------------


def test_a_crash_finding_word_for_word() -> None:
    entry = {"state": "exited", "scan": {"hits": [
        {"signature": "stopped_by_signal", "line": "SignalException: got signal: 15"},
        "not a dict",
        {"signature": "traceback", "line": "Traceback (most recent call last):"},
        {"signature": "cuda_oom", "line": "torch.OutOfMemoryError: CUDA out of memory"},
    ]}}
    (found,) = patrol.job_findings("h1", JOB, entry, NOW, TH)
    assert found == Finding("crash", Severity.ESCALATE, "h1", "baseline a2: Traceback (most recent call last):",
                            "signatures: cuda_oom, traceback; triage from the traceback: gpuq logs c000000000001",
                            job="c000000000001", evidence=("Traceback (most recent call last):",))
    with_tb = dict(entry, scan=dict(entry["scan"], traceback=["Traceback (most recent call last):", "KeyError: 1"]))
    (found,) = patrol.job_findings("h1", JOB, with_tb, NOW, TH)
    assert found.evidence == ("Traceback (most recent call last):", "KeyError: 1")


def test_a_nan_finding_word_for_word() -> None:
    entry = {"state": "exited", "scan": {"nonfinite": ["junk", {"field": "loss", "value": "nan", "step": 7},
                                                       {"field": "val_loss", "value": "inf", "step": 9}]}}
    (found,) = patrol.job_findings("h1", JOB, entry, NOW, TH)
    assert found == Finding("nan", Severity.ESCALATE, "h1", "baseline: non-finite loss=nan at step 7",
                            "divergence: no automatic retry", job="c000000000001")


def _running(**kw: object) -> dict[str, object]:
    entry: dict[str, object] = {"state": "running", "heartbeat_age_s": 2000.0, "log_mtime": NOW - 1000,
                                "heartbeat": {"step": 41}, "ckpt": {"mtime": NOW - 1500}}
    entry.update(kw)
    return entry


def test_a_stall_finding_word_for_word() -> None:
    (found,) = patrol.job_findings("h1", JOB, _running(), NOW, TH)
    assert found == Finding("stalled", Severity.ESCALATE, "h1",
                            "baseline a2: stalled: heartbeat 2000s ago, nothing written for 1000s (last step 41)",
                            "kill the attempt and requeue it with resume if retries are left", job="c000000000001")


@pytest.mark.parametrize(("freshest", "stalled"), [(900.0, False), (901.0, True)])
def test_stalled_is_strictly_past_the_limit(freshest: float, stalled: bool) -> None:
    entry = _running(heartbeat_age_s=freshest, log_mtime=NOW - freshest, ckpt={"mtime": NOW - freshest})
    assert [f.rule for f in patrol.job_findings("h1", JOB, entry, NOW, TH)] == (["stalled"] if stalled else [])


@pytest.mark.parametrize(("age", "stalled"), [(600.0, False), (601.0, True)])
def test_a_job_is_judged_only_once_it_ran_longer_than_the_stall_limit(age: float, stalled: bool) -> None:
    """A heartbeat from a previous attempt's files must not stall a job that just started: the
    launch must lie further back than min(stall limit, start-up grace)."""
    job = JobView("c1", "j", 1, launched_at=NOW - age)
    entry = _running(heartbeat_age_s=5000.0, log_mtime=NOW - 5000, ckpt=None)
    assert [f.rule for f in patrol.job_findings("h1", job, entry, NOW, TH)] == (["stalled"] if stalled else [])


def test_without_a_launch_time_the_agents_stamp_counts_and_without_any_the_files_do() -> None:
    nolaunch = JobView("c1", "j", 1)
    young = _running(heartbeat_age_s=None, log_mtime=None, ckpt=None, launched_at="2027-01-15T07:55:00Z")
    assert patrol.job_findings("h1", nolaunch, young, NOW, TH) == []  # 300 s: within the start-up grace
    old = dict(young, launched_at="2027-01-15T07:40:00Z")
    (found,) = patrol.job_findings("h1", nolaunch, old, NOW, TH)  # 1200 s, never a heartbeat, nothing written
    assert found.message == "j a1: stalled: heartbeat never, nothing written for 1200s (last step 41)"
    # no launch stamp at all and stale files: judged by the files alone
    (found,) = patrol.job_findings("h1", nolaunch, _running(), NOW, TH)
    assert found.rule == "stalled"
    assert patrol.job_findings("h1", nolaunch, _running(heartbeat_age_s=None, log_mtime=None, ckpt=None), NOW,
                               TH) == []  # nothing at all to judge by


def test_a_stall_without_a_heartbeat_names_the_last_log_step_and_line() -> None:
    entry = {"state": "running", "heartbeat": None, "heartbeat_age_s": None, "log_mtime": NOW - 2000, "ckpt": "x",
             "progress": {"step": 120, "line": "Epoch 3 | step 120"}}
    (found,) = patrol.job_findings("h1", JOB, entry, NOW, TH)
    assert found.message == ("baseline a2: stalled: heartbeat never, nothing written for 2000s (last step 120); "
                             "last log line: Epoch 3 | step 120")


def test_a_heartbeat_that_is_not_a_number_counts_as_none() -> None:
    entry = _running(heartbeat_age_s="10", log_mtime=NOW - 1000, ckpt=None)
    (found,) = patrol.job_findings("h1", JOB, entry, NOW, TH)
    assert "heartbeat never, nothing written for 1000s" in found.message
    assert patrol.job_findings("h1", JOB, _running(heartbeat_age_s=True, log_mtime=NOW - 10), NOW, TH) == []


# --- ended badly, early finish, policy ---------------------------------------------------------


def test_ended_badly_names_the_rule_and_severity_follows_the_requeue() -> None:
    dead = patrol.ended_badly("h1", JOB, "lost", "vanished", verdicts.Decision("requeue", "vanished: requeued"), True)
    assert dead == Finding("dead", Severity.WARN, "h1",
                           "baseline a2: process group gone without an exit record (class: vanished)",
                           "vanished: requeued", job="c000000000001")
    rebooted = patrol.ended_badly("h1", JOB, "lost", "transient", verdicts.Decision("fail", "r"), False, rebooted=True)
    assert (rebooted.rule, rebooted.severity, rebooted.message) == (
        "rebooted", Severity.ESCALATE, "baseline a2: the host rebooted (class: transient)")
    failed = patrol.ended_badly("h1", JOB, "exited", "unknown", verdicts.Decision("fail", "r"), False,
                                message="exit 1: trainer exited 1")
    assert (failed.rule, failed.message) == ("failed", "baseline a2: exit 1: trainer exited 1 (class: unknown)")
    plain = patrol.ended_badly("h1", JOB, "exited", "unknown", verdicts.Decision("requeue", "r"), True)
    assert (plain.severity, plain.message) == (Severity.WARN, "baseline a2: exited non-zero (class: unknown)")


def test_an_ended_attempts_finding_keeps_the_decisions_words_apart_from_its_next_step() -> None:
    """The escalation's line quotes the decision without its command (tick/findings.py), from the field."""
    decision = verdicts.decide("transient", 2, 1)
    ended = patrol.ended_badly("h1", JOB, "exited", "transient", decision, False)
    assert ended.action == "transient: no retries left (1); `gpuq resume` once the cause is fixed"
    assert ended.decision == "transient: no retries left (1)"


def test_early_finish_follows_the_ratio() -> None:
    th = Thresholds(early_finish_ratio=0.25)
    assert patrol.early_finish("h1", JOB, 74.0, 300.0, th) is not None
    assert patrol.early_finish("h1", JOB, 75.0, 300.0, th) is None
    found = patrol.early_finish("h1", JOB, 10.0, 300.0, th)
    assert found is not None and found.message == "baseline: succeeded in 10s, under 25% of the expected 300s"
    assert found.action == ("suspect early finish: check the metrics; `gpuq submit` the line again for an "
                            "identical rerun")


def test_every_decision_word_for_word() -> None:
    assert verdicts.decide("config", 1, 3) == Decision("fail", "config error: never retried (fix it and submit again)")
    assert verdicts.decide("divergence", 1, 3) == Decision(
        "fail", "divergence error: never retried (fix it and submit again)")
    assert verdicts.decide("transient", 1, 1) == Decision("requeue", "transient: requeued with resume (retry 1 of 1)")
    assert verdicts.decide("transient", 2, 1) == Decision(
        "keep_lost", "transient: no retries left (1)", "`gpuq resume` once the cause is fixed")
    assert verdicts.decide("transient", 2, 1).reason == ("transient: no retries left (1); "
                                                      "`gpuq resume` once the cause is fixed")
    assert verdicts.decide("vanished", 0, 0) == Decision("requeue", "vanished: requeued with resume (retry 0 of 0)")
    for klass in ("gpu_oom", "disk_full", "control_plane", "unknown"):
        assert verdicts.decide(klass, 1, 5) == Decision("none", f"{klass}: not retried automatically; see `gpuq logs`")
    assert {"transient", "vanished", "stalled", "stopped", "killed", "host_oom"} == verdicts.RETRYABLE


@pytest.mark.parametrize(("code", "trainer", "hits", "tb", "kw", "klass"), [
    (1, 4, [], [], {}, "config"),  # the trainer's own config exit under a wrapper that exited 1
    (1, None, ["state_dict"], [], {}, "config"),
    (1, 3, [], [], {}, "transient"),
    (1, 143, [], [], {}, "stopped"),
    (81, None, ["traceback"], [], {}, "disk_full"),
    (1, None, [], [], {"rebooted": True}, "transient"),
    (1, None, [], ["Traceback (most recent call last):", "ValueError: bad", "  ", ""], {}, "config"),
    (1, None, [], ["ModuleNotFoundError: No module named 'x'"], {}, "config"),
    (1, None, [], ["RuntimeError: ValueError: inside"], {}, "unknown"),
    (1, None, [], [], {}, "unknown"),
    (137, None, ["nonfinite_loss"], [], {}, "divergence"),
])
def test_more_classifications(code: int | None, trainer: int | None, hits: list[str], tb: list[str],
                              kw: dict[str, Any], klass: str) -> None:
    assert verdicts.classify(code, trainer, [{"signature": h} for h in hits], tb, **kw) == klass


# --- timestamps and the one line per host --------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (NOW, NOW), (1800000000, NOW), ("2027-01-15T08:00:00Z", NOW), ("2027-01-15T08:00:00+00:00", NOW),
    ("2027-01-15T09:00:00+01:00", NOW), (True, None), ("", None), ("yesterday", None), (None, None), ([1], None),
])
def test_timestamps(value: Any, expected: float | None) -> None:
    assert patrol.timestamp(value) == expected


def test_host_line_before_any_probe_and_while_unreachable() -> None:
    assert host_lines.host_line("h1", None, []) == "PATROL h1 not probed"
    assert host_lines.host_line("h1", None, [], error="no agent yet") == "PATROL h1 no agent yet"
    assert host_lines.host_line("h1", None, [], unreachable_since=NOW - 900, failures=2) == (
        "PATROL h1 unreachable since 07:45Z (2 failures)")
    assert host_lines.host_line("h1", None, [], failures=1, next_try=NOW + 480) == (
        "PATROL h1 unreachable since now (1 failures, next try 08:08:00Z)")


def test_host_line_lists_three_jobs_and_counts_the_rest() -> None:
    jobs: list[dict[str, Any]] = [
        {"state": "running", "name": "a", "attempt": 1, "heartbeat": {"step": 5, "epoch": 1, "epochs": 3}},
        {"state": "running", "job_id": "c2", "attempt": 2},
        {"state": "exited", "name": "gone", "attempt": 1},
        {"state": "running", "name": "c", "attempt": 1, "heartbeat": {}},
        {"state": "running", "name": "d", "attempt": 1},
        {"state": "running", "name": "e", "attempt": 1},
    ]
    doc = {"jobs": jobs, "disk": {"used_pct": 12}, "gpus": [{"util_pct": 50}, {"util_pct": "n/a"}, {}]}
    warn = Finding("disk", Severity.WARN, "h1", "m")
    line = host_lines.host_line("h1", doc, [Finding("x", Severity.INFO, "h1", "i"), warn], done=(3, 9))
    assert line == ("PATROL h1 running [warn] a:a1=step=5 ep=1/3 c2:a2=starting c:a1=starting more=2 disk=12% "
                    "ino=?% mem=?% gpu=50% done=3/9")
    escalate = Finding("xid", Severity.ESCALATE, "h1", "m")
    assert (host_lines.host_line("h1", {"jobs": []}, [warn, escalate])
            == "PATROL h1 idle [escalate] disk=?% ino=?% mem=?%")
    info = Finding("x", Severity.INFO, "h1", "i")
    assert host_lines.host_line("h1", {}, [info]) == "PATROL h1 idle disk=?% ino=?% mem=?%"


def test_a_finding_names_its_job_or_else_its_host() -> None:
    assert Finding("disk", Severity.WARN, "h1", "m").subject == "h1"
    assert Finding("nan", Severity.WARN, "h1", "m", job="c1").subject == "c1"
    assert [s.value for s in sorted(patrol.SEVERITY_RANK, key=patrol.SEVERITY_RANK.__getitem__)] == [
        "info", "warn", "escalate"]


def test_the_long_unreachable_finding_names_its_rule_and_host() -> None:
    found = patrol.unreachable(HostView("h9", unreachable_since=NOW - 700, probe_failures=4), "timed out", NOW, TH)
    assert (found.rule, found.host, found.severity, found.job) == ("unreachable", "h9", Severity.ESCALATE, None)


def test_a_fresh_checkpoint_alone_keeps_a_job_alive() -> None:
    entry = _running(heartbeat_age_s=2000.0, log_mtime=NOW - 1000, ckpt={"mtime": NOW - 100})
    assert patrol.job_findings("h1", JOB, entry, NOW, TH) == []
    assert [f.rule for f in patrol.job_findings("h1", JOB, dict(entry, ckpt={"mtime": NOW - 950}), NOW, TH)] == [
        "stalled"]


def test_the_start_up_grace_ends_exactly_at_its_limit() -> None:
    th = Thresholds(stall_after_s=900, startup_grace_s=1200)
    entry = {"state": "running", "heartbeat_age_s": None, "log_mtime": NOW - 1000, "ckpt": None}
    assert patrol.job_findings("h1", JobView("c1", "j", 1, launched_at=NOW - 1199), entry, NOW, th) == []
    (found,) = patrol.job_findings("h1", JobView("c1", "j", 1, launched_at=NOW - 1200), entry, NOW, th)
    assert found.rule == "stalled"


def test_a_job_with_a_heartbeat_is_not_quoted_its_log_line() -> None:
    entry = _running(progress={"step": 9, "line": "Epoch 1 | step 9"})
    (found,) = patrol.job_findings("h1", JOB, entry, NOW, TH)
    assert "last log line" not in found.message and found.message.endswith("(last step 41)")


def test_a_crash_hit_without_a_line_and_an_xid_without_a_line() -> None:
    (crash,) = patrol.job_findings("h1", JOB, {"state": "exited", "scan": {"hits": [{"signature": "nccl"}]}}, NOW, TH)
    assert (crash.message, crash.evidence) == ("baseline a2: ", ("",))
    (xid,) = patrol.host_findings(HostView("h1"), {"kernel": {"xids": [{"code": 13}]}}, TH)
    assert xid.evidence == ("",)


def test_inodes_are_judged_without_a_disk_figure() -> None:
    found = patrol.host_findings(HostView("h1"), {"disk": {"inodes_used_pct": 96}}, TH)
    assert [(f.rule, f.severity, f.message) for f in found] == [
        ("inodes", Severity.ESCALATE, "inodes 96% used on the data dir")]


def test_signatures_stop_at_the_first_semicolon_of_several() -> None:
    assert migrate._v17_signatures_of("signatures: a, b; x; y") == '["a", "b"]'


@pytest.mark.parametrize(("hits", "kw", "klass"), [
    ([], {"oom_kill_rose": True}, "host_oom"),  # an exit 1 with the host's OOM counter risen
    (["killed"], {}, "host_oom"),  # a bare "Killed" in the log
    ([], {}, "unknown"),
])
def test_an_ordinary_exit_with_oom_evidence_is_a_host_oom(hits: list[str], kw: dict[str, Any], klass: str) -> None:
    assert verdicts.classify(1, 1, [{"signature": h} for h in hits], [], **kw) == klass


def test_host_line_counts_only_jobs_past_the_third() -> None:
    jobs = [{"state": "running", "name": n, "attempt": 1} for n in "abc"]
    line = host_lines.host_line("h1", {"jobs": jobs}, [])
    assert line == "PATROL h1 running a:a1=starting b:a1=starting c:a1=starting disk=?% ino=?% mem=?%"
    line = host_lines.host_line("h1", {"jobs": [*jobs, {"state": "running", "name": "d", "attempt": 1}]}, [])
    assert "more=1" in line and "d:a1" not in line
