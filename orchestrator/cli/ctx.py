"""What every ``gpuq`` command shares: opening its ``Context`` (``open_ctx``) and printing text
that may quote a host (``echo``), warnings (``warn``: stderr, always)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from orchestrator.context import Context, ReadContext
    from orchestrator.ledger.reader import LedgerReader

T = TypeVar("T")


def open_ctx(project_dir: Path | None = None) -> Context:
    """The context of the project at ``project_dir`` (default: the working directory's)."""
    from orchestrator.context import open_context
    from orchestrator.providers import registry

    registry.entries()  # providers from GPUQ_PROVIDER_PLUGINS, and their profiles, before any host is read
    try:
        return open_context(project_dir=project_dir)
    finally:
        gc.enable()  # off while the heavy modules load (main()); a long command needs it back


def open_reader() -> LedgerReader | None:
    """The ledger's read path without the ORM (``ledger/reader.py``), for a command that reads the ledger
    alone (``gpuq status --no-probe``); None when that command must open its ``Context`` instead: no ledger
    yet or one at another schema version (the ``Ledger`` creates or migrates it), or rented hosts (their
    idle times are the billing stage's, and a provider plugin's hosts need the registry)."""
    from orchestrator.core.config import load_settings
    from orchestrator.ledger.reader import LedgerReader, ReaderUnavailable

    try:
        reader = LedgerReader(load_settings().ledger_path)
    except ReaderUnavailable:
        return None
    try:
        rented = any(row.provider for row in reader.hosts())
    except BaseException:
        reader.close()
        raise
    if rented:
        reader.close()
        return None
    return reader


def read_through(verb: Callable[[Context | ReadContext], T]) -> T:
    """``verb`` on the read path without the ORM (a ``ReadContext``: ``gpuq results``, ``report``), else on
    the command's ``Context``: where ``open_reader`` gives none, or the verb found finished jobs whose
    metrics must be collected from their hosts first (``resultrows.HostsNeeded``: said on stderr, and only
    those jobs are asked for)."""
    from orchestrator.api.resultrows import HostsNeeded
    from orchestrator.context import ReadContext
    from orchestrator.core.config import load_settings

    reader = open_reader()
    if reader is not None:
        gc.enable()  # off while the modules load (main()); the verb pauses it while it reads
        try:
            return verb(ReadContext(load_settings(), reader))
        except HostsNeeded as needed:
            echo(f"gpuq: {needed.note()}", err=True)  # stderr: --csv and --json keep stdout for the answer
        finally:
            reader.close()
    return verb(open_ctx())


def warn(text: str) -> None:
    """The one way a command warns: ``warning: TEXT`` on stderr, printable (it may quote a host), so
    ``gpuq submit --dry-run > plan.txt`` and ``--json`` keep stdout for the answer alone."""
    echo(f"warning: {text}", err=True)


def echo(text: str, *, err: bool = False) -> None:
    """``click.echo`` for text that may quote a host: each line printable (views/text.py), so no
    terminal control sequence a host wrote reaches the terminal."""
    import click

    from orchestrator.views.text import printable

    click.echo("\n".join(printable(line) for line in text.split("\n")), err=err)
