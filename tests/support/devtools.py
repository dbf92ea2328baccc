"""The dev tools the static tests run (pyproject's ``dev`` extra)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def dev_tool(name: str) -> str:
    """A dev tool of the interpreter running the tests (its venv's bin/), whether or not it is on PATH:
    a missing tool fails the suite rather than skipping the check."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"{name} is not installed beside {sys.executable}: pip install -e '.[dev]'"
    return found
