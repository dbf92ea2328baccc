"""The one way a ``gpuq`` command opens its ``Context`` (ledger, config, hosts)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.context import Context


def open_ctx(project_dir: Path | None = None) -> Context:
    """The context of the project at ``project_dir`` (default: the working directory's)."""
    from orchestrator.context import open_context

    try:
        return open_context(project_dir=project_dir)
    finally:
        gc.enable()  # off while the heavy modules load (main()); a long command needs it back
