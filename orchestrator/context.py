"""The context every verb and every stage of the tick runs in: settings, the ledger, and the command's hosts.

It lives below ``api/`` and ``tick/`` so that both reach it without importing each other."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.config import LOCAL_HOST, Settings, load_settings

if TYPE_CHECKING:  # the ledger's ORM and the hosts load when a context is opened, not with this module
    from orchestrator.fleet.registry import Fleet
    from orchestrator.hosts.base import Host
    from orchestrator.ledger import HostRow, Ledger
    from orchestrator.ledger.reader import LedgerReader
    from orchestrator.providers.base import Provider


@dataclass
class Context:
    settings: Settings
    ledger: Ledger
    fleet: Fleet
    providers: dict[str, Provider] = field(default_factory=dict)  # each provider's adapter, opened once

    def close(self) -> None:
        self.fleet.close()
        self.ledger.close()


@dataclass
class ReadContext:
    """What a read-only verb (``results``, ``report``, ``logs``, ``explain``) runs on when it reads the
    ledger alone: the settings and the read path without the ORM (``ledger/reader.py``, one read
    transaction).  No fleet: a verb that must talk to a host opens a ``Context`` instead."""

    settings: Settings
    ledger: LedgerReader

    def close(self) -> None:
        self.ledger.close()


def open_context(*, overrides: dict[str, Any] | None = None, project_dir: Path | None = None) -> Context:
    from orchestrator.fleet.registry import Fleet
    from orchestrator.ledger import Ledger

    settings = load_settings(overrides=overrides, project_dir=project_dir)
    ledger = Ledger(settings.ledger_path)
    return Context(settings, ledger, Fleet(settings, ledger))


# --- hosts ------------------------------------------------------------------------


def local_host(ctx: Context) -> Host:
    return ctx.fleet.local()


def host_for(ctx: Context, row: HostRow) -> Host:
    """The command's one Host object for ``row`` (its SSH connection is reused by every call)."""
    return ctx.fleet.host(row)


def verified_ids(ctx: Context) -> set[str]:
    return set(ctx.ledger.verified_job_ids())


def known_hosts(ctx: Context) -> set[str]:
    return {LOCAL_HOST} | {h.name for h in ctx.ledger.hosts()}


def payload_tasks() -> list[str]:
    from orchestrator.core.agent_modules import payload_dir  # pathspec and tarfile: not for `gpuq status`

    tasks_file = payload_dir() / "TASKS"
    if not tasks_file.is_file():
        return []
    lines = tasks_file.read_text(encoding="utf-8").splitlines()
    return [t.strip() for t in lines if t.strip() and not t.startswith("#")]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a command reads many rows: tens of thousands of ORM
    objects, all alive, would each trigger full collections that find nothing (a third of the time
    of a 10,000-job ``results``).  What cycles the read leaves are collected after it."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
