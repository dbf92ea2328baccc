"""``gpuq -v``: show what gpuq does behind the scenes (provider retries, backoff and rate-limit
waits, SSH connect retries) as log lines on stderr.  Without ``-v`` nothing is configured and
nothing new prints (docs/cli.md)."""

from __future__ import annotations

import logging


def configure(verbosity: int) -> None:
    """-v: gpuq's INFO records; -vv: DEBUG too (every provider request).  Logs go to stderr."""
    if verbosity <= 0:
        return
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False, rich_tracebacks=False)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    log = logging.getLogger("orchestrator")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO)
