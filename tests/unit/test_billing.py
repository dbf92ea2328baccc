"""Billing stops when the work stops (orchestrator/tick/billing.py, docs/providers.md "Down when done").

On a real SQLite ledger: which rented hosts' work is over, the idle alert once per idle period on an
injected clock (webhook included), and the whole down-when-done stage against the fake RunPod with
the host's side played by a FakeHost running the real agent over fabricated job trees: results pulled
and verified, the failed attempt's log and exit record brought home, the pod terminated and its cost
recorded; a result or an exit record that does not verify keeps the pod and escalates once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import client
from orchestrator.context import Context, open_context
from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, HoldChange, HoldKind, JobState
from orchestrator.ledger import HostRow, Job
from orchestrator.providers.models import ProvisionRequest
from orchestrator.tick import billing
from orchestrator.tick.findings import TickReport
from orchestrator.tick.leases import provider_for
from orchestrator.transfer import evidence, pull_jobs
from tests.support.fakecloud import FakeRunPod
from tests.support.fakehost import FakeHost
from tests.support.jobtree import SHA, finished_job, install_agent
from tests.support.rented import add_rented

KEY = "rp-billing-key-0123456789"
SWEEP = "qbill01"
MIN = 60.0


@pytest.fixture
def cloud(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=KEY) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_RUNPOD_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        yield fake


@pytest.fixture
def ctx(gpuq_home: Path, hook: list[dict[str, Any]], cloud: FakeRunPod) -> Iterator[Context]:
    context = open_context()
    try:
        yield context
    finally:
        context.close()


def _host(ctx: Context, tmp_path: Path, name: str, *, down: bool = True, rent: bool = True) -> FakeHost:
    """A rented host: a pod in the fake RunPod whose machine is a FakeHost (the real agent, locally)."""
    instance = f"pod-{name}"
    if rent:
        (inst,) = provider_for(ctx, "runpod").provision(ProvisionRequest(name=f"gpuq-t-{name}",
                                                                         gpu_type="NVIDIA RTX A6000"))
        instance = inst.id
    host = FakeHost(tmp_path / name, name=name)
    install_agent(Path(host.root))
    add_rented(ctx.ledger, HostRow(name=name, kind="ssh", target=f"root@{name}.invalid", root=host.root,
                                python=host.python, provider="runpod", instance_id=instance, lease_state="running",
                                price_per_hour=0.79, down_when_done=down, agent_bundle=SHA, health="pass",
                                slots_total=2, gpu_type="NVIDIA RTX A6000"))
    ctx.fleet._hosts[name] = host  # the command's Host object for it: no SSH in a unit test
    return host


def _jobs(ctx: Context, *names: str, pin: str | None = None, hosts: str = "") -> dict[str, Job]:
    specs = [JobSpec(name=n, config="c.yaml", task="classify", config_sha256="0" * 64, line=i + 1, host=pin)
             for i, n in enumerate(names)]
    sweep = f"{SWEEP}{len(ctx.ledger.sweeps())}"
    rows = ctx.ledger.add_sweep(sweep_id=sweep, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                                default_retries=0)
    if hosts:
        ctx.ledger.set_sweep_hosts(sweep, hosts.split(","))
    return {r.name: r for r in rows}


def _run(ctx: Context, job: Job, host: str, *, code: int = 0, start: float | None = None,
         end: float | None = None, finish: bool = True) -> None:
    """One attempt of ``job`` on ``host``: it runs, and (``finish``) exits ``code``; times when given."""
    ctx.ledger.start_attempt(job.id, host=host, bundle_sha=SHA)
    number = ctx.ledger.job(job.id).attempt_count
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=number)
    ctx.ledger.transition(job.id, JobState.RUNNING)
    if start is not None:
        ctx.ledger.update_attempt(job.id, number, started_at=start)
    if not finish:
        return
    ctx.ledger.update_attempt(job.id, number, exit_code=code, **({"ended_at": end} if end is not None else {}))
    ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=number)
    ctx.ledger.transition(job.id, JobState.SUCCEEDED if code == 0 else JobState.FAILED)


def _work(ctx: Context, name: str) -> billing.Work:
    row = ctx.ledger.host(name)
    assert row is not None
    return billing.works(ctx, [row])[0][name]


def _blocker(ctx: Context, name: str, *, checkpoints_home: bool = True) -> str | None:
    row = ctx.ledger.host(name)
    assert row is not None
    found, sweeps = billing.works(ctx, [row])
    counts = ctx.ledger.state_counts()
    since = bool([s for s in sweeps if s.created_at >= row.created_at]) and all(
        JobState(st).terminal for s in sweeps if s.created_at >= row.created_at for st in counts.get(s.id, {}))
    return billing.end_blocker(row, found[name], since, checkpoints_home=checkpoints_home)


def _findings(ctx: Context, name: str, rule: str) -> list[tuple[str, str]]:
    return [(e.severity, e.message) for e in ctx.ledger.events(name, exact=True) if e.rule == rule]


# -- which hosts' work is over ----------------------------------------------------------------------------


def test_work_is_over_only_when_nothing_is_queued_for_it_runs_there_or_waits_on_its_disk(
        ctx: Context, tmp_path: Path) -> None:
    _host(ctx, tmp_path, "rp-a", rent=False)
    _host(ctx, tmp_path, "rp-b", rent=False)
    assert _blocker(ctx, "rp-a") == "no work has run there yet"  # just rented: not ended before its first job
    pinned = _jobs(ctx, "pinned", pin="rp-a")
    assert _work(ctx, "rp-a").busy == ("pinned",) and _work(ctx, "rp-b").busy == ()
    restricted = _jobs(ctx, "only_b", hosts="rp-b")
    assert _work(ctx, "rp-b").busy == ("only_b",)
    _run(ctx, pinned["pinned"], "rp-a", finish=False)
    assert _blocker(ctx, "rp-a") == "1 job(s) queued for it or running there (pinned)"
    ctx.ledger.update_attempt(pinned["pinned"].id, 1, exit_code=0)
    ctx.ledger.transition(pinned["pinned"].id, AttemptState.EXITED, attempt=1)
    ctx.ledger.transition(pinned["pinned"].id, JobState.SUCCEEDED)
    work = _work(ctx, "rp-a")
    assert _blocker(ctx, "rp-a") is None and [j.name for j in work.unpulled] == ["pinned"] and work.used
    ctx.ledger.record_pull(pinned["pinned"].id, attempt=1, host="rp-a", state="verified")
    assert _work(ctx, "rp-a").unpulled == ()

    # a failed preflight: nothing queued can go there, so it goes as soon as nothing runs there
    ctx.ledger.change_hold("rp-b", HoldChange(HoldKind.UNHEALTHY, "gpu: Xid 79"), health="fail")
    assert _work(ctx, "rp-b").busy == () and _blocker(ctx, "rp-b") is None
    ctx.ledger.change_hold("rp-b", HoldChange.lift(HoldKind.UNHEALTHY), health="pass")

    # a job lost there resumes from the checkpoint shipped home, anywhere; from its disk only when none is
    # shipped.  Its attempt's log and exit record come home first; a cancelled job's are written off
    _run(ctx, restricted["only_b"], "rp-b", finish=False)
    ctx.ledger.transition(restricted["only_b"].id, AttemptState.LOST, attempt=1)
    ctx.ledger.transition(restricted["only_b"].id, JobState.LOST)
    assert _work(ctx, "rp-b").stranded == ("only_b",) and _blocker(ctx, "rp-b") is None
    assert _blocker(ctx, "rp-b", checkpoints_home=False) == (
        "1 preempted or lost job(s) resume from its disk (only_b; ship_checkpoints is never): `gpuq resume`, or "
        "`gpuq cancel` them")
    assert [(j.name, a.number) for j, a in _work(ctx, "rp-b").evidence] == [("only_b", 1)]
    ctx.ledger.transition(restricted["only_b"].id, JobState.CANCELLED)
    assert _blocker(ctx, "rp-b", checkpoints_home=False) is None and _work(ctx, "rp-b").evidence == ()


def test_an_unused_host_goes_once_every_sweep_submitted_since_it_came_up_has_ended(
        ctx: Context, tmp_path: Path) -> None:
    _host(ctx, tmp_path, "rp-a", rent=False)
    _host(ctx, tmp_path, "rp-b", rent=False)
    jobs = _jobs(ctx, "one")
    assert _blocker(ctx, "rp-b") == "no work has run there yet"
    _run(ctx, jobs["one"], "rp-a")  # the sweep's only job ran on the other host
    assert _blocker(ctx, "rp-b") is None
    ctx.ledger.update_host("rp-b", down_when_done=False)
    assert _blocker(ctx, "rp-b") == "not marked down-when-done"


def test_a_sweep_its_budget_stopped_keeps_no_machine_billing(ctx: Context, tmp_path: Path) -> None:
    """Its queued jobs wait for a person to raise the cap, not for a machine: a down-when-done host
    restricted to it goes, and a fresh one is not kept for it."""
    from orchestrator.api import budgeting
    from orchestrator.money import budget
    from orchestrator.tick import budget as tick_budget

    _host(ctx, tmp_path, "rp-a", rent=False)
    _host(ctx, tmp_path, "rp-b", rent=False)
    jobs = _jobs(ctx, "ran", "held", hosts="rp-a")
    sweep = jobs["held"].sweep_id
    _run(ctx, jobs["ran"], "rp-a")
    ctx.ledger.record_pull(jobs["ran"].id, attempt=1, host="rp-a", state="verified")
    assert _work(ctx, "rp-a").busy == ("held",) and _blocker(ctx, "rp-b") == "no work has run there yet"
    budgeting.set_cap(ctx, sweep, 1.0)
    tick_budget.hold(ctx.ledger, ctx.settings, sweep, budget.Standing(1.0, 1.0),
                     {jobs["held"].id: budget.hold_reason(sweep, budget.Standing(1.0, 1.0))})  # as dispatch does
    assert _work(ctx, "rp-a").busy == () and _blocker(ctx, "rp-a") is None
    billing.billing(ctx, TickReport(), {"rp-a", "rp-b"})
    assert ctx.ledger.host("rp-a").lease_state == ctx.ledger.host("rp-b").lease_state == "terminated"  # type: ignore[union-attr]
    budgeting.set_cap(ctx, sweep, 5.0)  # raised: its job is work again (for a machine still there)
    assert tick_budget.stopped(ctx.ledger, sweep) == {}


# -- the idle alert ---------------------------------------------------------------------------------------


def test_the_idle_alert_fires_once_per_idle_period(ctx: Context, tmp_path: Path,
                                                   hook: list[dict[str, Any]]) -> None:
    _host(ctx, tmp_path, "rp-a", down=False, rent=False)
    t0 = ctx.ledger.host("rp-a").created_at  # type: ignore[union-attr]

    def tick(minutes: float) -> int:
        billing.billing(ctx, TickReport(), set(), now=t0 + minutes * MIN)
        return sum(1 for sev, _ in _findings(ctx, "rp-a", billing.RULE_IDLE) if sev == "warn")

    assert tick(10) == 0
    assert tick(15.5) == 1  # idle_billing_alert_min = 15 (the default)
    assert tick(20) == 1 and tick(300) == 1  # once per idle period, however long it lasts
    jobs = _jobs(ctx, "j1", "j2")
    _run(ctx, jobs["j1"], "rp-a", start=t0 + 301 * MIN, finish=False)
    assert tick(302) == 1  # work arrived: the period ends ...
    assert _findings(ctx, "rp-a", billing.RULE_IDLE)[-1][0] == "info"
    ctx.ledger.update_attempt(jobs["j1"].id, 1, exit_code=0, ended_at=t0 + 310 * MIN)
    ctx.ledger.transition(jobs["j1"].id, AttemptState.EXITED, attempt=1)
    ctx.ledger.transition(jobs["j1"].id, JobState.SUCCEEDED)
    assert tick(320) == 1  # ... and a new one starts when it ends: 10 min so far
    assert tick(325.5) == 2 and tick(400) == 2
    # a job that starts and ends between two ticks ends the period all the same
    _run(ctx, jobs["j2"], "rp-a", start=t0 + 401 * MIN, end=t0 + 402 * MIN)
    assert tick(403) == 2 and tick(410) == 2 and tick(417.5) == 3
    sent = [m for m in hook if m["event"] == billing.RULE_IDLE]
    assert len(sent) == 3 and {m["host"] for m in sent} == {"rp-a"} and all(m["price_per_hour"] == 0.79 for m in sent)
    alert = next(msg for sev, msg in _findings(ctx, "rp-a", billing.RULE_IDLE) if sev == "warn")
    assert "$0.79/h" in alert and "15 min" in alert
    action = next(e.action for e in ctx.ledger.events("rp-a", exact=True)
                  if e.rule == billing.RULE_IDLE and e.severity == "warn")
    assert "`gpuq down rp-a`" in action


def test_a_busy_host_never_gets_an_idle_alert(ctx: Context, tmp_path: Path) -> None:
    _host(ctx, tmp_path, "rp-a", down=False, rent=False)
    t0 = ctx.ledger.host("rp-a").created_at  # type: ignore[union-attr]
    jobs = _jobs(ctx, "long")
    _run(ctx, jobs["long"], "rp-a", start=t0 + 1, finish=False)
    for minutes in (20, 60, 600):
        billing.billing(ctx, TickReport(), set(), now=t0 + minutes * MIN)
    assert _findings(ctx, "rp-a", billing.RULE_IDLE) == []


# -- down when done, end to end against the fake RunPod ------------------------------------------------------


def _pod_alive(cloud: FakeRunPod, instance_id: str) -> bool:
    pod = cloud.state()["pods"].get(instance_id)
    return pod is not None and pod["status"] != "TERMINATED"


def _sweep_on(ctx: Context, host: FakeHost, name: str) -> dict[str, Job]:
    """A job that succeeded and one that failed, both on ``name``, with their files on the host."""
    jobs = _jobs(ctx, "good", "broken")
    _run(ctx, jobs["good"], name)
    _run(ctx, jobs["broken"], name, code=1)
    finished_job(Path(host.root), jobs["good"].id, queue_id=jobs["good"].sweep_id)
    finished_job(Path(host.root), jobs["broken"].id, queue_id=jobs["broken"].sweep_id, code=1)
    return {n: ctx.ledger.job(j.id) for n, j in jobs.items()}


def test_down_when_done_brings_everything_home_verified_then_terminates(
        ctx: Context, tmp_path: Path, cloud: FakeRunPod, gpuq_home: Path, hook: list[dict[str, Any]]) -> None:
    host = _host(ctx, tmp_path, "rp-a")
    instance = ctx.ledger.host("rp-a").instance_id  # type: ignore[union-attr]
    jobs = _sweep_on(ctx, host, "rp-a")
    report = TickReport()
    billing.billing(ctx, report, {"rp-a"})

    row = ctx.ledger.host("rp-a")
    assert row is not None and row.lease_state == "terminated" and not _pod_alive(cloud, instance)
    good, broken = jobs["good"], jobs["broken"]
    assert set(ctx.ledger.verified_pulls([good.id])) == {good.id}
    assert (gpuq_home / "results" / good.sweep_id / good.id / "PULL_VERIFIED.json").is_file()
    home = evidence.local_dir(gpuq_home / "results", broken, 1)
    remote = Path(host.root) / protocol.JOBS_DIR / broken.id / protocol.ATTEMPTS_DIR / "1"
    for name in (protocol.JOB_LOG, protocol.EXIT_FILE):
        assert (home / name).read_bytes() == (remote / name).read_bytes()
    assert evidence.is_home(gpuq_home / "results", broken, 1)
    (done,) = _findings(ctx, "rp-a", billing.RULE_DONE)
    assert done[0] == "info" and "stopped billing at" in done[1] and "$0.79/h" in done[1]
    assert "its 2 attempt(s) cost $" in done[1]
    sent = next(m for m in hook if m["event"] == billing.RULE_DONE)
    assert row.lease_changed_at is not None and sent["stopped_at"] == pytest.approx(row.lease_changed_at, abs=1.0)
    assert report.teardown_pending == [] and any("terminated, down when done" in a for a in report.actions)


def test_a_result_that_fails_verification_keeps_the_host_and_escalates_once(
        ctx: Context, tmp_path: Path, cloud: FakeRunPod, gpuq_home: Path, hook: list[dict[str, Any]]) -> None:
    host = _host(ctx, tmp_path, "rp-a")
    instance = ctx.ledger.host("rp-a").instance_id  # type: ignore[union-attr]
    jobs = _sweep_on(ctx, host, "rp-a")
    metrics = Path(host.root) / protocol.JOBS_DIR / jobs["good"].id / protocol.RESULT_DIR / protocol.METRICS_FILE
    metrics.write_text(metrics.read_text() + "{torn line\n")  # the host's disk garbled a result
    for _ in range(3):
        billing.billing(ctx, TickReport(), {"rp-a"})
    assert _pod_alive(cloud, instance) and ctx.ledger.host("rp-a").lease_state == "running"  # type: ignore[union-attr]
    (kept,) = _findings(ctx, "rp-a", billing.RULE_UNVERIFIED)
    assert kept[0] == "escalate" and "good: quarantined" in kept[1] and "kept, billing $0.79/h" in kept[1]
    assert len(list((gpuq_home / "quarantine").iterdir())) == 1  # pulled once, not at every tick
    assert [m["rule"] for m in hook if m["event"] == "escalation"] == [billing.RULE_UNVERIFIED]
    assert jobs["good"].id not in ctx.ledger.verified_pulls([jobs["good"].id])

    # the user repairs the file and pulls it by hand: the next tick ends the host and clears the escalation
    metrics.write_text(metrics.read_text().replace("{torn line\n", ""))
    (got,) = pull_jobs(ctx.ledger, host, client.command(host, SHA), [ctx.ledger.job(jobs["good"].id)],
                       gpuq_home / "results", gpuq_home / "quarantine")
    assert got.verified
    billing.billing(ctx, TickReport(), {"rp-a"})
    assert not _pod_alive(cloud, instance)
    assert [sev for sev, _ in _findings(ctx, "rp-a", billing.RULE_UNVERIFIED)] == ["escalate", "info"]


def test_an_exit_record_that_disagrees_with_the_ledger_keeps_the_host(
        ctx: Context, tmp_path: Path, cloud: FakeRunPod, gpuq_home: Path) -> None:
    host = _host(ctx, tmp_path, "rp-a")
    instance = ctx.ledger.host("rp-a").instance_id  # type: ignore[union-attr]
    jobs = _sweep_on(ctx, host, "rp-a")
    record = Path(host.root) / protocol.JOBS_DIR / jobs["broken"].id / protocol.ATTEMPTS_DIR / "1" / protocol.EXIT_FILE
    record.write_text(record.read_text().replace('"wrapper_code": 1', '"wrapper_code": 0'))
    billing.billing(ctx, TickReport(), {"rp-a"})
    assert _pod_alive(cloud, instance)
    (kept,) = _findings(ctx, "rp-a", billing.RULE_UNVERIFIED)
    assert "exit.json says exit 0, the ledger recorded 1" in kept[1]
    assert not evidence.is_home(gpuq_home / "results", jobs["broken"], 1)
    assert [p.name for p in (gpuq_home / "quarantine").iterdir()] == [f"{jobs['broken'].id}--a1--evidence"]


def test_a_host_that_does_not_answer_is_retried_then_escalated_and_ended_when_it_answers(
        ctx: Context, tmp_path: Path, cloud: FakeRunPod) -> None:
    host = _host(ctx, tmp_path, "rp-a")
    instance = ctx.ledger.host("rp-a").instance_id  # type: ignore[union-attr]
    _sweep_on(ctx, host, "rp-a")
    pending = []
    for _ in range(3):
        report = TickReport()
        billing.billing(ctx, report, set())  # its probe failed this tick
        pending.append(report.teardown_pending)
    assert pending == [["rp-a"], ["rp-a"], []]  # `gpuq watch` waits for two retries, not forever
    assert [sev for sev, _ in _findings(ctx, "rp-a", billing.RULE_RETRY)] == ["warn", "warn", "escalate"]
    assert _pod_alive(cloud, instance)
    billing.billing(ctx, TickReport(), {"rp-a"})
    assert not _pod_alive(cloud, instance)


def test_a_host_running_a_node_of_a_multinode_job_has_work(ctx: Context, tmp_path: Path) -> None:
    _host(ctx, tmp_path, "rp-a", rent=False)
    _host(ctx, tmp_path, "rp-b", rent=False)
    jobs = _jobs(ctx, "ddp")
    _run(ctx, jobs["ddp"], "rp-a", finish=False)
    ctx.ledger.update_attempt(jobs["ddp"].id, 1, nodes=json.dumps(["rp-a", "rp-b"]))
    assert _work(ctx, "rp-a").busy == ("ddp",) and _work(ctx, "rp-b").busy == ("ddp",)


def test_a_rented_host_that_fails_its_preflight_says_how_to_end_or_replace_it_and_goes_by_itself(
        ctx: Context, tmp_path: Path, cloud: FakeRunPod) -> None:
    from orchestrator.tick.preflight import HealthVerdict, record_health

    _host(ctx, tmp_path, "rp-a")
    instance = ctx.ledger.host("rp-a").instance_id  # type: ignore[union-attr]
    record_health(ctx.ledger, HealthVerdict("rp-a", "fail", "ecc: 3 uncorrected errors"))
    (event,) = [e for e in ctx.ledger.events("rp-a", exact=True) if e.rule == "preflight"]
    assert "`gpuq down rp-a`" in event.action and '`gpuq up --provider runpod --gpu "NVIDIA RTX A6000"`' in (
        event.action) and "$0.79/h" in event.action
    billing.billing(ctx, TickReport(), {"rp-a"})  # no work ever ran there, and none will
    assert not _pod_alive(cloud, instance) and ctx.ledger.host("rp-a").lease_state == "terminated"  # type: ignore[union-attr]
    assert len(_findings(ctx, "rp-a", billing.RULE_DONE)) == 1
