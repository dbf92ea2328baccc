"""The suite's warm `gpuq` (tests/support/warmcli.py) answers exactly as an exec'd `python -m orchestrator`:
same exit code, stdout and stderr, for commands that read the working directory, the environment and
the ledger, that fail on user input, and that click itself answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import warmcli

ROOT = Path(__file__).resolve().parents[2]


def _exec(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    shutil.copytree(ROOT / "payload", work / "payload")
    (work / "queue.txt").write_text((ROOT / "payload" / "queue.txt").read_text())
    return work


CASES = [
    ["--help"],
    ["submit", "--help"],
    ["no-such-verb"],
    ["submit", "missing-queue.txt"],
    ["submit", "queue.txt", "--dry-run"],
    ["submit", "queue.txt", "--dry-run", "--json"],
    ["submit", "queue.txt", "--host", "nowhere"],
    ["hosts", "list"],
    ["results"],
    ["status", "--no-probe"],
    ["cancel", "abc"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_the_warm_cli_answers_as_an_execd_one(args: list[str], project: Path, tmp_path: Path) -> None:
    answers = []
    for how in ("warm", "exec"):
        env = {**os.environ, "GPUQ_HOME": str(tmp_path / how / "home"), "COLUMNS": "97"}
        env.pop(warmcli.EXEC_ENV, None)
        if how == "warm":
            answers.append(warmcli.run(args, env, project, 120))
        else:
            answers.append(_exec(args, env, project))
    warm, execd = answers
    assert (warm.returncode, warm.stdout, warm.stderr.replace("/warm/", "/exec/")) == (
        execd.returncode, execd.stdout, execd.stderr), args

