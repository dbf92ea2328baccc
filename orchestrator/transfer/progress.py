"""Progress of long transfers (bundle pushes, checkpoint shipping, pulls) for whoever shows it.

The code that moves bytes asks :func:`track` for a callback; by default it is a no-op, so library use,
tests and non-terminal runs print nothing.  The CLI installs a reporter (``cli/progressbars.py``: rich
progress bars on stderr, only when stderr is a terminal).  Threads may track transfers at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Callback = Callable[[int], None]  # bytes done so far
Reporter = Callable[[str, int], contextlib.AbstractContextManager[Callback]]  # (what, total bytes)

MIN_BYTES = 8 << 20  # smaller transfers finish before a bar would be worth drawing

_reporter: Reporter | None = None


def install(reporter: Reporter | None) -> None:
    global _reporter
    _reporter = reporter


def _ignore(_done: int) -> None:
    return None


@contextlib.contextmanager
def track(what: str, total: int) -> Iterator[Callback]:
    """A callback for one transfer of ``total`` bytes, described as ``what`` (e.g. "bundle -> gpu1")."""
    if _reporter is None or total < MIN_BYTES:
        yield _ignore
        return
    with _reporter(what, total) as callback:
        yield callback
