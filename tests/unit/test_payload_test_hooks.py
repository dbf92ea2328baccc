"""The payload config's TEST HOOK keys: optional, validated like every other key, read by the trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "payload"))

from gpuq_payload import ConfigError  # noqa: E402
from gpuq_payload.config import load_config  # noqa: E402

from scripts.bench_project import TINY_CONFIG  # noqa: E402


def _write(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG + extra)
    return path


def test_the_threads_hook_is_optional_and_read_as_given(tmp_path: Path) -> None:
    assert "test_hook_threads" not in load_config(str(_write(tmp_path, "")))
    assert load_config(str(_write(tmp_path, "test_hook_threads: 1\n")))["test_hook_threads"] == 1


@pytest.mark.parametrize(("value", "message"), [("0", "must be >= 1"), ("1.5", "must be an integer"),
                                                ("true", "must be an integer")])
def test_the_threads_hook_refuses_what_is_not_a_thread_count(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"'test_hook_threads' {message}"):
        load_config(str(_write(tmp_path, f"test_hook_threads: {value}\n")))


PROBE = """import sys, torch
import train
import gpuq_payload.trainer as trainer
seen = []
trainer.Trainer.run = lambda self: seen.append(torch.get_num_threads()) or 0
codes = [train.main(["--config", path, "--task", "classify", "--epochs", "1"]) for path in sys.argv[1:]]
print(*codes, *seen)
"""


def test_the_trainer_runs_with_the_threads_the_hook_names(tmp_path: Path) -> None:
    """torch's intra-op threads when the trainer starts training: OMP_NUM_THREADS's without the hook, then
    the hook's (one process, so one torch import for both)."""
    pytest.importorskip("torch")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, hooked = _write(tmp_path / "a", ""), _write(tmp_path / "b", "test_hook_threads: 1\n")
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2", "GPUQ_CKPT_DIR": str(tmp_path / "ckpt"),
           "GPUQ_RESULT_DIR": str(tmp_path / "result"), "GPUQ_HEARTBEAT": str(tmp_path / "hb")}
    done = subprocess.run([sys.executable, "-c", PROBE, str(plain), str(hooked)], cwd=ROOT / "payload",
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0", "2", "1"], done.stdout + done.stderr
