"""Every mistake with the health and cloud verbs is one clear line and an exit code; nothing changes.

No network and no hosts are needed: each command fails before it would touch one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_test"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _one_line(out: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert out.returncode == code, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines and "Traceback" not in out.stderr, out.stderr
    assert all(n in out.stderr for n in needles), out.stderr


def _nothing_recorded(home: Path) -> None:
    if (home / "ledger.db").exists():
        ledger = Ledger(home / "ledger.db")
        try:
            assert ledger.hosts() == [] or all(h.kind == "local" for h in ledger.hosts())
        finally:
            ledger.close()


def test_up_mistakes(gpuq_home: Path, key: Path, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "RUNPOD_API_KEY": "", "GPUQ_RUNPOD_API_KEY": ""}
    _one_line(run_gpuq("up", "--provider", "runpod", "--gpu", "X", env=env), 2, "no SSH key pair found", "--key")
    _one_line(run_gpuq("up", "--provider", "runpod", "--gpu", "X", "--key", str(key), "--bid", "0.2", env=env), 2,
              "--bid is a spot bid: add --spot")
    _one_line(run_gpuq("up", "--provider", "runpod", "--gpu", "X", "--key", str(key), "--count", "0", env=env), 2,
              "--count and --gpus must be at least 1")
    empty = run_gpuq("up", "--provider", "runpod", "--gpu", "X", "--key", str(key), env=env)
    _one_line(empty, 2, "RUNPOD_API_KEY is set but empty")
    unset = {k: v for k, v in os.environ.items() if not k.endswith("RUNPOD_API_KEY")} | {"GPUQ_HOME": str(gpuq_home)}
    no_key = subprocess.run([sys.executable, "-m", "orchestrator", "up", "--provider", "runpod", "--gpu", "X",
                             "--key", str(key)], capture_output=True, text=True, env=unset, timeout=120, check=False)
    _one_line(no_key, 1, "RUNPOD_API_KEY", "keys.toml")
    bad_choice = run_gpuq("up", "--provider", "nosuchcloud", "--gpu", "X")
    assert bad_choice.returncode == 2 and "'nosuchcloud' is not one of 'runpod', 'lambda'" in bad_choice.stderr
    _nothing_recorded(gpuq_home)


def test_down_resume_doctor_reap_mistakes(gpuq_home: Path) -> None:
    _one_line(run_gpuq("down"), 2, "name the hosts to terminate")
    _one_line(run_gpuq("down", "nosuch"), 2, 'unknown host "nosuch"')
    _one_line(run_gpuq("down", "--sweep", "qzzzzzz"), 2, "qzzzzzz")
    _one_line(run_gpuq("reap", "nosuch"), 2, 'unknown host "nosuch"')
    _one_line(run_gpuq("doctor"), 2, "no host registered yet")
    _one_line(run_gpuq("doctor", "nosuch"), 2, 'unknown host "nosuch"')
    resumed = run_gpuq("resume")
    assert resumed.returncode == 0 and "nothing to resume" in resumed.stdout, resumed.stderr
    _nothing_recorded(gpuq_home)
