"""The billing stage's decisions as rules (orchestrator/tick/billing.py): which hosts bill, what a host's work
is, why a down-when-done host is not ended yet, when an idle alert fires or clears, whether the sweeps since a
host came up have ended; and the findings the stage writes (a retry, its escalation, the end's cost, a kept
host, the idle alert) on a real ledger, with no host behind them.  tests/unit/test_billing.py runs the same
stage end to end against the fake RunPod and FakeHosts with the real agent (slower: out of the mutation set)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, HoldKind, JobState
from orchestrator.ledger import Attempt, HostRow, Job, Sweep
from orchestrator.tick import billing
from orchestrator.tick.findings import TickReport
from tests.support.rented import T0, add_rented, rented_row

MIN = 60.0


def _job(name: str, state: JobState, *, host: str | None = None, pin: str | None = None, sweep: str = "s1") -> Job:
    return Job(id=f"id-{name}", sweep_id=sweep, name=name, line=1, raw="", config="c.yaml", config_sha256="0",
               task="t", epochs=1, gpus=1, nodes=1, retries=0, spec_hash="h", state=state.value, host=host,
               host_pin=pin, created_at=T0, updated_at=T0)


def _att(job: Job, host: str, state: str, *, number: int = 1, code: int | None = None, created: float = T0,
         started: float | None = None, ended: float | None = None) -> Attempt:
    return Attempt(job_id=job.id, number=number, host=host, state=state, bundle_sha="b", created_at=created,
                   started_at=started, ended_at=ended, exit_code=code)


def _work_of(row: HostRow, jobs: list[Job], attempts: list[Attempt] = (), *, queued: list[Job] = (),  # type: ignore[assignment]
             sweep_hosts: dict[str, set[str]] | None = None, verified: set[str] = frozenset(),  # type: ignore[assignment]
             home: bool = False, seen: float | None = None, as_node: tuple[str, ...] = ()) -> billing.Work:
    return billing.work_of(row, {j.id: j for j in jobs}, list(queued), sweep_hosts or {}, list(attempts), verified,
                           lambda _job, _n: home, seen, as_node)


# -- which hosts bill ------------------------------------------------------------------------------------


def test_only_a_running_rented_host_not_replaced_or_terminated_bills() -> None:
    assert billing.rented(rented_row())
    assert not billing.rented(rented_row(provider=""))
    assert not billing.rented(rented_row(instance_id=""))
    assert not billing.rented(rented_row(lease_state="provisioning"))
    assert not billing.rented(rented_row(hold_kind=HoldKind.REPLACED.value))
    assert not billing.rented(rented_row(hold_kind=HoldKind.TERMINATED.value))
    assert billing.rented(rented_row(hold_kind=HoldKind.UNUSABLE.value))


# -- what a host's work is ---------------------------------------------------------------------------------


def test_work_names_what_runs_is_queued_for_it_waits_on_it_and_is_not_home() -> None:
    row = rented_row()
    running = _job("run", JobState.RUNNING, host="rp-a")
    done = _job("done", JobState.SUCCEEDED, host="rp-a")
    pulled = _job("pulled", JobState.SUCCEEDED, host="rp-a")
    lost = _job("lost", JobState.LOST, host="rp-a")
    preempted = _job("pre", JobState.PREEMPTED, host="rp-a")
    elsewhere = _job("other", JobState.RUNNING, host="rp-b")
    pinned = _job("pinned", JobState.QUEUED, pin="rp-a")
    of_sweep = _job("swept", JobState.QUEUED, sweep="s2")
    free = _job("free", JobState.QUEUED, sweep="s3")
    work = _work_of(row, [running, done, pulled, lost, preempted, elsewhere], queued=[pinned, of_sweep, free],
                    sweep_hosts={"s2": {"rp-a"}, "s3": {"rp-b"}}, verified={pulled.id}, as_node=("node1",))
    assert work.busy == ("run", "node1", "pinned", "swept")
    assert work.stranded == ("lost", "pre")
    assert work.unpulled == (done,)
    assert not work.used and work.attempts == ()


def test_a_host_that_failed_its_preflight_has_nothing_queued_for_it() -> None:
    pinned = _job("pinned", JobState.QUEUED, pin="rp-a")
    assert _work_of(rented_row(health="fail"), [], queued=[pinned]).busy == ()
    assert _work_of(rented_row(health="warn"), [], queued=[pinned]).busy == ("pinned",)


def test_work_keeps_failed_attempts_evidence_until_it_is_home_and_writes_off_a_cancelled_job() -> None:
    row = rented_row()
    failed = _job("failed", JobState.FAILED, host="rp-a")
    gone = _job("gone", JobState.FAILED, host="rp-a")
    cancelled = _job("cancelled", JobState.CANCELLED, host="rp-a")
    ok = _job("ok", JobState.SUCCEEDED, host="rp-a")
    attempts = [_att(failed, "rp-a", "EXITED", code=3), _att(gone, "rp-a", "LOST"),
                _att(cancelled, "rp-a", "EXITED", code=1), _att(ok, "rp-a", "EXITED", code=0),
                _att(failed, "rp-b", "EXITED", code=2, number=2)]
    work = _work_of(row, [failed, gone, cancelled, ok], attempts, verified={ok.id})
    assert [(j.name, a.number) for j, a in work.evidence] == [("failed", 1), ("gone", 1)]
    assert len(work.attempts) == 4 and work.used
    assert _work_of(row, [failed, gone, cancelled, ok], attempts, verified={ok.id}, home=True).evidence == ()


def test_idle_since_is_the_latest_of_its_start_its_lease_its_attempts_and_work_last_seen() -> None:
    job = _job("j", JobState.SUCCEEDED, host="rp-a")
    row = rented_row(created_at=T0, lease_changed_at=T0 + 10)
    assert _work_of(row, []).idle_since == T0 + 10
    assert _work_of(rented_row(lease_changed_at=None), []).idle_since == T0
    assert _work_of(row, [], seen=T0 + 20).idle_since == T0 + 20
    for att, when in [(_att(job, "rp-a", "EXITED", created=T0 + 30), T0 + 30),
                      (_att(job, "rp-a", "EXITED", created=T0 + 30, started=T0 + 40), T0 + 40),
                      (_att(job, "rp-a", "EXITED", created=T0 + 30, started=T0 + 40, ended=T0 + 50), T0 + 50),
                      (_att(job, "rp-b", "EXITED", created=T0 + 90), T0 + 10)]:
        assert _work_of(row, [job], [att], verified={job.id}).idle_since == when


# -- why a down-when-done host is not ended yet -----------------------------------------------------------


def test_the_end_blockers_in_their_order() -> None:
    work = billing.Work(busy=("a", "b", "c", "d"), stranded=("p",))
    assert billing.end_blocker(rented_row(down_when_done=False), work, True) == "not marked down-when-done"
    assert billing.end_blocker(rented_row(), work, True) == "4 job(s) queued for it or running there (a, b, c)"
    stranded = billing.Work(stranded=("p", "q", "r", "s"), attempts=(_att(_job("p", JobState.LOST), "rp-a", "LOST"),))
    assert billing.end_blocker(rented_row(), stranded, False) is None, "its checkpoints are home: resumed anywhere"
    assert billing.end_blocker(rented_row(), stranded, False, checkpoints_home=False) == (
        "4 preempted or lost job(s) resume from its disk (p, q, r; ship_checkpoints is never): `gpuq resume`, or "
        "`gpuq cancel` them")
    assert billing.end_blocker(rented_row(), billing.Work(), False) == "no work has run there yet"
    assert billing.end_blocker(rented_row(), billing.Work(), True) is None, "every sweep since it came up ended"
    failed = rented_row(health="fail")
    assert billing.end_blocker(failed, billing.Work(), False) is None, "failed its preflight: it goes"
    assert billing.end_blocker(rented_row(), billing.Work(attempts=stranded.attempts), False) is None


# -- the idle alert -----------------------------------------------------------------------------------------


def test_the_idle_alert_fires_once_per_idle_period_and_clears_when_work_came() -> None:
    idle = billing.Work(idle_since=T0)
    busy = billing.Work(busy=("j",), idle_since=T0)
    after = 15 * MIN
    assert billing.idle_alert(idle, T0 + after, 0, None) is None, "0: no idle alerts"
    assert billing.idle_alert(idle, T0 + after - 1, after, None) is None
    assert billing.idle_alert(idle, T0 + after, after, None) == "alert"
    assert billing.idle_alert(idle, T0 + 2 * after, after, T0 + after) is None, "alerted: once"
    assert billing.idle_alert(idle, T0 + 2 * after, after, T0) is None, "an alert at its very start counts"
    assert billing.idle_alert(busy, T0 + after, after, T0 + after) == "clear"
    assert billing.idle_alert(busy, T0 + after, after, None) is None
    later = billing.Work(idle_since=T0 + after + 60)  # work came and went after the alert
    assert billing.idle_alert(later, T0 + after + 120, after, T0 + after) == "clear"
    assert billing.idle_alert(later, T0 + 3 * after, after, T0 + after) == "alert"


# -- the sweeps submitted since a host came up ------------------------------------------------------------


def _sweep(sid: str, created: float) -> Sweep:
    return Sweep(id=sid, queue_path="q", workdir="/w", queue_text="", created_at=created, default_retries=0,
                 bundle_sha="b")


def test_sweeps_since_it_came_up_ended_counts_stranded_and_budget_held_sweeps_as_ended() -> None:
    row = rented_row(created_at=T0)
    before, since = _sweep("old", T0 - 1), _sweep("new", T0)
    assert not billing._sweeps_since_done(row, [before], {"old": {"SUCCEEDED": 1}}), "none since: not done"
    assert billing._sweeps_since_done(row, [before, since], {"old": {"RUNNING": 1}, "new": {"SUCCEEDED": 2}})
    assert billing._sweeps_since_done(row, [since], {"new": {"FAILED": 1, "LOST": 1, "PREEMPTED": 1}})
    assert not billing._sweeps_since_done(row, [since], {"new": {"SUCCEEDED": 1, "QUEUED": 1}})
    assert billing._sweeps_since_done(row, [since], {"new": {"QUEUED": 1}}, held={"new"})
    assert not billing._sweeps_since_done(row, [since], {"new": {"RUNNING": 1}}, held={"other"})


# -- what the stage writes -----------------------------------------------------------------------------------


@pytest.fixture
def ctx(gpuq_home: Path, hook: list[dict[str, Any]]) -> Iterator[Context]:
    context = open_context()
    try:
        add_rented(context.ledger, rented_row(created_at=T0, lease_changed_at=T0))
        yield context
    finally:
        context.close()


def _events(ctx: Context, rule: str) -> list[tuple[str, str, str]]:
    return [(e.severity, e.message, e.action) for e in ctx.ledger.events("rp-a", exact=True) if e.rule == rule]


def test_a_passing_failure_warns_twice_then_escalates_once_and_stays_pending(
        ctx: Context, hook: list[dict[str, Any]]) -> None:
    row = ctx.ledger.host("rp-a")
    assert row is not None
    reports = []
    for _ in range(4):
        report = TickReport()
        billing._retry(ctx, row, "the API is down", report)
        reports.append(report)
    message = "down when done: rp-a not ended yet: the API is down"
    assert _events(ctx, billing.RULE_RETRY) == [
        ("warn", message, "retried at the next tick"), ("warn", message, "retried at the next tick"),
        ("escalate", f"{message} (3 tries)", "it bills $0.79/h: `gpuq down rp-a` ends it by hand")]
    assert reports[0].teardown_pending == ["rp-a"] and reports[0].actions == [f"rp-a: {message} (retried)"]
    assert reports[2].teardown_pending == [] and reports[2].actions == [
        f"rp-a: {message}; it bills $0.79/h: `gpuq down rp-a` ends it by hand"]
    assert reports[3].actions == [] and reports[3].teardown_pending == []
    assert [(h["event"], h["rule"], h["host"], h["message"], h["action"], h["text"]) for h in hook] == [
        ("escalation", billing.RULE_RETRY, "rp-a", message, "it bills $0.79/h: `gpuq down rp-a` ends it by hand",
         f"host rp-a: {message}; it bills $0.79/h; next: gpuq down rp-a")]
    ctx.ledger.record_finding("host", "rp-a", severity="info", rule=billing.RULE_RETRY, message="ended")
    again = TickReport()
    billing._retry(ctx, row, "again", again)
    assert again.teardown_pending == ["rp-a"], "a new run of tries after the info"


def test_the_end_says_when_billing_stopped_what_the_machine_and_its_attempts_cost(
        ctx: Context, hook: list[dict[str, Any]]) -> None:
    row = ctx.ledger.host("rp-a")
    assert row is not None
    job = _job("j", JobState.SUCCEEDED, host="rp-a")
    att = _att(job, "rp-a", "EXITED", code=0, started=T0, ended=T0 + 1800)
    att.price_per_hour = 0.79
    row.created_at = T0  # (the ledger dates a row it adds now)
    gone = T0 + 2 * 3600
    report = TickReport()
    billing._record_end(ctx, row, billing.Work(attempts=(att,), stranded=("p1",)), gone, report)
    (event,) = _events(ctx, billing.RULE_DONE)
    stopped = "stopped billing at 2027-01-15 10:00:00Z"
    assert event[0] == "info" and event[1] == (
        f"runpod pod1 terminated, down when done: {stopped}; rented 2.00 h at $0.79/h: about $1.58; its 1 "
        "attempt(s) cost $0.40; billed 5400 s after its last job ended; p1 resume from the checkpoint shipped home "
        "(`gpuq resume`)")
    assert report.actions == [f"rp-a: {event[1]}"]
    unpriced = rented_row("rp-b", price_per_hour=None, instance_id="pod2")
    add_rented(ctx.ledger, unpriced)
    billing._record_end(ctx, unpriced, billing.Work(), T0, TickReport())
    (found,) = [e.message for e in ctx.ledger.events("rp-b", exact=True) if e.rule == billing.RULE_DONE]
    assert found == ("runpod pod2 terminated, down when done: stopped billing at 2027-01-15 08:00:00Z; its 0 "
                     "attempt(s) cost $0.00")


def test_a_host_whose_results_did_not_verify_is_kept_with_one_escalation(ctx: Context) -> None:
    row = ctx.ledger.host("rp-a")
    assert row is not None
    report = TickReport()
    billing._keep(ctx, row, ["j1: corrupt: sha mismatch", "j2: corrupt: size"], report)
    ((severity, message, action),) = _events(ctx, billing.RULE_UNVERIFIED)
    assert severity == "escalate" and message == ("2 result(s) from rp-a did not verify (j1: corrupt: sha mismatch; "
                                                  "...): the host is kept, billing $0.79/h")
    assert action.startswith("inspect them (`gpuq results`, ") and "`gpuq down rp-a --force` gives them up" in action
    assert report.actions == [f"rp-a: down when done: kept: {message}"]
    billing._keep(ctx, rented_row("rp-a", price_per_hour=None), ["one"], TickReport())
    assert _events(ctx, billing.RULE_UNVERIFIED)[-1][1] == (
        "1 result(s) from rp-a did not verify (one): the host is kept, billing an unknown price per hour")


def test_the_idle_alert_names_the_price_and_what_down_when_done_waits_for(ctx: Context) -> None:
    row = ctx.ledger.host("rp-a")
    assert row is not None
    after = ctx.settings.idle_billing_alert_min * MIN
    report = TickReport()
    billing._idle(ctx, row, billing.Work(idle_since=T0), T0 + after + 90, None, report)
    ((severity, message, action),) = _events(ctx, billing.RULE_IDLE)
    minutes = int((after + 90) / 60)
    assert severity == "warn" and message == (f"rp-a has had no work for {minutes} min and bills $0.79/h (runpod pod1)"
                                              "; down-when-done waits: no work has run there yet")
    assert action == "`gpuq down rp-a` ends it (after `gpuq pull` when results there are not home)"
    assert report.actions == [f"rp-a: {message}; {action}"]
    last = ctx.ledger.latest_finding("rp-a", billing.RULE_IDLE)
    billing._idle(ctx, row, billing.Work(busy=("j",), idle_since=T0), T0 + 2 * after, last, TickReport())
    cleared = ctx.ledger.latest_finding("rp-a", billing.RULE_IDLE)
    assert cleared is not None and cleared.severity == "info" and cleared.time == T0 + 2 * after
    assert cleared.message == "cleared: work ran on rp-a; its idle period ended"
    plain = rented_row("rp-a", down_when_done=False)
    billing._idle(ctx, plain, billing.Work(idle_since=T0 + 3 * after), T0 + 5 * after, cleared, TickReport())
    assert _events(ctx, billing.RULE_IDLE)[-1][1] == (
        f"rp-a has had no work for {int(2 * after / 60)} min and bills $0.79/h (runpod pod1)")


def test_an_idle_period_that_ended_between_two_ticks_is_cleared_as_of_its_end(ctx: Context) -> None:
    row = ctx.ledger.host("rp-a")
    assert row is not None
    after = ctx.settings.idle_billing_alert_min * MIN
    billing._idle(ctx, row, billing.Work(idle_since=T0), T0 + after, None, TickReport())
    last = ctx.ledger.latest_finding("rp-a", billing.RULE_IDLE)
    billing._idle(ctx, row, billing.Work(idle_since=T0 + after + 5), T0 + after + 10, last, TickReport())
    cleared = ctx.ledger.latest_finding("rp-a", billing.RULE_IDLE)
    assert cleared is not None and cleared.severity == "info" and cleared.time == T0 + after + 5


# -- the stage on a rented pod with nothing to bring home (the fake RunPod; no host behind it) ------------------

KEY = "rp-billing-rules-key-0123456789"


@pytest.fixture
def pod(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch, hook: list[dict[str, Any]]) -> Iterator[tuple[Context, Any]]:
    from orchestrator.providers.models import ProvisionRequest
    from orchestrator.tick.leases import provider_for
    from tests.support.fakecloud import FakeRunPod

    with FakeRunPod(api_key=KEY) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_RUNPOD_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        context = open_context()
        try:
            (inst,) = provider_for(context, "runpod").provision(ProvisionRequest(name="gpuq-t-rp-a",
                                                                                 gpu_type="NVIDIA RTX A6000"))
            add_rented(context.ledger, rented_row(instance_id=inst.id, target="root@rp-a.invalid"))
            yield context, fake
        finally:
            context.close()


def _queued(ctx: Context, name: str) -> Job:
    (job,) = ctx.ledger.add_sweep(sweep_id=f"qbr{name}", queue_path="q.txt", workdir="/w", queue_text="",
                                  jobs=[JobSpec(name=name, config="c.yaml", task="t")], default_retries=0)
    return job


def test_an_unused_down_when_done_pod_goes_once_the_sweeps_since_it_came_up_ended(
        pod: tuple[Context, Any], hook: list[dict[str, Any]]) -> None:
    ctx, _fake = pod
    job = _queued(ctx, "j")
    report = TickReport()
    billing.billing(ctx, report, {"rp-a"}, now=time.time())
    row = ctx.ledger.host("rp-a")
    assert row is not None and row.lease_state == "running" and report.actions == []
    ctx.ledger.transition(job.id, JobState.CANCELLED)
    assert billing.idle_hosts(ctx) and "rp-a" in billing.idle_hosts(ctx)
    billing.billing(ctx, report, {"rp-a"}, now=time.time())
    row = ctx.ledger.host("rp-a")
    assert row is not None and row.lease_state == "terminated"
    (message,) = [e.message for e in ctx.ledger.events("rp-a", exact=True) if e.rule == billing.RULE_DONE]
    assert message.startswith(f"runpod {row.instance_id} terminated, down when done: stopped billing at ")
    assert report.actions == [f"rp-a: {message}"] and billing.idle_hosts(ctx) == {}
    assert [h["event"] for h in hook] == [billing.RULE_DONE]


def test_a_pod_with_results_not_home_waits_for_an_answer_and_a_kept_one_for_a_person(
        pod: tuple[Context, Any]) -> None:
    ctx, _fake = pod
    job = _queued(ctx, "r")
    ctx.ledger.start_attempt(job.id, host="rp-a", bundle_sha="b")
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job.id, JobState.RUNNING)
    ctx.ledger.update_attempt(job.id, 1, exit_code=0)
    ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    ctx.ledger.transition(job.id, JobState.SUCCEEDED)
    report = TickReport()
    billing.billing(ctx, report, set(), now=time.time())  # it did not answer this tick
    assert report.teardown_pending == ["rp-a"]
    assert report.actions == ["rp-a: down when done: rp-a not ended yet: it did not answer this tick: its results "
                              "cannot come home yet (retried)"]
    ctx.ledger.record_finding("host", "rp-a", severity="escalate", rule=billing.RULE_UNVERIFIED, message="kept")
    kept = TickReport()
    billing.billing(ctx, kept, {"rp-a"}, now=time.time())
    assert kept.teardown_pending == [] and kept.actions == []
    row = ctx.ledger.host("rp-a")
    assert row is not None and row.lease_state == "running"
