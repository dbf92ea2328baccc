"""The webhook's four forms (``webhook_format``: json, slack, discord, ntfy; orchestrator/tick/notify.py,
docs/health.md "Notifications") as a loopback receiver gets them, each from the real code that sends:
the tick's stages on a real ledger (a failed and a lost job, a preemption at the fake vast.ai, an idle
rented host, a budget alert, a finished sweep).  Each carries one line a person reads: the job or
sweep, the host, what happened and the next command; redacted and without control characters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.config import load_settings
from orchestrator.core.errors import ConfigError
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health.patrol import Finding, JobView, Severity, ended_badly
from orchestrator.ledger import HostRow, Job
from orchestrator.money import budget
from orchestrator.providers.models import ProvisionRequest
from orchestrator.tick import billing, notify
from orchestrator.tick import budget as tick_budget
from orchestrator.tick.findings import TickReport, record, sweeps_done
from orchestrator.tick.leases import check_lease, provider_for
from orchestrator.tick.settle import settle
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.rented import add_rented
from tests.support.webhook import Delivery, receiver

SWEEP = "qnote01"
KEY = "rp-notify-key-0123456789"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINotifyFormsTestKeyOnly0000000000000000000 gpuq@test"
TOKEN = "ghp_" + "A1b2C3d4" * 5  # a GitHub token's shape: redacted wherever it goes


@dataclass
class Hooked:
    ctx: Context
    got: list[Delivery]
    form: str

    def line(self, delivery: Delivery) -> str:
        """The human line of ``delivery``, checked against its form's contract."""
        if self.form == "ntfy":
            assert delivery.headers["content-type"].startswith("text/plain")
            assert delivery.headers["title"].startswith("gpuq: ") and len(delivery.headers["title"]) <= 120
            assert delivery.headers["priority"] in ("low", "default", "high")
            return delivery.text
        assert delivery.headers["content-type"] == "application/json"
        body = delivery.json()
        if self.form == "slack":
            assert set(body) == {"text", "mrkdwn"} and body["mrkdwn"] is False
            return str(body["text"]).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        if self.form == "discord":
            assert set(body) == {"content", "allowed_mentions"} and body["allowed_mentions"] == {"parse": []}
            assert len(body["content"]) <= notify.DISCORD_MAX
            return discord_shown(str(body["content"]))[0]
        assert body["source"] == "gpuq" and isinstance(body["time"], float)
        return str(body["text"])

    def only(self) -> tuple[Delivery, str]:
        assert len(self.got) == 1, [d.body for d in self.got]
        return self.got[0], self.line(self.got[0])


MARKUP = "*_~`|<>[]()#"  # what Discord's markdown reads as formatting, a link, a spoiler or a heading


def discord_shown(content: str) -> tuple[str, str]:
    """(the text Discord shows for ``content``, the markup characters it would read as markup): a backslash
    before a character that is neither a letter, a digit nor a space shows that character as typed."""
    shown, markup, i = [], [], 0
    while i < len(content):
        if content[i] == "\\" and i + 1 < len(content) and not (content[i + 1].isalnum() or content[i + 1].isspace()):
            shown.append(content[i + 1])
            i += 2
            continue
        shown.append(content[i])
        markup += [content[i]] if content[i] in MARKUP else []
        i += 1
    return "".join(shown), "".join(markup)


@pytest.fixture(params=notify.FORMATS)
def hooked(request: pytest.FixtureRequest, gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hooked]:
    with receiver() as (url, got):
        monkeypatch.setenv("GPUQ_WEBHOOK_URL", url)
        monkeypatch.setenv("GPUQ_WEBHOOK_FORMAT", request.param)
        context = open_context()
        try:
            yield Hooked(context, got, request.param)
        finally:
            context.close()


def _jobs(ctx: Context, *names: str, retries: int = 0) -> list[Job]:
    specs = [JobSpec(name=n, config="c.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i, n in enumerate(names)]
    return ctx.ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                                default_retries=retries)


def _running(ctx: Context, job: Job, host: str) -> None:
    ctx.ledger.start_attempt(job.id, host=host, bundle_sha="s")
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job.id, JobState.RUNNING)


def _ended(ctx: Context, job: Job, host: str, outcome: str, klass: str, message: str) -> None:
    """What the tick does when an attempt ends badly: settle the job, record the "ended badly" finding."""
    if outcome == "lost":
        ctx.ledger.transition(job.id, AttemptState.LOST, attempt=1, message=message)
        ctx.ledger.transition(job.id, JobState.LOST, message=message)
    else:
        ctx.ledger.update_attempt(job.id, 1, exit_code=1, message=message)
        ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    decision = settle(ctx.ledger, job.id, klass, ctx.settings, attempt=1)
    found = ended_badly(host, JobView(job.id, job.name, 1), outcome, klass, decision,
                        decision.action == "requeue", message=message)
    record(ctx, [found], subjects=[], report=TickReport())


