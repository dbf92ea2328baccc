"""Static checks run as part of the suite: ruff, mypy --strict, import-linter layers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", "orchestrator", "tests", "scripts", "payload")
    assert result.returncode == 0, result.stdout + result.stderr


def test_agent_is_python38_clean() -> None:
    """The host agent must run on old rental images (Python >= 3.8, stdlib only)."""
    result = _run(sys.executable, "-m", "ruff", "check", "--target-version", "py38", "--select", "E,F,UP,B",
                  "--isolated", "--line-length", "120", "payload/agent")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_import_layers() -> None:
    result = _run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
