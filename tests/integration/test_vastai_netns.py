"""The fake vast.ai backed by real SSH hosts (fakecloud.NetnsBackend over a HostFarm), driven by the vast.ai
adapter: an interruptible rental reached over direct SSH, outbid (paused with no warning and no signal),
classified as a spot preemption, kept paused by a bid that does not win, back on the same host with one
that does, then destroyed (the only meter stop: the disk is wiped)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.ledger import Ledger
from orchestrator.providers import vastai
from orchestrator.providers import vastai_wire as wire
from orchestrator.providers.base import classify
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.models import ProvisionRequest
from orchestrator.providers.polling import PollPolicy
from tests.conftest import run_gpuq
from tests.integration.test_fakecloud_netns import gpu_lines, ok, on, start_workload
from tests.support.fakecloud import NetnsBackend
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration

KEY = "vast-netns-key"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIVastNetnsTestKey gpuq@test"
READY = PollPolicy(timeout_s=20.0, first_s=0.02, max_s=0.1)
GONE = PollPolicy(timeout_s=10.0, first_s=0.02, max_s=0.1)


@pytest.fixture
def netns(host_farm: FarmFactory) -> Iterator[Callable[..., tuple[HostFarm, NetnsBackend]]]:
    made: list[NetnsBackend] = []

    def make(n: int = 1, gpus: int = 1, **kw: Any) -> tuple[HostFarm, NetnsBackend]:
        farm = host_farm(n=n, gpus=gpus)
        backend = NetnsBackend(farm, **kw)
        made.append(backend)
        return farm, backend

    yield make
    for backend in made:
        backend.close()


def adapter(cloud: FakeVastAI) -> vastai.VastAIProvider:
    return vastai.VastAIProvider(ApiKey(cloud.api_key, "VAST_API_KEY"), url=cloud.url,
                                 transport=httpx.HTTPTransport(verify=False),
                                 policy=dataclasses.replace(vastai.RETRY, jitter=0.0, first_delay_s=0.05),
                                 min_interval_s=0.0, ready=READY, gone=GONE)


def test_vastai_interruptible_outbid_then_rebid_on_the_same_host(
        netns: Callable[..., tuple[HostFarm, NetnsBackend]]) -> None:
    farm, backend = netns(n=2, gpus=1)
    with FakeVastAI(api_key=KEY, backend=backend) as cloud:
        provider = adapter(cloud)
        try:
            [inst] = provider.provision(ProvisionRequest("gpuq-vast", "RTX 4090", spot=True, ssh_public_key=PUB))
            assert inst.spot and not inst.ready
            ready = provider.wait_ready(inst.id)
            host = backend.host(inst.id)
            i = host.index
            assert (ready.ssh_host, ready.ssh_port, ready.ssh_user) == (host.address, 22, "root")
            assert not wire.via_proxy(ready), "the direct endpoint, not vast.ai's proxy"
            bid = cloud.instances[int(inst.id)].bid
            assert bid is not None and ready.price_per_hour is not None and ready.price_per_hour >= Decimal(str(bid))
            gpus = gpu_lines(farm, ready)
            key = host.host_key_line
            ok(on(farm, ready, "sh", "-c", "echo kept > /root/kept"))
            work = start_workload(farm, ready, host.tmp)

            # Outbid: paused at once; no SIGTERM reaches the workload (the trap never writes its marker).
            cloud.preempt(inst.id)
            paused = provider.get(inst.id)
            assert paused is not None and paused.reason.startswith("Outbid: ") and not paused.ready
            assert classify(paused) == "spot_preemption"
            backend.wait_idle()
            assert farm.host_pids(i) == [] and not farm.is_up(i)
            assert not set(work.values()) & set(farm.host_pids(i))
            assert not (host.root / "sigterm-marker").exists(), "an outbid vast.ai instance gets no warning"
            assert (host.root / "kept").read_text() == "kept\n"

            # A bid that does not beat the higher one leaves it paused (and its disk billing).
            higher = cloud.instances[int(inst.id)].outbid_by
            assert higher is not None
            provider.resume(inst.id, gpu_count=1, bid_per_gpu=Decimal(str(higher)))
            still = provider.get(inst.id)
            assert still is not None and classify(still) == "spot_preemption" and not farm.is_up(i)

            # One that does: the same host (address, host key, disk), a fresh /tmp.
            provider.resume(inst.id, gpu_count=1, bid_per_gpu=Decimal(str(higher)) + Decimal("0.05"))
            back = provider.wait_ready(inst.id)
            assert backend.host_index(inst.id) == i and host.host_key_line == key
            assert (back.ssh_host, back.ssh_port) == (host.address, 22)
            out = ok(on(farm, back, "sh", "-c", "cat /root/kept; ls -A /tmp")).split()
            assert out[0] == "kept" and "trap-ready" not in out
            assert gpu_lines(farm, back) == gpus

            # Destroy, the only meter stop: gone from the API, the disk wiped, the host back in the pool.
            provider.terminate(inst.id)
            provider.wait_gone(inst.id)
            backend.wait_idle()
            assert provider.get(inst.id) is None
            assert sorted(p.name for p in host.root.iterdir()) == [".ssh"] and backend.owner(i) is None
            assert backend.owner(1 - i) is None, "the other host of the pool was never rented"
        finally:
            provider.close()
    assert [e[0] for e in backend.events] == ["provision", "crash", "provision", "destroy"]
    assert backend.errors == []


def test_gpuq_up_rents_a_vastai_interruptible_host_and_patrol_sees_the_outbid(
        netns: Callable[..., tuple[HostFarm, NetnsBackend]], tmp_path: Path) -> None:
    """The CLI through the registry: ``gpuq up --provider vastai --spot`` rents, audits over SSH and
    registers the host at its bid; an outbid is a spot preemption for ``gpuq patrol``; ``gpuq down`` destroys."""
    farm, backend = netns(n=1, gpus=1)
    with FakeVastAI(api_key=KEY, backend=backend) as cloud:
        home = tmp_path / "gpuq-home"
        env = {"GPUQ_HOME": str(home), "GPUQ_SSH_KEY": str(farm.client_key), "GPUQ_PROVIDER_POLL_S": "0.2",
               "GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_HEARTBEAT_S": "1", "VAST_API_KEY": KEY,
               "GPUQ_VASTAI_API_URL": cloud.url}
        up = run_gpuq("up", "--provider", "vastai", "--gpu", "RTX 4090", "--spot", env=env, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        [row] = _rows(home)
        [inst] = cloud.instances.values()
        assert (row.provider, row.instance_id, row.lease_state) == ("vastai", str(inst.id), "running")
        assert row.spot and row.price_per_hour is not None and inst.bid is not None
        assert row.price_per_hour >= inst.bid and backend.host(str(inst.id)).address in row.target

        cloud.preempt(inst.id)
        backend.wait_idle()
        patrolled = run_gpuq("patrol", env=env, timeout=300)
        assert patrolled.returncode == 0, patrolled.stdout + patrolled.stderr
        [row] = _rows(home)
        assert row.lease_state == "preempted" and "Outbid" in row.lease_reason, (row, patrolled.stdout)

        gone = run_gpuq("down", row.name, "--yes", env=env, timeout=300)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert cloud.instances == {} and _rows(home)[0].lease_state == "terminated"


def _rows(home: Path) -> list[Any]:
    ledger = Ledger(home / "ledger.db")
    try:
        return list(ledger.hosts())
    finally:
        ledger.close()
