"""The provider's word a tick late: a rented host whose job just failed (a rank exited 1 in the
preemption's grace, before anything said "preempted") is found preempted on the next look, and the
just-failed job becomes PREEMPTED, so auto-resume continues it (tick/leases.py check_lease with
orchestrator/health/stops.py; the vast.ai API is the fake, gpuq's spot market since RunPod has none; the
ledger is real)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import HostRow
from orchestrator.providers.models import ProvisionRequest
from orchestrator.tick.leases import check_lease
from orchestrator.tick.settle import settle
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import FakeOffer
from tests.support.rented import add_rented

KEY = "vast-test-key-0123456789"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILatePreemptionTestKeyOnly000000000000000 gpuq@test"


@pytest.fixture
def setup(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, FakeVastAI]]:
    with FakeVastAI(api_key=KEY, offers=(FakeOffer(7001, "RTX 4090", 2, 24564, 0.70, 0.40),)) as fake:
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_VASTAI_API_URL", fake.url)
        ctx = open_context()
        try:
            yield ctx, fake
        finally:
            ctx.close()


def test_a_preemption_reported_a_tick_late_turns_the_failed_job_into_preempted(
        setup: tuple[Context, FakeVastAI]) -> None:
    ctx, fake = setup
    from orchestrator.tick.leases import provider_for

    (pod,) = provider_for(ctx, "vastai").provision(ProvisionRequest(name="gpuq-late", gpu_type="RTX 4090",
                                                                  gpu_count=2, spot=True, ssh_public_key=PUBLIC_KEY))
    add_rented(ctx.ledger, HostRow(name="pod", kind="ssh", target="root@203.0.113.9", root="/root/gpuq",
                                   provider="vastai", instance_id=pod.id, spot=True, lease_state="running"))
    specs = [JobSpec(name=f"j{i}", config=f"c{i}.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i in range(2)]
    failed, running = (r.id for r in ctx.ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w",
                                                          queue_text="...", jobs=specs, default_retries=2))
    for job in (failed, running):
        ctx.ledger.start_attempt(job, host="pod", bundle_sha="s")
        ctx.ledger.transition(job, AttemptState.RUNNING, attempt=1)
        ctx.ledger.transition(job, JobState.RUNNING)
    # this tick: j0's rank exited 1 (its peer vanished); nothing says "signal"; the pod still runs
    ctx.ledger.update_attempt(failed, 1, exit_code=1, message="exit 1: trainer exited 1")
    ctx.ledger.transition(failed, AttemptState.EXITED, attempt=1)
    assert settle(ctx.ledger, failed, "unknown", ctx.settings).action == "none"
    assert ctx.ledger.job(failed).state == "FAILED"
    assert check_lease(ctx, ctx.ledger.host("pod")) is None  # the provider: still running
    assert ctx.ledger.job(failed).state == "FAILED"

    fake.preempt(pod.id)  # the next tick: the provider reports the outbid
    assert check_lease(ctx, ctx.ledger.host("pod")) == "spot_preemption"
    assert ctx.ledger.job(running).state == "PREEMPTED"
    assert ctx.ledger.job(failed).state == "PREEMPTED"  # resumable: `gpuq resume`, auto-resume
    assert ctx.ledger.attempt(failed, 1).state == "PREEMPTED"
    assert ctx.ledger.failed_attempts(failed) == 0  # a preemption, not a retry
