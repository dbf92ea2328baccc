"""``gpuq``'s console script: ``gpuq --help`` from a static text, everything else through ``cli/main.py``.

Importing click alone costs about a tenth of a second; the top-level help is printed from
``cli/helptext.py`` without it (tests/unit/test_help_static.py renders the real group's help and
compares, so the text cannot drift).  Only an exact ``gpuq --help`` / ``gpuq -h`` on a terminal at
least 80 columns wide (or no terminal) takes this path: a narrower one wraps differently, through click.
"""

from __future__ import annotations

import os
import sys
from typing import Any

HELP_ARGS = (["--help"], ["-h"])
WIDE = 80  # click wraps help at min(columns, 80) - 2: from 80 columns on, the text is the same


def columns() -> int:
    """The terminal width click's help formatter sees (shutil.get_terminal_size without importing shutil)."""
    try:
        cols = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        cols = 0
    if cols <= 0:
        try:
            cols = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
        except (AttributeError, ValueError, OSError):
            cols = 0
    return cols if cols > 0 else WIDE


def static_help(argv: list[str]) -> bool:
    """Print the top-level help and say True when ``argv`` asks for just that; else print nothing."""
    if argv not in HELP_ARGS or columns() < WIDE:
        return False
    from orchestrator.cli.helptext import TEXT

    sys.stdout.write(TEXT)
    sys.stdout.flush()
    return True


def main(argv: list[str] | None = None) -> Any:
    if static_help(sys.argv[1:] if argv is None else argv):
        return None
    from orchestrator.cli.main import main as click_main

    return click_main(argv)
