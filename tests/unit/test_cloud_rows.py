"""A rented machine's row from before its create call (docs/providers.md): it gets no work and no probe,
people see it as PROVISIONING, and the names gpuq gives instances say which ledger rented them."""

from __future__ import annotations

import time

import pytest

from orchestrator.api.renting import ledger_id
from orchestrator.context import Context
from orchestrator.core.errors import UsageError
from orchestrator.core.states import LeaseState
from orchestrator.fleet import registering
from orchestrator.ledger import HostRow
from orchestrator.providers.models import instance_name, ledger_of
from orchestrator.scheduling.estimates import epoch_rates
from orchestrator.scheduling.placements import PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.tick.capacity import capacities
from orchestrator.tick.loop import run_tick
from orchestrator.views import host_flags, host_state


def _provisioning(ctx: Context, name: str = "runpod-abc123-0") -> HostRow:
    return ctx.ledger.add_host(HostRow(
        name=name, kind="ssh", target="", root="", port=0, provider="runpod", instance_name="gpuq-0123abcd-abc123-0",
        gpu_type="NVIDIA RTX A6000", gpu_count=1, price_per_hour=0.79, lease_state="provisioning", created_at=0.0))


def test_a_provisioning_host_gets_no_work_and_no_probe(ctx: Context) -> None:
    _provisioning(ctx)
    slots = capacities(ctx.ledger, ctx.settings, ctx.ledger.hosts(), epoch_rates([]))
    assert [s.usable for s in slots] == [False]
    assert plan([PlanJob("j1", 1, 60.0)], slots).assignments == ()
    report = run_tick(ctx)  # an SSH probe of a row with no address would fail: none is made
    assert "runpod-abc123-0" not in report.probes


def test_registering_fills_only_a_provisioning_row(ctx: Context) -> None:
    _provisioning(ctx)
    ctx.ledger.lease_transition("runpod-abc123-0", LeaseState.RUNNING, "")
    with pytest.raises(UsageError, match="already registered"):  # refused before any connection is made
        registering.register(ctx.ledger, ctx.settings, "runpod-abc123-0", "root@203.0.113.9", rented={})


def test_people_see_provisioning_with_its_age(ctx: Context) -> None:
    row = _provisioning(ctx)
    flags = [text for text, _style in host_flags(row, now=row.created_at + 180)]
    assert "PROVISIONING for 3m (no instance id yet)" in flags and "runpod $0.79/h" in flags
    assert host_state(row, None)[0].startswith("provisioning")
    ctx.ledger.update_host(row.name, instance_id="pod123")
    shown = ctx.ledger.host(row.name)
    assert shown is not None
    assert "PROVISIONING for 3m (pod123)" in [t for t, _ in host_flags(shown, now=shown.created_at + 180)]
    ctx.ledger.lease_transition(row.name, LeaseState.RUNNING, "")
    running = ctx.ledger.host(row.name)
    assert running is not None and not any("PROVISIONING" in t for t, _ in host_flags(running, now=time.time()))


def test_instance_names_say_which_ledger_rented_them(ctx: Context) -> None:
    me = ledger_id(ctx.settings)
    assert ledger_id(ctx.settings) == me  # made once, then read
    name = instance_name(me, "abc123")
    assert ledger_of(name) == me and ledger_of(f"{name}-3") == me
    assert ledger_of("gpuq-abc123") == "" and ledger_of("gpuq-abc123-0") == ""  # an older gpuq's: ledger unknown
    for other in ("my-notebook", "gpuq-", "gpuq-ABC123", "gpuq-abc123-x", "xgpuq-0123abcd-abc123"):
        assert ledger_of(other) is None
    with pytest.raises(ValueError):
        instance_name("not-an-id", "abc123")


def test_forgetting_a_rented_host_that_may_still_bill_is_refused(ctx: Context) -> None:
    """`gpuq hosts rm` would drop the only record of a machine that bills: it points at `gpuq down`."""
    from orchestrator.api.hosts import hosts_rm

    _provisioning(ctx)
    ctx.ledger.lease_transition("runpod-abc123-0", LeaseState.RUNNING, "", instance_id="pod123")
    with pytest.raises(UsageError, match=r"may still bill: `gpuq down runpod-abc123-0`"):
        hosts_rm(ctx, "runpod-abc123-0")
    assert ctx.ledger.host("runpod-abc123-0") is not None
    ctx.ledger.lease_transition("runpod-abc123-0", LeaseState.TERMINATED, "")
    hosts_rm(ctx, "runpod-abc123-0")  # ended: its record may go
    assert ctx.ledger.host("runpod-abc123-0") is None
    _provisioning(ctx, "runpod-abc123-1")
    hosts_rm(ctx, "runpod-abc123-1", force=True)  # the user's call, said out loud
    assert ctx.ledger.host("runpod-abc123-1") is None
