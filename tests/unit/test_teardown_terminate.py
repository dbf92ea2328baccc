"""What ``gpuq down`` and down-when-done see when they end a rented machine (orchestrator/tick/teardown.py
``terminate``), against the fake RunPod: a machine the provider says is gone is "terminated", its lease
terminated with the reason and the termination an event of the host; a terminate the provider refuses is
"terminate failed: <why>", recorded on the host, and the lease (still billing) is left as it was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.states import HoldKind, LeaseState
from orchestrator.ledger import HostRow
from orchestrator.providers.models import ProvisionRequest
from orchestrator.tick import teardown
from orchestrator.tick.leases import provider_for
from tests.support.fakecloud import FakeRunPod
from tests.support.rented import add_rented

KEY = "rp-teardown-key-0123456789"


@pytest.fixture
def cloud(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=KEY) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", KEY)
        monkeypatch.setenv("GPUQ_RUNPOD_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        yield fake


@pytest.fixture
def ctx(cloud: FakeRunPod) -> Iterator[Context]:
    context = open_context()
    try:
        yield context
    finally:
        context.close()


def _rented(ctx: Context) -> HostRow:
    (inst,) = provider_for(ctx, "runpod").provision(ProvisionRequest(name="gpuq-t-rp1", gpu_type="NVIDIA RTX A6000"))
    return add_rented(ctx.ledger, HostRow(name="rp1", kind="ssh", target="", root="/w", provider="runpod",
                                          instance_id=inst.id, lease_state="running", price_per_hour=0.79))


def test_a_machine_the_provider_says_is_gone_is_terminated_with_its_reason(ctx: Context, cloud: FakeRunPod) -> None:
    row = _rented(ctx)
    outcome, gone = teardown.terminate(ctx, row, reason="gpuq down")
    assert outcome == "terminated"
    after = ctx.ledger.host("rp1")
    assert after is not None and after.lease is LeaseState.TERMINATED and after.lease_reason == "gpuq down"
    assert gone is not None and after.lease_changed_at == gone
    assert after.hold is HoldKind.TERMINATED  # nothing is placed on it again
    assert [(e.kind, e.message) for e in ctx.ledger.events("rp1", exact=True) if "terminated (gone)" in e.message] \
        == [("host", f"runpod {row.instance_id} terminated (gone)")]


def test_a_terminate_the_provider_refuses_is_reported_and_the_lease_kept(ctx: Context, cloud: FakeRunPod) -> None:
    row = _rented(ctx)
    cloud.rest_error("pod is locked", operation="DELETE /pods", status=400)
    outcome, gone = teardown.terminate(ctx, row, reason="gpuq down")
    assert outcome.startswith("terminate failed: ") and "pod is locked" in outcome
    assert gone is None
    after = ctx.ledger.host("rp1")
    assert after is not None and after.lease is LeaseState.RUNNING
    failed = [(e.kind, e.message) for e in ctx.ledger.events("rp1", exact=True) if "failed" in e.message]
    assert len(failed) == 1 and failed[0][0] == "host"
    assert failed[0][1].startswith(f"terminate of {row.instance_id} failed: ") and "pod is locked" in failed[0][1]


class _Conn:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_a_terminated_machine_leaves_no_ssh_identity_for_the_next_one_at_its_address(
        ctx: Context, cloud: FakeRunPod) -> None:
    """The provider may hand the same IP:port to someone else's machine: its pinned key and gpuq's open
    connection to it go with the termination; another host's key stays."""
    (inst,) = provider_for(ctx, "runpod").provision(ProvisionRequest(name="gpuq-t-rp2", gpu_type="NVIDIA RTX A6000"))
    row = add_rented(ctx.ledger, HostRow(name="rp2", kind="ssh", target="root@203.0.113.7", port=2222, root="/w",
                                         provider="runpod", instance_id=inst.id, lease_state="running"))
    known = ctx.settings.home / "known_hosts"
    other = "[203.0.113.8]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOth\n"
    known.write_text("[203.0.113.7]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMineMineMineMineMineMineMineMineM\n"
                     + other)
    conn = _Conn()
    ctx.fleet._hosts["rp2"] = conn  # type: ignore[assignment]  # the command's open connection to it
    assert teardown.terminate(ctx, row, reason="gpuq down")[0] == "terminated"
    assert known.read_text() == other
    assert conn.closed and "rp2" not in ctx.fleet._hosts
