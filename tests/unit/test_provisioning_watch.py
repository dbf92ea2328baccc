"""The tick's watch over rows stuck ``provisioning`` (tick/provisioning.py), on a real ledger against the in-process
fake Lambda: a ``gpuq up`` killed during its readiness wait, a create whose answer never came, a create that made
nothing; what gpuq cannot end is escalated once, webhook included; `gpuq down --orphans` lists such rows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import api
from orchestrator.context import Context
from orchestrator.core.states import LeaseState
from orchestrator.ledger import HostRow
from orchestrator.providers.models import ProvisionRequest
from orchestrator.tick import provisioning
from orchestrator.tick.findings import TickReport
from orchestrator.tick.leases import provider_for
from tests.support.fakecloud import FakeLambda
from tests.support.fakecloud.backend import AddressBackend
from tests.support.fakecloud.inprocess import lambda_context

KEY = "secret_provisioning-watch-key-0123456789"
PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIProvisioningWatchTestKey00000 t"
NAME = "gpuq-0badc0de-abc123"


@pytest.fixture
def cloud(gpuq_home: Path, hook: list[dict[str, Any]],
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, FakeLambda]]:
    with lambda_context(monkeypatch, KEY, AddressBackend()) as opened:
        yield opened


def _itype(fake: FakeLambda) -> str:
    return next(t.name for t in fake.types.values() if t.regions)


def _row(ctx: Context, instance_id: str = "") -> HostRow:
    """The row a killed `gpuq up` leaves: provisioning, no address, its instance id if the create answered."""
    return ctx.ledger.add_host(HostRow(
        name="lam-abc123-0", kind="ssh", target="", root="", port=0, provider="lambda", instance_name=NAME,
        instance_id=instance_id, lease_state=LeaseState.PROVISIONING.value, lease_reason="created; not ready yet",
        lease_changed_at=time.time(), gpu_count=1))


def _create(ctx: Context, fake: FakeLambda) -> str:
    (made,) = provider_for(ctx, "lambda").provision(ProvisionRequest(name=NAME, gpu_type=_itype(fake),
                                                                     ssh_public_key=PUBLIC))
    return made.id


def _past(ctx: Context) -> float:
    """A "now" just past the readiness window of the row."""
    row = ctx.ledger.host("lam-abc123-0")
    assert row is not None
    return row.lease_changed_at + provisioning.window_s(ctx.settings) + 1


def test_a_machine_left_provisioning_by_a_killed_up_is_ended_past_the_window(
        cloud: tuple[Context, FakeLambda], hook: list[dict[str, Any]]) -> None:
    ctx, fake = cloud
    inst = _create(ctx, fake)
    row = _row(ctx, inst)
    report = TickReport()
    provisioning.watch_provisioning(ctx, report, now=row.lease_changed_at + provisioning.window_s(ctx.settings) - 1)
    assert fake.instances[inst].status != "terminated" and report.actions == [], "inside the window: up's own"
    provisioning.watch_provisioning(ctx, report, now=_past(ctx))
    assert fake.instances[inst].status == "terminated"
    after = ctx.ledger.host(row.name)
    assert after is not None and after.lease is LeaseState.TERMINATED
    assert report.actions == [f"{row.name}: lambda {inst} was still provisioning past the readiness window, never "
                              "registered: terminated (gone)"]
    assert hook == [], "ended: nothing to alert on"


def test_a_row_without_an_id_is_looked_up_by_its_name_and_ended(cloud: tuple[Context, FakeLambda]) -> None:
    ctx, fake = cloud
    inst = _create(ctx, fake)
    row = _row(ctx)
    provisioning.watch_provisioning(ctx, TickReport(), now=_past(ctx))
    after = ctx.ledger.host(row.name)
    assert after is not None and after.instance_id == inst and after.lease is LeaseState.TERMINATED
    assert fake.instances[inst].status == "terminated"


def test_a_row_whose_machine_was_never_made_goes(cloud: tuple[Context, FakeLambda]) -> None:
    ctx, fake = cloud
    row = _row(ctx)
    report = TickReport()
    provisioning.watch_provisioning(ctx, report, now=_past(ctx))
    assert ctx.ledger.host(row.name) is None and fake.instances == {}
    assert report.actions == [f"{row.name}: not created: no lambda instance is named {NAME} past the readiness "
                              "window; its row is removed"]


def test_what_gpuq_cannot_end_is_escalated_once_and_kept(cloud: tuple[Context, FakeLambda],
                                                          hook: list[dict[str, Any]]) -> None:
    ctx, fake = cloud
    inst = _create(ctx, fake)
    row = _row(ctx, inst)
    fake.set_api_key("another-key-altogether-0123456789")
    for _ in range(2):
        report = TickReport()
        provisioning.watch_provisioning(ctx, report, now=_past(ctx))
        assert report.teardown_pending == [row.name]
    assert fake.instances[inst].status != "terminated"
    after = ctx.ledger.host(row.name)
    assert after is not None and after.lease is LeaseState.PROVISIONING
    escalations = [e for e in ctx.ledger.events(row.name, exact=True) if e.rule == provisioning.RULE_STUCK]
    assert [e.severity for e in escalations] == ["escalate"]
    assert [(h["event"], h["rule"], h["host"]) for h in hook] == [("escalation", provisioning.RULE_STUCK, row.name)]
    assert f"`gpuq down {row.name}` ends it" in hook[0]["action"]


def test_down_orphans_lists_rows_stuck_provisioning(cloud: tuple[Context, FakeLambda],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, fake = cloud
    inst = _create(ctx, fake)
    row = _row(ctx, inst)
    assert api.find_orphans(ctx).stuck == []
    monkeypatch.setattr(time, "time", lambda: _past(ctx))
    scan = api.find_orphans(ctx)
    assert [r.name for r in scan.stuck] == [row.name] and scan.orphans == [], "held by a live row: not an orphan"
    monkeypatch.undo()
    assert api.end_stuck(ctx, scan.stuck[0]).endswith("terminated (gone)")
    assert fake.instances[inst].status == "terminated"