def test_a_failed_job_names_its_sweep_host_class_and_the_log_to_read(hooked: Hooked) -> None:
    (job,) = _jobs(hooked.ctx, "lr3")
    _running(hooked.ctx, job, "gpu1")
    _ended(hooked.ctx, job, "gpu1", "exited", "config", "exit 1: ValueError: bad lr")
    delivery, line = hooked.only()
    assert line.startswith(f"job lr3 ({job.id}) of sweep {SWEEP} on gpu1: ")
    assert "ValueError: bad lr (class: config)" in line and "never retried" in line
    assert line.endswith(f"; next: gpuq logs {job.id} --attempt 1")
    assert "\n" not in line
    if hooked.form == "ntfy":
        assert delivery.headers["title"] == "gpuq: job failed" and delivery.headers["priority"] == "high"
    if hooked.form == "json":  # today's fields, unchanged, and the line
        body = delivery.json()
        assert {k: body[k] for k in ("event", "rule", "host", "job")} == {
            "event": "escalation", "rule": "failed", "host": "gpu1", "job": job.id}
        assert body["message"] == "lr3 a1: exit 1: ValueError: bad lr (class: config)"
        assert body["action"].startswith("config error: never retried")
        assert set(body) == {"source", "time", "event", "rule", "host", "job", "message", "action", "text"}


def test_a_lost_job_without_retries_says_gpuq_resume(hooked: Hooked) -> None:
    (job,) = _jobs(hooked.ctx, "seed2")
    _running(hooked.ctx, job, "gpu2")
    _ended(hooked.ctx, job, "gpu2", "lost", "vanished", "")
    assert hooked.ctx.ledger.job(job.id).state == JobState.LOST.value
    delivery, line = hooked.only()
    assert line.startswith(f"job seed2 ({job.id}) of sweep {SWEEP} on gpu2: process group gone")
    assert "no retries left" in line and line.endswith("; next: gpuq resume")
    if hooked.form == "ntfy":
        assert delivery.headers["title"] == "gpuq: job lost"


def test_a_requeued_failure_is_not_sent(hooked: Hooked) -> None:
    (job,) = _jobs(hooked.ctx, "flaky", retries=1)
    _running(hooked.ctx, job, "gpu1")
    _ended(hooked.ctx, job, "gpu1", "exited", "transient", "exit 3: NCCL timeout")
    assert hooked.ctx.ledger.job(job.id).state == JobState.QUEUED.value and hooked.got == []


