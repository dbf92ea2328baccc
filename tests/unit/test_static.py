"""Static checks run as part of the suite: ruff, mypy --strict, import-linter layers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.devtools import dev_tool

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


def test_import_layers() -> None:
    """The agent's packages are root packages of the contract: lint-imports finds them on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT / "payload" / "agent"), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run([dev_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            check=False, env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("target", "paths"), [("3.10-", ("orchestrator",)), ("3.8-", ("payload/agent",))])
def test_minimum_python_versions(target: str, paths: tuple[str, ...]) -> None:
    """The controller runs on Python 3.10 (Ubuntu 22.04), the agent on 3.8 (old rental images)."""
    result = _run(dev_tool("vermin"), f"--target={target}", "--no-tips", "--violations",
                  "--backport", "typing", *paths)
    assert result.returncode == 0, result.stdout + result.stderr
