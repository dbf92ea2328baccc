"""A rented host that stopped its own billing (payload/agent/gpuq_serving/gpuq_selfstop.py) is recorded by the next
gpuq command through the lease gate: STOPPED as of the latest it can have stopped, with the idle hours and money
billed after its last work (orchestrator/money/selfstop.py, tick/leases.py); a stop with work there, or with the
lease off, is not the host's own.  On a real ledger, against the fake vast.ai."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState, LeaseState
from orchestrator.ledger import HostRow
from orchestrator.money.selfstop import CHECK_S, can_stop_itself, self_stop_cost
from orchestrator.providers.models import ProvisionRequest
from orchestrator.tick.leases import check_lease, provider_for
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import FakeOffer
from tests.support.rented import add_rented

KEY = "vast-test-key-0123456789"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILatePreemptionTestKeyOnly000000000000000 gpuq@test"
HOUR = 3600.0


def test_the_stop_is_bounded_by_gpuqs_own_clock() -> None:
    # last work ended at 1000 s, last probe 1600 s, lease 30 min: stopped by 1600 + 1800 + one check
    got = self_stop_cost(1600.0, 1000.0, 1800.0, 2.0, found_at=100_000.0)
    assert got.stopped_at == 1600.0 + 1800.0 + CHECK_S
    assert got.idle_hours == pytest.approx((3400.0 + CHECK_S - 1000.0) / HOUR)
    assert got.cost == pytest.approx(2.0 * got.idle_hours)
    # found stopped sooner than the bound: never later than when gpuq saw it
    assert self_stop_cost(1600.0, 1000.0, 1800.0, 2.0, found_at=2000.0).stopped_at == 2000.0
    # the last work ended after the last probe: the lease counts from the work
    assert self_stop_cost(500.0, 1000.0, 60.0, None, found_at=1e6).stopped_at == 1000.0 + 60.0 + CHECK_S
    assert self_stop_cost(500.0, 1000.0, 60.0, None, found_at=1e6).cost is None
    assert self_stop_cost(0.0, 1000.0, 60.0, 1.0, found_at=900.0).idle_hours == 0.0
    assert can_stop_itself("runpod") and can_stop_itself("vastai") and not can_stop_itself("lambda")


def _ctx(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeVastAI, lease_min: str) -> Context:
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("GPUQ_VASTAI_API_URL", fake.url)
    monkeypatch.setenv("GPUQ_LEASE_TIMEOUT_MIN", lease_min)
    monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
    return open_context()


def _rented_with_one_job(ctx: Context, *, running: bool, dispatched_long_ago: bool) -> tuple[str, str, float]:
    (inst,) = provider_for(ctx, "vastai").provision(
        ProvisionRequest(name="gpuq-self", gpu_type="RTX 4090", gpu_count=1, ssh_public_key=PUBLIC_KEY)
    )
    created = time.time() - 2 * HOUR
    add_rented(
        ctx.ledger,
        HostRow(
            name="box",
            kind="ssh",
            target="root@203.0.113.9",
            root="/root/gpuq",
            provider="vastai",
            instance_id=inst.id,
            lease_state="running",
            price_per_hour=1.5,
            created_at=created,
            lease_changed_at=created,
        ),
    )
    spec = JobSpec(name="j0", config="c0.yaml", task="classify", config_sha256="0" * 64, line=1)
    (job,) = (
        r.id
        for r in ctx.ledger.add_sweep(
            sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="...", jobs=[spec], default_retries=0
        )
    )
    ctx.ledger.start_attempt(job, host="box", bundle_sha="s")
    ctx.ledger.transition(job, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job, JobState.RUNNING)
    ended = created + HOUR
    if dispatched_long_ago:  # the controller dispatched it and went away (a closed laptop)
        ctx.ledger.update_attempt(job, 1, created_at=created, started_at=created)
    if not running:
        ctx.ledger.update_attempt(
            job, 1, exit_code=0, created_at=created, started_at=created, ended_at=ended, message="exit 0"
        )  # it ran an hour ago
        ctx.ledger.transition(job, AttemptState.EXITED, attempt=1)
        ctx.ledger.transition(job, JobState.SUCCEEDED)
    ctx.ledger.update_host("box", created_at=created, last_probe_at=ended + 60.0)  # rented two hours ago
    return inst.id, job, ended


@pytest.mark.parametrize(
    ("lease_min", "running", "long_ago", "own"),
    [("1", False, True, True), ("0", False, True, False), ("1", True, False, False), ("1", True, True, True)],
)
def test_a_stopped_host_is_recorded_as_its_own_stop_only_when_it_could_be(
    gpuq_home: Path, monkeypatch: pytest.MonkeyPatch, lease_min: str, running: bool, long_ago: bool, own: bool
) -> None:
    """Its own only with the lease on and no gpuq command reaching it for the lease: a job gpuq saw running
    there an hour ago and never since ended unseen (the host stops only once idle), a job gpuq dispatched just
    now did not (a stop by the user)."""
    with FakeVastAI(api_key=KEY, offers=(FakeOffer(7001, "RTX 4090", 1, 24564, 1.5, 0.40),)) as fake:
        ctx = _ctx(gpuq_home, monkeypatch, fake, lease_min)
        try:
            inst_id, job, ended = _rented_with_one_job(ctx, running=running, dispatched_long_ago=long_ago)
            provider_for(ctx, "vastai").stop(inst_id)  # as the host's `vastai stop instance` does
            assert check_lease(ctx, ctx.ledger.host("box")) == "manual_stop"
            row = ctx.ledger.host("box")
            assert row is not None and row.lease is LeaseState.STOPPED
            rules = {e.rule for e in ctx.ledger.events("box", exact=True) if getattr(e, "rule", "")}
            if not own:
                assert "stopped by itself" not in row.lease_reason and "self_stop" not in rules
                return
            if running:  # its end is on the stopped disk: the latest it can have stopped is when gpuq found it
                assert row.lease_changed_at == pytest.approx(time.time(), abs=30)
                assert "ended unseen" in row.lease_reason and "at most $" in row.lease_reason, row.lease_reason
                assert ctx.ledger.job(job).state == "RUNNING"  # left as gpuq last saw it, not guessed
                assert check_lease(ctx, ctx.ledger.host("box")) == "manual_stop"  # a second look changes nothing
                assert ctx.ledger.host("box") == row and ctx.ledger.job(job).state == "RUNNING"
                return
            stopped = ended + 60.0 + 60.0 + CHECK_S  # last probe + 1 min lease + one check
            assert row.lease_changed_at == pytest.approx(stopped)
            idle_h = (stopped - ended) / HOUR
            assert f"{idle_h:.2f} idle h" in row.lease_reason and f"${1.5 * idle_h:.2f}" in row.lease_reason
            assert "self_stop" in rules and ctx.ledger.job(job).state == "SUCCEEDED"  # results stay, job untouched
        finally:
            ctx.close()


def test_gpuq_up_says_at_rent_time_which_machines_cannot_stop_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.api.rented import UpResult
    from orchestrator.cli.up import up_report
    from tests.support.rented import rented_row

    up_report(UpResult(provider="lambda", lease="l1", wanted=1, hosts=[rented_row("lam-1", provider="lambda")]))
    err = capsys.readouterr().err
    assert "lambda machines cannot stop their own billing" in err and "set webhook_url" in err, err
    up_report(UpResult(provider="lambda", lease="l1", wanted=1, hosts=[rented_row("lam-1", provider="lambda")],
                       noticed=["lam-1"]))
    assert "each POSTs a notice to your webhook_url" in capsys.readouterr().err
    up_report(UpResult(provider="runpod", lease="l2", wanted=1, hosts=[rented_row("rp-1")]))
    assert "cannot stop" not in capsys.readouterr().err


@pytest.mark.parametrize(("claim_ago", "clock"), [(600.0, False), (30 * 86400.0, True), (-86400.0, True)])
def test_the_hosts_own_record_of_its_stop_is_kept_as_its_claim(
    gpuq_home: Path, monkeypatch: pytest.MonkeyPatch, claim_ago: float, clock: bool
) -> None:
    """Once the machine is back, its selfstop.json says when it stopped: an info finding with what that saves
    against gpuq's bound, and a host_clock warning for a claim before its lease ran out or after gpuq found it."""
    import json as jsonlib

    from orchestrator.core.specs import CommandResult
    from orchestrator.tick.leases import own_stop_record

    with FakeVastAI(api_key=KEY, offers=(FakeOffer(7001, "RTX 4090", 1, 24564, 1.5, 0.40),)) as fake:
        ctx = _ctx(gpuq_home, monkeypatch, fake, "1")
        try:
            _rented_with_one_job(ctx, running=True, dispatched_long_ago=True)
            found = time.time()
            row = ctx.ledger.host("box")
            assert row is not None
            stopped = row.model_copy(update={"lease_state": "stopped", "lease_changed_at": found})
            record = jsonlib.dumps({"action": "stop", "at_epoch": found - claim_ago})

            class Box:
                root = "/root/gpuq"

                def path(self, *parts: str) -> str:
                    return "/".join([self.root, *parts])

                def run(self, argv: list[str], timeout: float = 60.0) -> CommandResult:
                    return CommandResult(host="box", argv=tuple(argv), exit_code=0, stdout=record, stderr="",
                                         duration_s=0.0)

            monkeypatch.setattr(ctx.fleet, "host", lambda _row: Box())
            own_stop_record(ctx, stopped, row)
            events = ctx.ledger.events("box", exact=True)
            (claim,) = [e for e in events if e.rule == "self_stop_claim"]
            assert "never billed" in claim.message
            warned = [e for e in events if e.rule == "host_clock"]
            assert bool(warned) is clock, [e.message for e in events]
            if not clock:  # 10 min before gpuq found it, 1 h after its lease ran out: 0.17 h saved at $1.50/h
                assert "0.17 h before gpuq found it stopped ($0.25)" in claim.message, claim.message
        finally:
            ctx.close()
