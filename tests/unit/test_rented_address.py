"""A rented machine's SSH address is checked once, at registration, for every adapter (issue 43, item 5):
an IP address only (base.ssh_address), a host name only under a domain the adapter declares (vast.ai's
``.vast.ai`` proxy gateways).  The address reaches ``ssh`` as ``%h`` of the user's ssh config: with
``Host * / ProxyCommand ssh -W %h:%p bastion`` there, a crafted ``h:1 -oProxyCommand=touch${IFS}X x`` ran a
command on the controller.  Run against the loopback fake Lambda Cloud (its adapter passes ``ip`` on as the
API says it) on a real SQLite ledger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.context import Context
from orchestrator.providers import registry
from orchestrator.providers.models import ssh_address
from tests.support.fakecloud import FakeLambda
from tests.support.fakecloud.backend import AddressBackend
from tests.support.fakecloud.inprocess import lambda_context

KEY = "secret_address-test-key-0123456789"
CRAFTED = "h:1 -oProxyCommand=touch${IFS}X x"


class CraftedBackend(AddressBackend):
    """Machines whose API answer names ``address`` as their IP."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        _ip, port = super().provision(instance_id, gpu_count)
        return self.address, port


@pytest.mark.parametrize(("host", "port", "names", "expected"), [
    ("203.0.113.7", 22, (), ("203.0.113.7", 22)),
    ("2001:db8::0:1", 2222, (), ("2001:db8::1", 2222)),
    (CRAFTED, 22, (), None), ("-oProxyCommand=x", 22, (), None), ("evil.example", 22, (), None),
    ("203.0.113.7", 0, (), None), ("203.0.113.7", 70000, (), None), ("", 22, (), None), (None, 22, (), None),
    ("ssh5.vast.ai", 10022, (".vast.ai",), ("ssh5.vast.ai", 10022)),
    ("ssh5.vast.ai.evil.example", 22, (".vast.ai",), None), ("-o.vast.ai", 22, (".vast.ai",), None),
    ("a b.vast.ai", 22, (".vast.ai",), None),
])
def test_ssh_address(host: str | None, port: int, names: tuple[str, ...], expected: tuple[str, int] | None) -> None:
    assert ssh_address(host, port, names) == expected


def test_only_vastai_declares_host_names_for_its_gateways() -> None:
    assert {name: registry.ssh_names(name) for name in registry.builtin_names()} == {
        "runpod": (), "lambda": (), "vastai": (".vast.ai",)}


@pytest.fixture
def ctx(gpuq_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, FakeLambda]]:
    """The user's ssh config sends every host through a bastion (``%h`` is the address the API gave)."""
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "config").write_text("Host *\n  ProxyCommand ssh -W %h:%p bastion.invalid\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    crafted = CRAFTED.replace("X", str(tmp_path / "PWNED"))
    with lambda_context(monkeypatch, KEY, CraftedBackend(crafted)) as opened:
        yield opened


def test_a_machine_ready_at_a_crafted_address_is_never_registered_and_is_ended(
        ctx: tuple[Context, FakeLambda], tmp_path: Path) -> None:
    context, fake = ctx
    private = tmp_path / "id_test"
    private.write_text("not used: gpuq never connects\n")
    (tmp_path / "id_test.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAddressTestKeyOnly000000 t\n")
    itype = next(t for t in fake.types.values() if t.regions)
    result = api.up(context, provider="lambda", gpu_type=itype.name, key=str(private))
    assert result.hosts == [] and len(result.unusable) == 1, result.problems()
    assert "not an IP address" in result.problems()[0]
    assert all("ProxyCommand" not in row.target for row in context.ledger.hosts())
    assert not (tmp_path / "PWNED").exists(), "the address never reached ssh"
    assert all(i.status == "terminated" for i in fake.instances.values()), "the machine gpuq will not use is ended"
