"""The providers gpuq rents from, one :class:`Entry` each (docs/providers.md, "Adding a provider").

Every list of providers derives from here: ``gpuq up --provider``'s choices, the provider values the
``--json`` documents accept, the credential variables a run never forwards (runconfig.py), the accounts
``gpuq down --orphans`` scans, and the adapter the tick opens for a rented host's row (tick/leases.py).
A provider is one adapter module (an :class:`~orchestrator.providers.http_adapter.HttpProvider` subclass
declaring its capabilities), one entry in :data:`BUILTIN`, a profile in ``profiles/<name>.toml`` and a fake
in ``tests/support/fakecloud/``.

Entries outside gpuq: ``GPUQ_PROVIDER_PLUGINS=package.module[,...]`` names modules whose ``PROVIDER``
attribute is an :class:`Entry` (its ``profile`` the path of its default profile file); they are added
the first time the registry is read in a process.  The variable is read from the environment only
(a project's gpuq.toml cannot set it): it imports code.  The tests' toy provider comes in this way.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.config import add_profile
from orchestrator.core.errors import ConfigError, UsageError
from orchestrator.providers.base import Capabilities, Provider
from orchestrator.providers.credentials import LAMBDA, RUNPOD, VASTAI, ProviderSpec

PLUGINS_VAR = "GPUQ_PROVIDER_PLUGINS"


@dataclass(frozen=True)
class Entry:
    """One provider: its name (``--provider``, the ledger's ``provider`` column, the keys-file table),
    where its adapter class is (``"module:Class"``, imported only when used), its credentials and URLs,
    and, for one from outside gpuq, its default profile file."""

    name: str
    adapter: str
    spec: ProviderSpec
    profile: Path | None = None

    def adapter_class(self) -> Any:
        module, _, attr = self.adapter.partition(":")
        return getattr(importlib.import_module(module), attr)

    def capabilities(self) -> Capabilities:
        """What the adapter class declares (``capabilities``; an adapter without that attribute: its
        ``supports_spot`` / ``supports_stop``)."""
        cls = self.adapter_class()
        declared = getattr(cls, "capabilities", None)
        if isinstance(declared, Capabilities):
            return declared
        return Capabilities(spot=bool(getattr(cls, "supports_spot", False)),
                            stop=bool(getattr(cls, "supports_stop", False)))


BUILTIN: tuple[Entry, ...] = (
    Entry("runpod", "orchestrator.providers.runpod:RunPodProvider", RUNPOD),
    Entry("lambda", "orchestrator.providers.lambda_cloud:LambdaProvider", LAMBDA),
    Entry("vastai", "orchestrator.providers.vastai:VastAIProvider", VASTAI),
)

_added: dict[str, Entry] = {}
_plugins_read: set[str] = set()


def register(entry: Entry) -> None:
    """Add a provider from outside gpuq (a plugin module's ``PROVIDER``, or a test).  Its name must be new."""
    if entry.name != entry.spec.name:
        raise ConfigError(f"provider {entry.name!r}: its credentials are named {entry.spec.name!r}")
    if any(e.name == entry.name for e in BUILTIN) or _added.get(entry.name, entry) != entry:
        raise ConfigError(f"a provider named {entry.name!r} is already registered")
    if entry.profile is not None:
        add_profile(entry.profile)
    _added[entry.name] = entry


def unregister(name: str) -> None:
    """Remove a provider added by :func:`register` (tests)."""
    _added.pop(name, None)


def _read_plugins(env: Mapping[str, str]) -> None:
    for module in (m.strip() for m in env.get(PLUGINS_VAR, "").split(",")):
        if not module or module in _plugins_read:
            continue
        _plugins_read.add(module)
        try:
            entry = getattr(importlib.import_module(module), "PROVIDER", None)
        except ImportError as exc:
            raise ConfigError(f"{PLUGINS_VAR}: cannot import {module}: {exc}") from exc
        if not isinstance(entry, Entry):
            raise ConfigError(f"{PLUGINS_VAR}: {module} has no PROVIDER entry (orchestrator.providers.registry.Entry)")
        if _added.get(entry.name) != entry:
            register(entry)


def entries(env: Mapping[str, str] | None = None) -> tuple[Entry, ...]:
    """Every provider: gpuq's own, then those added (plugins, tests)."""
    _read_plugins(os.environ if env is None else env)
    return BUILTIN + tuple(_added.values())


def names() -> tuple[str, ...]:
    return tuple(e.name for e in entries())


def builtin_names() -> tuple[str, ...]:
    """gpuq's own providers (what the committed JSON schemas list)."""
    return tuple(e.name for e in BUILTIN)


def entry(name: str) -> Entry:
    for found in entries():
        if found.name == name:
            return found
    raise UsageError(f"unknown provider {name!r} (known: {', '.join(names())})")


def specs() -> tuple[ProviderSpec, ...]:
    """The credentials table: every provider's key variables, URLs and keys-file section."""
    return tuple(e.spec for e in entries())


def stop_bills_storage(name: str) -> bool:
    """Whether a stopped or preempted machine of provider ``name`` still bills its disk (its adapter's
    ``Capabilities.stop_bills_storage``: RunPod's and vast.ai's do); False for a provider gpuq does not know."""
    try:
        return entry(name).capabilities().stop_bills_storage
    except (UsageError, ConfigError, ImportError):
        return False


def ssh_names(name: str) -> tuple[str, ...]:
    """The DNS domains whose host names provider ``name`` may hand out as SSH endpoints (its adapter's
    ``ssh_names``: vast.ai's proxy gateways); none for any other, whose endpoints must be IP addresses."""
    try:
        cls = entry(name).adapter_class()
    except (UsageError, ConfigError, ImportError):
        return ()
    names = getattr(cls, "ssh_names", ())
    return tuple(n for n in names if isinstance(n, str) and n.startswith(".")) if isinstance(names, tuple) else ()


def open_adapter(name: str, env: Mapping[str, str] | None = None, *,
                 quick: tuple[float, float] | None = None) -> Provider:
    """The adapter for ``name``, its key and URL(s) from ``env`` or the keys file.  ``quick``:
    ``(poll_s, ready_timeout_s)`` of the ``provider_poll_s`` setting (the adapter's ``quick_options``)."""
    cls = entry(name).adapter_class()
    options: dict[str, Any] = {}
    if quick is not None and hasattr(cls, "quick_options"):
        options = cls.quick_options(*quick)
    adapter: Provider = cls.from_env(os.environ if env is None else env, **options)
    return adapter
