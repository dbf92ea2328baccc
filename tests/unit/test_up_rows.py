"""`gpuq up` in process against the loopback fake Lambda Cloud: the rows written before each create call,
what each create's answer writes, and what becomes of every machine gpuq will not use (docs/providers.md).
Every machine here is ready at an address that is not an IP address, so it is refused at registration
(api/renting.checked_endpoint) before any SSH: the paths that end, forget or hold a machine run in a second,
without a host behind them.  The happy path (audit, register, preflight) is tests/integration/test_cloud*.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.rented import UpInterrupted
from orchestrator.api.renting import key_pair, ledger_id
from orchestrator.context import Context
from orchestrator.core.errors import ConfigError, NoCapacity, UsageError
from orchestrator.core.states import LeaseState
from orchestrator.providers.models import instance_name
from tests.support.fakecloud import FakeLambda
from tests.support.fakecloud.backend import AddressBackend
from tests.support.fakecloud.inprocess import lambda_context

KEY = "secret_up-rows-test-key-0123456789"


class NamedBackend(AddressBackend):
    """Machines whose API answer names a host name, not an IP: refused before any SSH."""

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        _ip, port = super().provision(instance_id, gpu_count)
        return "machine.example", port


@pytest.fixture
def cloud(gpuq_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, FakeLambda]]:
    with lambda_context(monkeypatch, KEY, NamedBackend()) as opened:
        yield opened


@pytest.fixture
def key(tmp_path: Path) -> str:
    private = tmp_path / "id_up"
    private.write_text("not used: gpuq never connects\n")
    (tmp_path / "id_up.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUpRowsTestKeyOnly0000000 t\n")
    return str(private)


def _itype(fake: FakeLambda) -> str:
    return next(t.name for t in fake.types.values() if t.regions)


def test_each_machine_is_recorded_created_and_ended_under_its_own_row(
        cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    said: list[str] = []
    gpu_type = _itype(fake)
    result = api.up(context, provider="lambda", gpu_type=gpu_type, count=2, key=key, prefix="lam", say=said.append,
                    down_when_done=False)
    lease = result.lease
    hosts = [f"lam-{lease}-0", f"lam-{lease}-1"]
    assert (result.provider, result.wanted, len(lease)) == ("lambda", 2, 6)
    assert [u.host for u in result.unusable] == hosts and all(u.ended for u in result.unusable)
    assert result.hosts == [] and result.not_created == [] and result.unknown == {} and not result.ok
    base = instance_name(ledger_id(context.settings), lease)
    assert all(i.status == "terminated" for i in fake.instances.values())  # (gone ones drop out of the list)
    ids = [u.instance_id for u in result.unusable]
    assert len(set(ids)) == 2 and all(ids)
    for index, host in enumerate(hosts):
        row = context.ledger.host(host)
        assert row is not None
        inst_id = ids[index]
        assert row.instance_id == inst_id
        assert (row.provider, row.instance_name, row.gpu_type, row.gpu_count, row.spot) == (
            "lambda", f"{base}-{index}", gpu_type, 1, False)
        assert row.lease_state == LeaseState.TERMINATED.value and row.down_when_done is False
        assert row.price_per_hour is not None and row.price_per_hour > 0, "the price the ready answer named"
        assert row.target == "" and row.port == 0 and row.key_path == key
        events = [e.message for e in context.ledger.events(host, exact=True)]
        assert f"renting lambda {base}-{index} (1x {gpu_type})" in events
        assert f"lambda {inst_id} created as {base}-{index}" in events
        assert any(m.startswith(f"lambda {inst_id} not usable (") and m.endswith("terminated by gpuq (gone)")
                   for m in events), events
        assert f"{host}: lambda {inst_id} created; waiting until it is ready" in said
    assert "not an IP address" in result.problems()[0] and "gpuq terminated it" in result.problems()[0]


def test_down_when_done_defaults_to_the_auto_down_setting(cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    result = api.up(context, provider="lambda", gpu_type=_itype(fake), key=key)
    assert [u.host for u in result.unusable] == [f"lambda-{result.lease}-0"], "the prefix is the provider's first six"
    row = context.ledger.host(result.unusable[0].host)
    assert row is not None and row.down_when_done is context.settings.auto_down
    assert [i.name for i in fake.instances.values()] == [instance_name(ledger_id(context.settings), result.lease)]


def test_no_capacity_creates_nothing_and_leaves_no_row(cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    fake.no_capacity(5)
    with pytest.raises(NoCapacity):
        api.up(context, provider="lambda", gpu_type=_itype(fake), count=2, key=key, prefix="cap")
    assert context.ledger.hosts() == [] and fake.instances == {}


def test_a_create_that_errs_after_making_the_machine_is_found_by_its_name_and_ended(
        cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    fake.fail_after_create(1, status=500)
    result = api.up(context, provider="lambda", gpu_type=_itype(fake), key=key, prefix="err")
    (inst,) = fake.instances.values()
    assert [(u.host, u.instance_id, u.ended) for u in result.unusable] == [(f"err-{result.lease}-0", inst.id, True)]
    assert result.not_created == [] and inst.status == "terminated"
    row = context.ledger.host(f"err-{result.lease}-0")
    assert row is not None and row.instance_id == inst.id and row.lease_state == LeaseState.TERMINATED.value


def test_a_machine_gpuq_cannot_end_stays_recorded_and_held(cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud

    def lock_out(line: str) -> None:
        if "created" in line:  # the account's key stops working: neither the wait nor the terminate gets through
            fake.set_api_key("another-key-altogether-0123456789")

    result = api.up(context, provider="lambda", gpu_type=_itype(fake), key=key, prefix="held", say=lock_out)
    host = f"held-{result.lease}-0"
    (inst,) = fake.instances.values()
    (unusable,) = result.unusable
    assert (unusable.host, unusable.instance_id, unusable.ended) == (host, inst.id, False) and unusable.end_error
    assert inst.status != "terminated"
    row = context.ledger.host(host)
    assert row is not None and row.lease_state == LeaseState.PROVISIONING.value, "no address: never probed"
    assert row.hold == "unusable" and f"`gpuq down {host}` ends it" in row.lease_reason
    assert "terminating it failed" in row.lease_reason
    assert any("terminate failed:" in e.message for e in context.ledger.events(host, exact=True))
    assert "it may still bill" in result.problems()[0]


def test_an_interrupted_up_ends_what_it_created(cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    said: list[str] = []

    def interrupt(line: str) -> None:
        said.append(line)
        if line.endswith("waiting until it is ready"):
            raise KeyboardInterrupt

    with pytest.raises(UpInterrupted) as caught:
        api.up(context, provider="lambda", gpu_type=_itype(fake), key=key, prefix="int", say=interrupt)
    result = caught.value.result
    (inst,) = fake.instances.values()
    assert [(u.host, u.instance_id, u.ended) for u in result.unusable] == [(f"int-{result.lease}-0", inst.id, True)]
    assert "not registered when `gpuq up` was interrupted" in result.unusable[0].why
    assert inst.status == "terminated"
    assert any(line.startswith("gpuq: interrupted: ending the machines") for line in said)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"count": 0}, "--count and --gpus must be at least 1"),
    ({"gpus": 0}, "--count and --gpus must be at least 1"),
    ({"bid": 0.5}, "--bid is a spot bid: add --spot"),
    ({"spot": True}, "rents no spot machines"),
])
def test_up_refuses_before_writing_anything(cloud: tuple[Context, FakeLambda], key: str, kwargs: dict[str, object],
                                            words: str) -> None:
    context, fake = cloud
    with pytest.raises(UsageError, match=words):
        api.up(context, provider="lambda", gpu_type=_itype(fake), key=key, **kwargs)  # type: ignore[arg-type]
    assert context.ledger.hosts() == [] and fake.instances == {}


def test_spot_refusal_names_the_providers_that_rent_spot(cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    with pytest.raises(UsageError) as caught:
        api.up(context, provider="lambda", gpu_type=_itype(fake), key=key, spot=True)
    assert str(caught.value) == ("Lambda Cloud rents no spot machines: gpuq's spot market is vast.ai (--provider "
                                 "vastai --spot); or rent on demand without --spot")


def test_a_missing_key_pair_is_refused_naming_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               ctx: Context) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    with pytest.raises(UsageError, match=r"no SSH key pair found \(.*id_ed25519, .*id_rsa with a \.pub"):
        key_pair(ctx.settings, "")
    private = tmp_path / "only_private"
    private.write_text("x\n")
    with pytest.raises(UsageError, match=r"only_private with a \.pub"):
        key_pair(ctx.settings, str(private))
    (tmp_path / "only_private.pub").write_text("ssh-ed25519 AAAA t\n\n")
    assert key_pair(ctx.settings, str(private)) == (str(private), "ssh-ed25519 AAAA t")


def test_the_ledger_id_is_made_once_and_a_damaged_one_is_refused(ctx: Context) -> None:
    path = ctx.settings.home / "ledger-id"
    assert not path.exists()
    first = ledger_id(ctx.settings)
    assert len(first) == 8 and int(first, 16) >= 0 and path.read_text() == first + "\n"
    assert ledger_id(ctx.settings) == first
    assert [p.name for p in ctx.settings.home.iterdir() if p.name.startswith(".ledger-id")] == []
    path.write_text("not-hex!\n")
    with pytest.raises(ConfigError, match="not a ledger id"):
        ledger_id(ctx.settings)


def test_an_interrupt_between_creates_says_which_may_bill_and_forgets_those_never_asked_for(
        cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud

    def interrupt(line: str) -> None:
        if line.endswith("waiting until it is ready"):  # the first create answered; the second is next
            raise KeyboardInterrupt

    with pytest.raises(UpInterrupted) as caught:
        api.up(context, provider="lambda", gpu_type=_itype(fake), count=3, key=key, prefix="mid", say=interrupt)
    result = caught.value.result
    first, second, third = (f"mid-{result.lease}-{i}" for i in range(3))
    assert all(i.status == "terminated" for i in fake.instances.values())
    assert [(u.host, u.ended) for u in result.unusable] == [(first, True)] and result.unusable[0].instance_id
    assert list(result.unknown) == [second]
    assert result.unknown[second] == ("`gpuq up` was interrupted during its create call, and no instance has its "
                                      f"name yet; `gpuq down {second}` checks by its name and ends it")
    row = context.ledger.host(second)
    assert row is not None and row.lease_state == LeaseState.PROVISIONING.value
    assert row.lease_reason == result.unknown[second]
    assert result.not_created == [third] and context.ledger.host(third) is None


def test_an_ambiguous_create_is_looked_up_by_its_name_until_the_listing_shows_it(
        cloud: tuple[Context, FakeLambda], key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    context, fake = cloud
    monkeypatch.setattr(context, "settings", context.settings.model_copy(update={"create_lookup_s": 30.0}))
    fake.fail_after_create(1, status=500, listing_lag_s=0.5)
    result = api.up(context, provider="lambda", gpu_type=_itype(fake), count=2, key=key, prefix="lag")
    first = next(i for i in fake.instances.values() if i.name == instance_name(ledger_id(context.settings),
                                                                                 result.lease) + "-0")
    assert len(fake.instances) == 1, "no second machine for the first, and none for the second after the error"
    assert [(u.host, u.instance_id, u.ended) for u in result.unusable] == [(f"lag-{result.lease}-0", first.id, True)]
    assert result.not_created == [f"lag-{result.lease}-1"] and result.unknown == {}
    row = context.ledger.host(f"lag-{result.lease}-0")
    assert row is not None and row.instance_id == first.id and row.lease_state == LeaseState.TERMINATED.value


def test_an_ambiguous_create_not_seen_in_time_keeps_its_row_as_unknown(
        cloud: tuple[Context, FakeLambda], key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    context, fake = cloud
    monkeypatch.setattr(context, "settings", context.settings.model_copy(update={"create_lookup_s": 0.0}))
    fake.fail_after_create(1, status=500, listing_lag_s=3600.0)
    result = api.up(context, provider="lambda", gpu_type=_itype(fake), key=key, prefix="unk")
    host = f"unk-{result.lease}-0"
    assert len(fake.instances) == 1, "the create was never repeated"
    assert result.not_created == [] and list(result.unknown) == [host] and not result.ok
    row = context.ledger.host(host)
    assert row is not None, "never 'not created' while the machine may bill"
    assert row.lease_state == LeaseState.PROVISIONING.value and row.instance_id == ""
    assert "may still be made" in row.lease_reason


def test_a_machine_priced_above_the_cap_once_created_is_ended_before_use(
        cloud: tuple[Context, FakeLambda], key: str) -> None:
    context, fake = cloud
    itype = fake.types[_itype(fake)]
    cap = itype.price_cents / 100

    def dearer(line: str) -> None:
        if "created" in line:  # the machine the provider made costs more than the offer it was rented from
            itype.price_cents += 137

    result = api.up(context, provider="lambda", gpu_type=itype.name, key=key, prefix="cap", say=dearer, max_price=cap)
    (inst,) = fake.instances.values()
    (unusable,) = result.unusable
    assert (unusable.host, unusable.instance_id, unusable.ended) == (f"cap-{result.lease}-0", inst.id, True)
    assert inst.status == "terminated" and result.hosts == []
    dear = f"${(itype.price_cents) / 100:.2f}/h"
    assert f"priced {dear} once created, above --max-price ${cap:.2f}/h" in result.problems()[0]
    row = context.ledger.host(unusable.host)
    assert row is not None and row.lease_state == LeaseState.TERMINATED.value
    assert row.price_per_hour == pytest.approx(itype.price_cents / 100), "what it billed at, recorded"