def test_a_preemption_names_the_host_and_gpuq_resume(hooked: Hooked, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = hooked.ctx
    with FakeVastAI(api_key=KEY) as fake:  # gpuq's spot market (RunPod rents no spot pods)
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_VASTAI_API_URL", fake.url)
        (pod,) = provider_for(ctx, "vastai").provision(ProvisionRequest(name="gpuq-n", gpu_type="RTX 4090", spot=True,
                                                                     ssh_public_key=PUBLIC_KEY))
        add_rented(ctx.ledger, HostRow(name="pod", kind="ssh", target="root@203.0.113.9", root="/r",
                                       provider="vastai", instance_id=pod.id, spot=True, lease_state="running"))
        (job,) = _jobs(ctx, "long")
        _running(ctx, job, "pod")
        fake.preempt(pod.id)
        assert check_lease(ctx, ctx.ledger.host("pod")) == "spot_preemption"
        assert check_lease(ctx, ctx.ledger.host("pod")) == "spot_preemption"  # said once
    delivery, line = hooked.only()
    assert line.startswith(f"host pod: spot preemption: vastai {pod.id} is ")
    assert "1 job(s) stopped there" in line and line.endswith("; next: gpuq resume")
    if hooked.form == "json":
        body = delivery.json()
        assert (body["event"], body["rule"], body["host"], body["job"]) == (
            "escalation", "spot_preemption", "pod", None)


def test_an_idle_rented_host_names_its_price_and_gpuq_down(hooked: Hooked) -> None:
    ctx = hooked.ctx
    add_rented(ctx.ledger, HostRow(name="rp-a", kind="ssh", target="root@rp-a.invalid", root="/r", provider="runpod",
                                   instance_id="pod-a", lease_state="running", price_per_hour=0.79))
    t0 = ctx.ledger.host("rp-a").created_at  # type: ignore[union-attr]
    billing.billing(ctx, TickReport(), set(), now=t0 + 16 * 60)
    delivery, line = hooked.only()
    assert line.startswith("host rp-a: rp-a has had no work for 16 min and bills $0.79/h (runpod pod-a)")
    assert line.endswith("; next: gpuq down rp-a")
    if hooked.form == "ntfy":
        assert delivery.headers["priority"] == "default" and "idle_billing" in delivery.headers["tags"]
    if hooked.form == "json":
        body = delivery.json()
        assert (body["event"], body["host"], body["price_per_hour"], body["idle_min"]) == (
            "idle_billing", "rp-a", 0.79, 16.0)
        assert {"provider", "instance", "message", "action"} <= set(body)


def test_a_budget_alert_names_the_sweep_and_gpuq_budget(hooked: Hooked) -> None:
    ctx = hooked.ctx
    _jobs(ctx, "a")
    tick_budget.alert(ctx.ledger, ctx.settings, SWEEP, budget.Standing(10.0, spent=8.5))
    delivery, line = hooked.only()
    assert line.startswith(f"sweep {SWEEP}: at 85% of its budget: ")
    assert line.endswith(f"; next: gpuq budget {SWEEP} USD")
    if hooked.form == "ntfy":
        assert delivery.headers["title"] == "gpuq: budget warning"
    if hooked.form == "json":
        body = delivery.json()
        assert (body["event"], body["severity"], body["sweep"], body["cap_usd"], body["spent_usd"]) == (
            "budget", "warn", SWEEP, 10.0, 8.5)


def test_a_finished_sweep_counts_its_states_and_points_at_its_results(hooked: Hooked) -> None:
    ctx = hooked.ctx
    good, bad = _jobs(ctx, "good", "bad")
    for job in (good, bad):
        _running(ctx, job, "gpu1")
        ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    ctx.ledger.transition(good.id, JobState.SUCCEEDED)
    ctx.ledger.transition(bad.id, JobState.FAILED)
    sweeps_done(ctx, TickReport())
    sweeps_done(ctx, TickReport())  # announced once
    delivery, line = hooked.only()
    assert line == f"sweep {SWEEP}: finished: FAILED=1, SUCCEEDED=1; next: gpuq results --sweep {SWEEP}"
    if hooked.form == "ntfy":
        assert delivery.headers["title"] == "gpuq: sweep finished, 1 not succeeded"
    if hooked.form == "json":
        body = delivery.json()
        assert (body["event"], body["sweep"], body["states"]) == ("sweep_done", SWEEP, {"FAILED": 1, "SUCCEEDED": 1})


def test_host_text_is_redacted_cut_and_harmless_in_every_form(hooked: Hooked) -> None:
    """A finding quoting host text: a token, terminal escapes, a Slack broadcast, and far too much of it."""
    ctx = hooked.ctx
    (job,) = _jobs(ctx, "noisy")
    hostile = f"\x1b]0;owned\x07<!channel> token {TOKEN} \x1b[8mhidden\r\nnext line " + "é" * 5000
    record(ctx, [Finding("crash", Severity.ESCALATE, "gpu1", f"noisy a1: {hostile}", "triage", job=job.id)],
           subjects=[], report=TickReport())
    delivery, line = hooked.only()
    raw = delivery.body.decode("utf-8") + json.dumps(dict(delivery.headers))
    assert TOKEN not in raw and "[redacted]" in line
    assert not any(c in line for c in "\x1b\x07\r\n") and "owned<!channel>" in line.replace(" ", "")
    assert line.startswith(f"job noisy ({job.id}) of sweep {SWEEP} on gpu1: ")
    assert line.endswith("…") and len(line) <= notify.LINE_MAX
    if hooked.form == "slack":
        assert "<!channel>" not in delivery.text and "&lt;!channel&gt;" in delivery.json()["text"]
    if hooked.form == "discord":
        assert len(delivery.json()["content"]) == notify.DISCORD_MAX
    if hooked.form == "ntfy":
        assert len(delivery.body) <= notify.NTFY_MAX_BYTES and delivery.text.endswith("…")
    if hooked.form == "json":
        assert TOKEN not in delivery.json()["message"]


def test_host_text_carries_no_markup_into_slack_or_discord(hooked: Hooked) -> None:
    """issue 43 #9: a disguised link, a spoiler, bold, code and a heading from host text stay text in every form."""
    (job,) = _jobs(hooked.ctx, "marked")
    markup = "[log in](https://evil.example) ||spoiler|| *bold* _it_ ~del~ `code` <https://evil.example|here> # h \\*"
    record(hooked.ctx, [Finding("crash", Severity.ESCALATE, "gpu1", f"marked a1: {markup}", "triage", job=job.id)],
           subjects=[], report=TickReport())
    delivery, line = hooked.only()
    assert markup in line  # shown as typed
    if hooked.form == "discord":
        assert discord_shown(delivery.json()["content"]) == (line, "")  # no character left to read as markup
    if hooked.form == "slack":
        assert delivery.json()["mrkdwn"] is False and not set("<>") & set(delivery.json()["text"])


def test_the_format_is_checked_and_only_the_user_chooses_it(tmp_path: Path) -> None:
    home = {"GPUQ_HOME": str(tmp_path)}
    assert load_settings(env=home).webhook_format == "json"
    assert load_settings(env={**home, "GPUQ_WEBHOOK_FORMAT": "ntfy"}).webhook_format == "ntfy"
    with pytest.raises(ConfigError, match="GPUQ_WEBHOOK_FORMAT"):
        load_settings(env={**home, "GPUQ_WEBHOOK_FORMAT": "teams"})
    project = tmp_path / "project"
    project.mkdir()
    (project / "gpuq.toml").write_text('webhook_format = "slack"\n')
    with pytest.raises(ConfigError, match="webhook_format can only be set in your own"):
        load_settings(env=home, project_dir=project)
