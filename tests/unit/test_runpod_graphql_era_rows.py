"""A ledger written by an older gpuq (RunPod over GraphQL and REST v1, spot pods included) keeps working over
REST v2: the pod ids are the same pods, so a host row as that gpuq wrote it is looked up, classified, ended and
found among the orphans by the v2 adapter; a spot row is never re-bid (v2 has no bid: docs/providers.md).

The pod is made on the fake RunPod v2 (its machine as it would be after the migration), its row as the older
`gpuq up` left it once ready; the ledger is real."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.orphans import find_orphans
from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState, LeaseState
from orchestrator.ledger import HostRow
from orchestrator.tick.leases import check_lease, provider_for
from tests.support.fakecloud import FakeRunPod
from tests.support.rented import add_rented

KEY = "rp-test-key-graphql-era-0123"
NAME = "gpuq-1234abcd-c0ffee"  # instance_name(ledger id, lease), as `gpuq up` named it


@pytest.fixture
def setup(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, FakeRunPod]]:
    with FakeRunPod(api_key=KEY) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_RUNPOD_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        ctx = open_context()
        try:
            yield ctx, fake
        finally:
            ctx.close()


def _old_row(ctx: Context, fake: FakeRunPod) -> HostRow:
    """A spot pod an older gpuq rented (`--spot --bid 0.3`), and its row as that `gpuq up` left it once ready."""
    gpu = fake.gpu_types["NVIDIA RTX A6000"]
    pod = fake.make_pod(name=NAME, gpu=gpu, count=1, image="runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
                        cloud="SECURE", env={}, ports=["22/tcp"], volume_gb=40, disk_gb=40, start_ssh=True,
                        data_center="US-KS-2")
    pod.status_polls = pod.port_polls = 0
    row = HostRow(name="runpod-c0ffee-0", kind="ssh", target=f"root@{pod.ip}", port=pod.port, root="/root/gpuq",
                  profile="runpod", key_path="", provider="runpod", instance_name=NAME, instance_id=pod.id,
                  spot=True, bid_per_gpu=0.3, gpu_type="NVIDIA RTX A6000", gpu_count=1, region="",
                  price_per_hour=0.3, lease_state="running", lease_reason="", lease_changed_at=time.time(),
                  created_at=time.time())
    return add_rented(ctx.ledger, row)


def _running_job(ctx: Context, host: str) -> str:
    spec = JobSpec(name="j0", config="c0.yaml", task="classify", config_sha256="0" * 64, line=1)
    (job,) = ctx.ledger.add_sweep(sweep_id="qaaaaab", queue_path="q.txt", workdir="/w", queue_text="...", jobs=[spec],
                                  default_retries=2)
    ctx.ledger.start_attempt(job.id, host=host, bundle_sha="s")
    ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job.id, JobState.RUNNING)
    return job.id


def test_an_older_spot_host_is_classified_never_rebid_and_ended_over_v2(setup: tuple[Context, FakeRunPod]) -> None:
    ctx, fake = setup
    row = _old_row(ctx, fake)
    job = _running_job(ctx, row.name)
    prov = provider_for(ctx, "runpod")
    seen = prov.get(row.instance_id)
    assert seen is not None and seen.name == NAME and seen.ready and seen.price_per_hour == Decimal("0.79")
    assert check_lease(ctx, row) is None  # it runs: a mere SSH drop

    fake.user_stop(row.instance_id)
    assert check_lease(ctx, row) == "manual_stop"  # v2 says EXITED and no more
    row = ctx.ledger.host(row.name)
    assert row is not None and row.lease_state == "stopped" and row.lease_reason.startswith("EXITED")
    assert ctx.ledger.job(job).state == "LOST"

    resumed = api.resume(ctx, provision=False, tick=False)  # `gpuq resume --no-provision`
    assert row.name in resumed.failed and row.name not in resumed.revived
    ops = [e["op"] for e in fake.requests()]
    assert f"POST /pods/{row.instance_id}/action" not in ops, "a spot pod is never started again on a bid"
    assert any("takes no new bid" in e.message for e in ctx.ledger.events(row.name, exact=True))

    assert find_orphans(ctx).orphans == []  # held by its row, found by its id among the v2 listing
    outcome = api.down(ctx, api.down_plan(ctx, [row.name]))
    assert outcome == {row.name: "terminated"}
    assert row.instance_id not in fake.pods
    assert f"DELETE /pods/{row.instance_id}" in [e["op"] for e in fake.requests()]
    assert all(e["path"].startswith("/v2/") for e in fake.requests()), "v2 only"


def test_a_graphql_era_row_without_an_id_is_found_by_its_name_over_rest(setup: tuple[Context, FakeRunPod]) -> None:
    """A row `gpuq up` wrote before its create answered (killed meanwhile): `gpuq down` finds the pod by name."""
    ctx, fake = setup
    row = _old_row(ctx, fake)
    pod_id = row.instance_id
    with ctx.ledger.session() as s:  # as that gpuq left it: bypassing the lease's edges on purpose
        old = s.get(HostRow, row.name)
        assert old is not None
        old.instance_id, old.target, old.port, old.lease_state = "", "", 0, LeaseState.PROVISIONING.value
    assert api.down(ctx, api.down_plan(ctx, [row.name])) == {row.name: "terminated"}
    assert pod_id not in fake.pods and ctx.ledger.host(row.name).instance_id == pod_id  # type: ignore[union-attr]
