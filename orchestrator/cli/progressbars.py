"""rich progress bars on stderr for long transfers (orchestrator/transfer/progress.py), terminals only."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from orchestrator.transfer import progress as transfer_progress

_lock = threading.Lock()
_state: dict[str, object] = {"progress": None, "users": 0}


@contextlib.contextmanager
def _bar(what: str, total: int) -> Iterator[transfer_progress.Callback]:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with _lock:
        progress = _state["progress"]
        if progress is None:
            progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), console=Console(stderr=True), transient=True)
            progress.start()
            _state["progress"] = progress
        _state["users"] = int(str(_state["users"])) + 1
    assert isinstance(progress, Progress)
    task = progress.add_task(escape(what), total=total)
    try:
        yield lambda done: progress.update(task, completed=done)
    finally:
        progress.remove_task(task)
        with _lock:
            _state["users"] = int(str(_state["users"])) - 1
            if _state["users"] == 0:
                progress.stop()
                _state["progress"] = None


def install_if_terminal() -> None:
    """Show transfer bars when stderr is a terminal; otherwise (pipes, CI, --json scripts) nothing."""
    if sys.stderr.isatty():
        transfer_progress.install(_bar)
