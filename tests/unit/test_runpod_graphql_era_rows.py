"""A ledger written by the gpuq that rented over RunPod's GraphQL API keeps working over REST: the pod ids
are the same pods, so a host row as that gpuq wrote it is looked up, classified, re-bid, ended and found
among the orphans by the REST adapter (docs/providers.md, "RunPod: REST, and what stays on GraphQL").

The pod is made the way the old adapter made it (its exact ``podRentInterruptable`` document), on the fake
RunPod whose GraphQL and REST halves share their pods; the ledger is real."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from orchestrator import api
from orchestrator.api.orphans import find_orphans
from orchestrator.context import Context, open_context
from orchestrator.core.states import LeaseState
from orchestrator.ledger import HostRow
from orchestrator.tick.leases import check_lease, provider_for
from tests.support.fakecloud import FakeRunPod
from tests.support.rented import add_rented

KEY = "rp-test-key-graphql-era-0123"
NAME = "gpuq-1234abcd-c0ffee"  # instance_name(ledger id, lease), as `gpuq up` named it
# what the GraphQL adapter sent for `gpuq up --provider runpod --gpu "NVIDIA RTX A6000" --spot --bid 0.3`
OLD_CREATE = ('mutation { podRentInterruptable(input: {name: "' + NAME + '", imageName: '
              '"runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04", cloudType: SECURE, gpuTypeId: '
              '"NVIDIA RTX A6000", gpuCount: 1, bidPerGpu: 0.3, startSsh: true, supportPublicIp: true, ports: '
              '"22/tcp", volumeInGb: 40, containerDiskInGb: 40, volumeMountPath: "/workspace", minVcpuCount: 2, '
              'minMemoryInGb: 15, dataCenterId: null, env: []}) { id desiredStatus imageName env machineId '
              "machine { podHostId } } }")


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
    """A spot pod rented over GraphQL, and its row as the GraphQL-era `gpuq up` left it once ready."""
    made = httpx.post(fake.graphql_url, json={"query": OLD_CREATE}, headers={"Authorization": f"Bearer {KEY}"})
    pod_id = made.json()["data"]["podRentInterruptable"]["id"]
    pod = fake.pods[pod_id]
    row = HostRow(name="runpod-c0ffee-0", kind="ssh", target=f"root@{pod.ip}", port=pod.port, root="/root/gpuq",
                  profile="runpod", key_path="", provider="runpod", instance_name=NAME, instance_id=pod_id,
                  spot=True, bid_per_gpu=0.3, gpu_type="NVIDIA RTX A6000", gpu_count=1, region="",
                  price_per_hour=0.3, lease_state="running", lease_reason="", lease_changed_at=time.time(),
                  created_at=time.time())
    return add_rented(ctx.ledger, row)


def test_a_graphql_era_spot_host_is_classified_rebid_and_ended_over_rest(setup: tuple[Context, FakeRunPod]) -> None:
    ctx, fake = setup
    row = _old_row(ctx, fake)
    prov = provider_for(ctx, "runpod")
    seen = prov.get(row.instance_id)
    assert seen is not None and seen.name == NAME and seen.spot and seen.price_per_hour == Decimal("0.3")
    assert check_lease(ctx, row) is None  # it runs: a mere SSH drop

    fake.preempt(row.instance_id)
    assert check_lease(ctx, row) == "spot_preemption"
    row = ctx.ledger.host(row.name)
    assert row is not None and row.lease_state == "preempted" and row.lease_reason.startswith("Outbid")

    bid = Decimal(str(row.bid_per_gpu))  # what `gpuq resume` re-bids with (api/cloud.py)
    prov.resume(row.instance_id, gpu_count=row.gpu_count, bid_per_gpu=bid)
    back = prov.wait_ready(row.instance_id)
    assert back.ready and (back.ssh_host, back.ssh_port) != (row.target.split("@")[1], row.port)

    assert find_orphans(ctx).orphans == []  # held by its row, found by its id among the REST listing
    outcome = api.down(ctx, api.down_plan(ctx, [row.name]))
    assert outcome == {row.name: "terminated"}
    assert row.instance_id not in fake.pods
    ops = [e["op"] for e in fake.requests()]
    assert f"DELETE /pods/{row.instance_id}" in ops and "podTerminate" not in ops
    assert not {"pod", "myself.pods", "podStop", "podResume"} & set(ops)  # no GraphQL pod calls left


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
