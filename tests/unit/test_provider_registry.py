"""The provider registry (orchestrator/providers/registry.py): every list of providers derives from it, and a
provider from outside gpuq (the tests' toy provider, tests/support/toycloud.py) joins each of them by being
named in GPUQ_PROVIDER_PLUGINS, with nothing in orchestrator/ naming it.  `gpuq up` / `down` with it on real
SSH hosts: tests/integration/test_provider_plugin.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from orchestrator.core.config import load_profile
from orchestrator.core.errors import ConfigError, ProviderAuthError, UsageError
from orchestrator.providers import registry
from orchestrator.providers.base import Capabilities, Provider
from orchestrator.providers.credentials import load_key
from orchestrator.providers.http_adapter import HttpProvider
from orchestrator.queue.runconfig import never_forwarded
from tests.conftest import run_gpuq

PLUGIN = "tests.support.toycloud"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(registry.PLUGINS_VAR, PLUGIN)
    try:
        yield
    finally:
        registry.unregister("toy")
        registry._plugins_read.discard(PLUGIN)


def test_every_builtin_entry_names_an_adapter_that_declares_what_it_can_do() -> None:
    for entry in registry.BUILTIN:
        cls = entry.adapter_class()
        assert cls.name == entry.name == entry.spec.name and cls.spec is entry.spec
        assert issubclass(cls, HttpProvider) and isinstance(cls.capabilities, Capabilities)
        assert (cls.supports_spot, cls.supports_stop) == (cls.capabilities.spot, cls.capabilities.stop)
        assert load_profile(entry.name).provider == entry.name  # profiles/<name>.toml
    # RunPod v2: no spot, no bid; an EXITED pod bills its disks
    assert registry.entry("runpod").capabilities().words() == ["stop", "regions", "offers", "stop bills storage"]
    assert registry.entry("vastai").capabilities().words() == ["spot", "stop", "rebid", "regions", "offers",
                                                               "market search", "stop bills storage"]
    assert registry.entry("lambda").capabilities().words() == ["regions", "offers"]


def test_an_unknown_provider_names_the_known_ones() -> None:
    with pytest.raises(UsageError, match="unknown provider 'nope' \\(known: runpod, lambda"):
        registry.entry("nope")


def test_a_plugin_provider_joins_every_list(toy: None, tmp_path: Path) -> None:
    assert "toy" not in registry.builtin_names()
    assert registry.names()[-1] == "toy"
    assert registry.entry("toy").capabilities() == Capabilities(offers=True)
    assert not registry.stop_bills_storage("toy") and not registry.stop_bills_storage("nope")
    assert load_profile("toy").provider == "toy"  # its profile came with its entry
    # the credentials table: runs never forward its key or URL variables; a missing key names its variable
    assert "Toy Cloud API credential" in never_forwarded("TOY_API_KEY")
    assert never_forwarded("GPUQ_TOY_URL")
    with pytest.raises(ProviderAuthError, match="TOY_API_KEY"):
        load_key(registry.entry("toy").spec, {"GPUQ_HOME": str(tmp_path)})
    adapter = registry.open_adapter("toy", {"TOY_API_KEY": "k", "GPUQ_TOY_URL": "http://127.0.0.1:9/toy"},
                                    quick=(0.5, 30.0))
    assert isinstance(adapter, Provider) and adapter.ready_policy.first_s == 0.5  # type: ignore[attr-defined]
    adapter.close()


def test_the_json_documents_accept_registry_providers_and_no_others(toy: None) -> None:
    from orchestrator.cli import documents

    schema = documents.HostStatus.model_json_schema()["properties"]["provider"]
    assert schema["enum"] == ["", *registry.builtin_names()]  # the committed schemas list gpuq's own
    field = TypeAdapter(documents.ProviderName)
    for name in ("", "runpod", "lambda", "toy"):  # a host rented from a plugin provider is a valid document
        assert field.validate_python(name) == name
    with pytest.raises(ValidationError, match="not a provider gpuq knows"):
        field.validate_python("nope")


def test_a_second_provider_of_the_same_name_is_refused() -> None:
    runpod = registry.entry("runpod")
    with pytest.raises(ConfigError, match="already registered"):
        registry.register(registry.Entry("runpod", runpod.adapter, runpod.spec))


def test_the_cli_offers_a_plugin_provider_as_a_choice() -> None:
    shown = run_gpuq("up", "--provider", "toy", "--gpu", "toy-1", "--help", env={registry.PLUGINS_VAR: PLUGIN})
    assert shown.returncode == 0, shown.stderr
    plain = run_gpuq("up", "--provider", "toy", "--gpu", "toy-1", env={registry.PLUGINS_VAR: ""})
    assert plain.returncode == 2 and "'toy' is not one of 'runpod', 'lambda'" in plain.stderr, plain.stderr
    broken = run_gpuq("hosts", "list", env={registry.PLUGINS_VAR: "tests.support.no_such_plugin"})
    assert broken.returncode != 0 and "GPUQ_PROVIDER_PLUGINS: cannot import" in broken.stderr, broken.stderr


def test_every_builtin_provider_has_a_fake_and_runs_the_contract() -> None:
    """A provider is an adapter, an entry, a profile and a fake; the contract class covers each adapter."""
    import importlib
    import pkgutil

    import tests.support.fakecloud as fakecloud
    from tests.support.fakecloud.server import FakeCloud
    from tests.unit import test_providers_contract as contract

    fakes = set()
    for info in pkgutil.iter_modules(fakecloud.__path__):
        module = importlib.import_module(f"{fakecloud.__name__}.{info.name}")
        fakes |= {v.provider for v in vars(module).values()
                  if isinstance(v, type) and issubclass(v, FakeCloud) and v is not FakeCloud}
    assert set(registry.builtin_names()) <= fakes
    covered = set(contract.contract_classes())
    assert set(registry.builtin_names()) <= covered, covered
