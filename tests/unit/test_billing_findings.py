"""What the billing stage (orchestrator/tick/billing.py) tells a person, and what it counts as work, on a real
ledger with no host behind it: every webhook notice's fields (gpuq's JSON form) and its ntfy title and priority,
the retry count that escalates, which hosts and attempts ``works`` counts (a job that moved on, a node of a
multi-node job, a sweep restricted to the host, a budget-held sweep, a verified pull, the last idle period), and
the stage's handling of one host's failure (a retry finding; the idle alert and the other hosts still run).
test_billing_rules.py has the rules themselves; test_billing.py runs the stage end to end with the real agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.errors import GpuqError
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Attempt, HostRow, Job
from orchestrator.tick import billing, teardown
from orchestrator.tick.findings import TickReport
from orchestrator.transfer import evidence
from tests.support.rented import T0, add_rented, rented_row
from tests.support.webhook import Delivery, receiver

MIN = 60.0


def _att(job_id: str, *, number: int = 1, started: float | None = None, ended: float | None = None,
         price: float | None = 0.79) -> Attempt:
    att = Attempt(job_id=job_id, number=number, host="rp-a", state="EXITED", bundle_sha="b", created_at=T0,
                  started_at=started, ended_at=ended, exit_code=0)
    att.price_per_hour = price
    return att


@pytest.fixture
def ctx(gpuq_home: Path, hook: list[dict[str, Any]]) -> Iterator[Context]:
    context = open_context()
    try:
        add_rented(context.ledger, rented_row())
        yield context
    finally:
        context.close()


@pytest.fixture
def ntfy(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, list[Delivery]]]:
    with receiver() as (url, got):
        monkeypatch.setenv("GPUQ_WEBHOOK_URL", url)
        monkeypatch.setenv("GPUQ_WEBHOOK_FORMAT", "ntfy")
        context = open_context()
        try:
            add_rented(context.ledger, rented_row())
            yield context, got
        finally:
            context.close()


def _host(ctx: Context) -> HostRow:
    row = ctx.ledger.host("rp-a")
    assert row is not None
    return row


def _events(ctx: Context, rule: str, host: str = "rp-a") -> list[tuple[str, str, str]]:
    return [(e.severity, e.message, e.action) for e in ctx.ledger.events(host, exact=True) if e.rule == rule]


def _body(sent: dict[str, Any]) -> dict[str, Any]:
    assert sent.pop("source") == "gpuq" and isinstance(sent.pop("time"), float)
    return sent


# -- the webhook's fields ---------------------------------------------------------------------------------------


def test_a_kept_host_sends_what_did_not_verify_and_what_to_do(ctx: Context, hook: list[dict[str, Any]]) -> None:
    billing._keep(ctx, _host(ctx), ["j1: corrupt: sha mismatch"], TickReport())
    message = "1 result(s) from rp-a did not verify (j1: corrupt: sha mismatch): the host is kept, billing $0.79/h"
    action = (f"inspect them (`gpuq results`, {ctx.settings.home / 'quarantine'}); once `gpuq pull` verifies them "
              "the next tick ends the host, or `gpuq down rp-a --force` gives them up")
    assert _events(ctx, billing.RULE_UNVERIFIED) == [("escalate", message, action)]
    assert [_body(h) for h in hook] == [
        {"event": "escalation", "rule": "unverified_result", "host": "rp-a", "job": None, "message": message,
         "action": action, "text": f"host rp-a: {message}; next: gpuq pull"}]


def test_the_end_sends_the_instance_when_billing_stopped_and_what_its_attempts_cost(
        ctx: Context, hook: list[dict[str, Any]]) -> None:
    row = _host(ctx)
    row.created_at = T0
    gone = T0 + 3600
    attempts = (_att("a", started=T0, ended=T0 + 1800), _att("b", started=T0 + 600, ended=T0 + 2400),
                _att("c", number=2, started=T0 + 2400))  # the last one never ended: it does not date the last end
    report = TickReport()
    billing._record_end(ctx, row, billing.Work(attempts=attempts, stranded=("p1", "p2", "p3", "p4")), gone, report)
    message = ("runpod pod1 terminated, down when done: stopped billing at 2027-01-15 09:00:00Z; rented 1.00 h at "
               "$0.79/h: about $0.79; its 3 attempt(s) cost $1.05; billed 1200 s after its last job ended; p1, p2, "
               "p3 resume from the checkpoint shipped home (`gpuq resume`)")
    (event,) = [e for e in ctx.ledger.events("rp-a", exact=True) if e.rule == billing.RULE_DONE]
    assert (event.severity, event.message, event.time) == ("info", message, gone)
    (sent,) = [_body(h) for h in hook]
    assert sent.pop("attempts_usd") == pytest.approx(0.79 * (0.5 + 0.5 + 1 / 3))
    assert sent == {"event": "down_when_done", "host": "rp-a", "provider": "runpod", "instance": "pod1",
                    "stopped_at": gone, "message": message, "text": f"host rp-a: {message}; next: gpuq resume"}
    assert report.actions == [f"rp-a: {message}"]


def test_an_end_with_nothing_stranded_points_at_the_results_and_never_bills_negative_hours(
        ctx: Context, hook: list[dict[str, Any]]) -> None:
    row = _host(ctx)
    row.created_at = T0
    billing._record_end(ctx, row, billing.Work(attempts=(_att("a", price=None, started=T0, ended=T0 - 10),)),
                        T0 - 60, TickReport())
    message = ("runpod pod1 terminated, down when done: stopped billing at 2027-01-15 07:59:00Z; rented 0.00 h at "
               "$0.79/h: about $0.00; its 1 attempt(s) cost $0.00; billed 0 s after its last job ended")
    assert [_body(h) for h in hook] == [
        {"event": "down_when_done", "host": "rp-a", "provider": "runpod", "instance": "pod1", "stopped_at": T0 - 60,
         "attempts_usd": None, "message": message, "text": f"host rp-a: {message}; next: gpuq results"}]


def test_the_idle_alert_sends_its_price_minutes_and_the_command_that_ends_it(
        ctx: Context, hook: list[dict[str, Any]]) -> None:
    after = ctx.settings.idle_billing_alert_min * MIN
    used = billing.Work(attempts=(_att("a", started=T0, ended=T0),), idle_since=T0)
    billing._idle(ctx, _host(ctx), used, T0 + after + 99, None, TickReport())
    minutes = int(after / 60) + 1
    message = (f"rp-a has had no work for {minutes} min and bills $0.79/h (runpod pod1); down-when-done waits: its "
               "results could not be brought home")
    action = "`gpuq down rp-a` ends it (after `gpuq pull` when results there are not home)"
    (found,) = [e for e in ctx.ledger.events("rp-a", exact=True) if e.rule == billing.RULE_IDLE]
    assert (found.severity, found.message, found.action, found.time) == ("warn", message, action, T0 + after + 99)
    assert [_body(h) for h in hook] == [
        {"event": "idle_billing", "host": "rp-a", "provider": "runpod", "instance": "pod1", "price_per_hour": 0.79,
         "idle_min": round(after / 60 + 1.65, 1), "message": message, "action": action,
         "text": f"host rp-a: {message}; next: gpuq down rp-a"}]


def test_each_notice_has_its_title_and_priority(ntfy: tuple[Context, list[Delivery]]) -> None:
    ctx, got = ntfy
    row = _host(ctx)
    billing._keep(ctx, row, ["x"], TickReport())
    for _ in range(3):
        billing._retry(ctx, row, "the API is down", TickReport())
    billing._record_end(ctx, row, billing.Work(), T0, TickReport())
    billing._idle(ctx, row, billing.Work(idle_since=T0), T0 + ctx.settings.idle_billing_alert_min * MIN, None,
                  TickReport())
    assert [(d.headers["title"], d.headers["priority"], d.headers["tags"]) for d in got] == [
        ("gpuq: rp-a kept: results unverified", "high", "rotating_light,escalation"),
        ("gpuq: rp-a not ended, still billing", "high", "rotating_light,escalation"),
        ("gpuq: rp-a ended, billing stopped", "low", "information_source,down_when_done"),
        ("gpuq: rp-a idle, still billing", "default", "warning,idle_billing")]


# -- the retries that escalate ----------------------------------------------------------------------------------


def test_retries_are_counted_per_host_across_other_findings(ctx: Context, hook: list[dict[str, Any]]) -> None:
    add_rented(ctx.ledger, rented_row("rp-ab", instance_id="pod2"))
    row, other = _host(ctx), ctx.ledger.host("rp-ab")
    assert other is not None
    billing._retry(ctx, other, "down", TickReport())
    billing._retry(ctx, other, "down", TickReport())  # rp-ab's tries are not rp-a's (rp-a is a prefix of it)
    billing._retry(ctx, row, "down", TickReport())
    ctx.ledger.record_finding("host", "rp-a", severity="warn", rule=billing.RULE_IDLE, message="idle")
    billing._retry(ctx, row, "down", TickReport())
    assert [s for s, _, _ in _events(ctx, billing.RULE_RETRY)] == ["warn", "warn"]
    report = TickReport()
    billing._retry(ctx, row, "down", report)  # another rule's finding between them does not restart the count
    assert [s for s, _, _ in _events(ctx, billing.RULE_RETRY)] == ["warn", "warn", "escalate"]
    assert report.teardown_pending == [] and [h["host"] for h in hook] == ["rp-a"]


# -- which hosts and attempts `works` counts ----------------------------------------------------------------------


def _sweep(ctx: Context, sid: str, *names: str, hosts: tuple[str, ...] = ()) -> list[Job]:
    return ctx.ledger.add_sweep(sweep_id=sid, queue_path="q.txt", workdir="/w", queue_text="", hosts=hosts,
                                jobs=[JobSpec(name=n, config="c.yaml", task="t") for n in names], default_retries=0)


def _start(ctx: Context, job: Job, host: str) -> int:
    att = ctx.ledger.start_attempt(job.id, host=host, bundle_sha="b")
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=att.number)
    ctx.ledger.transition(job.id, JobState.RUNNING)
    return att.number


def _end(ctx: Context, job: Job, number: int, code: int, state: JobState) -> None:
    ctx.ledger.update_attempt(job.id, number, exit_code=code)
    ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=number)
    ctx.ledger.transition(job.id, state)


def test_works_counts_the_jobs_that_ran_there_are_queued_for_it_or_run_a_node_there(ctx: Context) -> None:
    add_rented(ctx.ledger, rented_row("rp-b", instance_id="pod2"))
    moved, done, pulled, ddp = _sweep(ctx, "s1", "moved", "done", "pulled", "ddp")
    _sweep(ctx, "s2", "swept", hosts=("rp-a",))
    _sweep(ctx, "s3", "elsewhere", hosts=("rp-b",))
    ctx.ledger.transition(moved.id, AttemptState.LOST, attempt=_start(ctx, moved, "rp-a"))
    ctx.ledger.transition(moved.id, JobState.LOST)
    ctx.ledger.transition(moved.id, JobState.QUEUED)  # lost on rp-a, resumed on rp-b
    _start(ctx, moved, "rp-b")
    _end(ctx, done, _start(ctx, done, "rp-a"), 0, JobState.SUCCEEDED)
    _end(ctx, pulled, _start(ctx, pulled, "rp-a"), 0, JobState.SUCCEEDED)
    ctx.ledger.record_pull(pulled.id, attempt=1, host="rp-a", state="verified")
    ctx.ledger.update_attempt(ddp.id, _start(ctx, ddp, "rp-b"), nodes=json.dumps(["rp-b", "rp-a"]))
    rows = [_host(ctx), ctx.ledger.host("rp-b")]
    found, sweeps = billing.works(ctx, rows)  # type: ignore[arg-type]
    assert sorted(s.id for s in sweeps) == ["s1", "s2", "s3"]
    here, there = found["rp-a"], found["rp-b"]
    assert here.busy == ("ddp", "swept") and there.busy == ("moved", "ddp", "elsewhere")
    assert [(j.name, a.number) for j, a in here.evidence] == [("moved", 1)], "it failed here, then moved on"
    assert [j.name for j in here.unpulled] == ["done"]
    assert sorted((a.job_id, a.number) for a in here.attempts) == sorted(
        [(moved.id, 1), (done.id, 1), (pulled.id, 1)])
    held, _ = billing.works(ctx, rows, {"s2": "raise its cap", "s3": "raise its cap"})  # type: ignore[arg-type]
    assert held["rp-a"].busy == ("ddp",) and held["rp-b"].busy == ("moved", "ddp")
    home = evidence.local_dir(ctx.settings.home / "results", moved, 1)  # its log and exit record came home
    home.mkdir(parents=True)
    (home / evidence.EVIDENCE_VERIFIED).write_text(json.dumps({"job_id": moved.id, "attempt": 1, "files": []}))
    assert billing.works(ctx, rows)[0]["rp-a"].evidence == ()  # type: ignore[arg-type]


def test_works_dates_the_idle_period_from_the_last_cleared_idle_alert(ctx: Context) -> None:
    ctx.ledger.record_finding("host", "rp-a", severity="info", rule=billing.RULE_IDLE, message="cleared", at=T0 + 50)
    assert billing.works(ctx, [_host(ctx)])[0]["rp-a"].idle_since == T0 + 50
    ctx.ledger.record_finding("host", "rp-a", severity="warn", rule=billing.RULE_IDLE, message="idle", at=T0 + 90)
    assert billing.works(ctx, [_host(ctx)])[0]["rp-a"].idle_since == _host(ctx).lease_changed_at, \
        "an open alert is no work seen"
    assert billing.idle_hosts(ctx) == {"rp-a": _host(ctx).lease_changed_at}


# -- one host's failure -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [GpuqError("the provider's API is down"), OSError("disk full")])
def test_a_failure_to_end_one_host_is_a_retry_and_the_tick_goes_on(
        ctx: Context, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    ctx.ledger.update_host("rp-a", health="fail")  # no work will come: it goes now
    add_rented(ctx.ledger, rented_row("rp-b", instance_id="pod2", health="fail"))
    tried: list[str] = []

    def terminate(_ctx: Context, row: HostRow, **_kw: Any) -> tuple[str, float | None]:
        tried.append(row.name)
        raise error

    monkeypatch.setattr(teardown, "terminate", terminate)
    report = TickReport()
    after = ctx.settings.idle_billing_alert_min * MIN
    billing.billing(ctx, report, {"rp-a", "rp-b"}, now=_host(ctx).lease_changed_at + after)  # type: ignore[operator]
    assert tried == ["rp-a", "rp-b"]
    assert _events(ctx, billing.RULE_RETRY) == [
        ("warn", f"down when done: rp-a not ended yet: {error}", "retried at the next tick")]
    assert report.teardown_pending == ["rp-a", "rp-b"]
    (idle,) = _events(ctx, billing.RULE_IDLE)
    assert idle[0] == "warn" and idle[1].endswith("down-when-done waits: its results could not be brought home")


def test_the_stage_runs_at_this_moment_by_default(ctx: Context) -> None:
    ctx.ledger.update_host("rp-a", down_when_done=False)
    report = TickReport()
    billing.billing(ctx, report, {"rp-a"})  # it came up just now: not idle long enough
    assert report.actions == [] and _events(ctx, billing.RULE_IDLE) == []


# -- the stage ending pods (the fake RunPod; no host behind them) -------------------------------------------------

KEY = "rp-billing-findings-key-0123456789"


@pytest.fixture
def pods(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch, hook: list[dict[str, Any]]) -> Iterator[Context]:
    from orchestrator.providers.models import ProvisionRequest
    from orchestrator.tick.leases import provider_for
    from tests.support.fakecloud import FakeRunPod

    with FakeRunPod(api_key=KEY) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_RUNPOD_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        context = open_context()
        try:
            for name in ("rp-a", "rp-b"):
                (inst,) = provider_for(context, "runpod").provision(ProvisionRequest(name=f"gpuq-t-{name}",
                                                                                     gpu_type="NVIDIA RTX A6000"))
                add_rented(context.ledger, rented_row(name, instance_id=inst.id, target=f"root@{name}.invalid"))
            yield context
        finally:
            context.close()


def test_one_tick_ends_every_pod_whose_work_is_over_and_a_lost_job_with_its_checkpoint_home_holds_none(
        pods: Context) -> None:
    ctx = pods
    (lost,) = _sweep(ctx, "s1", "lost")
    ctx.ledger.transition(lost.id, AttemptState.LOST, attempt=_start(ctx, lost, "rp-a"))
    ctx.ledger.transition(lost.id, JobState.LOST)
    home = evidence.local_dir(ctx.settings.home / "results", lost, 1)
    home.mkdir(parents=True)
    (home / evidence.EVIDENCE_VERIFIED).write_text(json.dumps({"job_id": lost.id, "attempt": 1, "files": []}))
    ctx.ledger.update_host("rp-b", health="fail")
    report = TickReport()
    billing.billing(ctx, report, set())
    assert [(r.name, r.lease_state) for r in ctx.ledger.hosts()] == [("rp-a", "terminated"), ("rp-b", "terminated")]
    (message,) = [e.message for e in ctx.ledger.events("rp-a", exact=True) if e.rule == billing.RULE_DONE]
    assert message.endswith("; lost resume from the checkpoint shipped home (`gpuq resume`)")
