"""scripts/gpu_check.py where no GPU is lent: it says so and passes nothing; its table; and its agent
checks reading the real host agent's documents over the test hosts' fake nvidia-smi."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.testhosts import default_gpus

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
FAKE_SMI = REPO / "tests" / "support" / "fake_nvidia_smi.py"


def load() -> ModuleType:
    """The script as `python scripts/gpu_check.py` runs it: its own directory first on sys.path."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


gc = load()


def test_without_a_gpu_it_says_so_checks_nothing_and_exits_77() -> None:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, also on a machine that has one
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300,
                         check=False, cwd="/")
    assert res.returncode == 77, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("gpu_check: no CUDA GPU on this machine (torch ")
    assert lines[0].endswith("torch.cuda.is_available() False): nothing checked")
    rows = lines[3:]
    assert [r.split("  ")[0].strip() for r in rows] == list(gc.CHECKS)
    assert all(r.split()[-4:] == ["SKIP", "no", "CUDA", "GPU"] for r in rows), rows
    assert "PASS" not in res.stdout and "FAIL" not in res.stdout


def test_table_and_exit_code() -> None:
    rows = [gc.Result("torch", gc.PASS, 0.123, "torch 2.5"), gc.Result("reap kill", gc.SKIP, None, "listed"),
            gc.Result("resume", gc.FAIL, 12.0, "sha differs")]
    assert gc.format_table(rows).splitlines() == [
        "check      result   seconds  details",
        "-" * 36,
        "torch      PASS        0.12  torch 2.5",
        "reap kill  SKIP              listed",
        "resume     FAIL       12.00  sha differs",
    ]
    assert gc.exit_code(rows) == gc.EXIT_FAIL
    assert gc.exit_code(rows[:2]) == gc.EXIT_OK
    assert gc.exit_code(gc.no_gpu_results("no CUDA GPU")) == gc.EXIT_OK  # main() answers 77 before this


def test_a_crashing_check_is_its_own_fail_row(tmp_path: Path) -> None:
    checker = gc.Checker(tmp_path, {"count": 1}, 16)

    def boom() -> tuple[str, str]:
        raise KeyError("scale")

    checker.run("amp scaler", boom)
    checker.run("torch", lambda: (gc.PASS, "fine"))
    assert [(r.name, r.status, r.detail) for r in checker.results] == [
        ("amp scaler", "FAIL", "KeyError: 'scale'"), ("torch", "PASS", "fine")]


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps({"driver_version": "550.54.15", "cuda_version": "12.4", "broken": False,
                                 "gpus": default_gpus("gpucheck", 2)}))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S {FAKE_SMI} --state {state} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return state


def test_agent_status_check_reads_every_gpu(tmp_path: Path, fake_smi: Path) -> None:
    checker = gc.Checker(tmp_path, {"count": 2}, 16)
    assert checker.check_status() == (
        gc.PASS, "0: NVIDIA H100 80GB HBM3 81559 MiB 31 C; 1: NVIDIA H100 80GB HBM3 81559 MiB 31 C")
    assert gc.Checker(tmp_path, {"count": 3}, 16).check_status() == (gc.FAIL, "nvidia-smi gave 2 GPUs, torch sees 3")


def test_agent_health_check_fails_on_a_cpu_only_torch(tmp_path: Path, fake_smi: Path) -> None:
    """This machine's torch is a CPU build: on a 'GPU host' the agent's visibility check fails, and so
    does the health row, naming it (never a pass)."""
    pytest.importorskip("torch")
    status, detail = gc.Checker(tmp_path, {"count": 2}, 16).check_health()
    assert status == gc.FAIL
    assert detail.startswith("visibility fail: torch ")
    assert "is a CPU-only build (torch.version.cuda is None) on a GPU host" in detail
    assert "verdict FAIL: visibility: torch " in detail
