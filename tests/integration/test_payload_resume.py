"""End-to-end resume tests of the payload trainer under real torchrun (2 CPU processes, gloo).

An interrupted (SIGTERM or SIGKILL) and relaunched run must end with bit-identical weights to an
uninterrupted run with the same seed and world size.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.once import once
from tests.support.proctree import assert_gone, descendants

torch = pytest.importorskip("torch")

PAYLOAD = Path(__file__).resolve().parents[2] / "payload"
TRAIN = PAYLOAD / "train.py"
EPOCHS = 6
NO_PICKLE = Path(__file__).resolve().parent / "no_pickle_collectives"

CONFIG = """\
seed: 7
batch_size: 16
model: {{width: 64, depth: 2, dropout: 0.1}}
data: {{n_train: 2048, n_val: 256, n_features: 16, n_classes: 4, noise: 2.0}}
augment: {{noise_std: 0.2, feature_drop: 0.1}}
optim: {{lr: 0.05, momentum: 0.9, weight_decay: 0.0001}}
schedule: {{warmup_steps: 20, kind: cosine}}
ckpt_every_steps: {ckpt_every}
log_every_steps: 8
"""

pytestmark = pytest.mark.integration


def _write_config(tmp: Path, ckpt_every: int) -> Path:
    path = tmp / f"cfg_{ckpt_every}.yaml"
    path.write_text(CONFIG.format(ckpt_every=ckpt_every))
    return path


def _env(run_dir: Path, **extra: str) -> dict:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("GPUQ_"):
            del env[key]
    env.update({
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "GPUQ_CKPT_DIR": str(run_dir / "ckpt"), "GPUQ_RESULT_DIR": str(run_dir / "result"),
        "GPUQ_HEARTBEAT": str(run_dir / "heartbeat"), "GPUQ_HEARTBEAT_S": "0.5",
        "GPUQ_CKPT_INTERVAL_S": "600", "GPUQ_JOB_ID": "c0123456789ab", "GPUQ_ATTEMPT": "1",
    })
    # torch.distributed's pickling collectives raise in every process of these runs
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(NO_PICKLE), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _cmd(config: Path, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", str(TRAIN), "--config", str(config), "--task", "classify",
            "--epochs", str(EPOCHS)]


def _start(config: Path, run_dir: Path, log: Path, **env: str) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = open(log, "ab")  # noqa: SIM115 - closed after the process ends
    proc = subprocess.Popen(_cmd(config), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                            env=_env(run_dir, **env), start_new_session=True)
    proc._gpuq_log = fh  # type: ignore[attr-defined]
    return proc


def _wait(proc: subprocess.Popen, timeout: float = 60) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        proc._gpuq_log.close()  # type: ignore[attr-defined]


def _run(config: Path, run_dir: Path, log: Path, **env: str) -> int:
    return _wait(_start(config, run_dir, log, **env))


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "result" / "summary.json").read_text())


def _final_model(run_dir: Path) -> dict:
    pointer = json.loads((run_dir / "ckpt" / "LATEST").read_text())
    return torch.load(run_dir / "ckpt" / pointer["file"], map_location="cpu", weights_only=True)["model"]


def _evals(run_dir: Path) -> list[tuple]:
    out = []
    for line in (run_dir / "result" / "metrics.jsonl").read_text().splitlines():
        doc = json.loads(line)
        if doc["kind"] == "eval":
            out.append((doc["epoch"], doc["step"], doc["val_loss"], doc["val_acc"]))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, once for the whole test run (tests/support/once.py); tests only read it."""
    return Path(once(tmp_path_factory, "test_payload_resume-reference", _reference))


def _reference(tmp: Path) -> str:
    run_dir = tmp / "run"
    rc = _run(_write_config(tmp, 40), run_dir, tmp / "log.txt")
    log = (tmp / "log.txt").read_text()
    assert rc == 0, log
    assert "GPUQ_RESUMED" not in log
    summary = _summary(run_dir)
    assert summary["steps"] == EPOCHS * (2048 // 2 // 16)
    assert summary["world_size"] == 2 and summary["effective_batch"] == 32
    assert json.loads((run_dir / "heartbeat").read_text())["phase"] == "done"
    assert torch.load(run_dir / "ckpt" / "best.pt", weights_only=True)["metrics"]["kind"] == "eval"
    return str(run_dir)


def _interrupt_and_resume(tmp: Path, reference: Path, sig: int, ckpt_every: int, **env: str) -> None:
    config = _write_config(tmp, ckpt_every)
    run_dir, log = tmp / "run", tmp / "log.txt"
    proc = _start(config, run_dir, log, **env)
    latest = run_dir / "ckpt" / "LATEST"
    deadline = time.monotonic() + 45
    while not latest.exists():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    seed = random.randrange(1 << 30)
    time.sleep(random.Random(seed).uniform(0.0, 0.6))
    workers = descendants(proc.pid)
    os.killpg(proc.pid, sig)  # torchrun's group; its workers live in sessions of their own
    rc = _wait(proc)
    # SIGTERM: relayed by torchrun; SIGKILL: the payload's parent-death signal
    assert_gone(workers, what="worker processes survived their launcher")
    first = log.read_text()
    assert rc != 0, f"training finished before the signal (delay seed {seed})\n{first}"
    assert not (run_dir / "result" / "summary.json").exists()
    pointer = json.loads(latest.read_text())
    assert pointer["step"] < reference_steps(reference)
    if sig == signal.SIGTERM:
        assert "stop requested by signal" in first, first

    rc = _run(config, run_dir, log, **env)
    text = log.read_text()[len(first):]
    assert rc == 0, text
    m = re.search(r"GPUQ_RESUMED step=(\d+) epoch=(\d+) sha256=([0-9a-f]{64})", text)
    assert m, text
    assert int(m.group(1)) == pointer["step"] and m.group(3) == pointer["sha256"]
    steps = [int(s) for s in re.findall(r"^epoch \d+/\d+ step (\d+)/", text, re.M)]
    assert steps and steps[0] >= pointer["step"], text

    assert _summary(run_dir)["weights_sha256"] == _summary(reference)["weights_sha256"]
    mine, ref = _final_model(run_dir), _final_model(reference)
    assert sorted(mine) == sorted(ref)
    for key in ref:
        assert torch.equal(mine[key], ref[key]), key
    assert _evals(run_dir) == _evals(reference)




def test_the_runs_refuse_pickling_collectives(tmp_path: Path) -> None:
    """The guard the resume tests run under is live: each save (RNG states of every rank) and each
    resume (rank 0's choice) above crossed ranks without any ``*_object`` collective."""
    probe = ("import torch.distributed as d\n"
             "try:\n    d.all_gather_object([None], 1)\nexcept RuntimeError as e:\n    print(e)\n"
             "try:\n    d.broadcast_object_list([None])\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=60).stdout
    assert out.count("pickle-based collective") == 2, out


def reference_steps(reference: Path) -> int:
    return _summary(reference)["steps"]


def test_sigterm_then_resume_is_bit_identical(tmp_path: Path, reference: Path) -> None:
    _interrupt_and_resume(tmp_path, reference, signal.SIGTERM, ckpt_every=40)


def test_sigkill_then_resume_from_timer_checkpoint(tmp_path: Path, reference: Path) -> None:
    _interrupt_and_resume(tmp_path, reference, signal.SIGKILL, ckpt_every=0, GPUQ_CKPT_INTERVAL_S="0.3")


def test_config_error_exits_4_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.format(ckpt_every=10) + "learning_rate: 0.1\n")
    proc = subprocess.run([sys.executable, str(TRAIN), "--config", str(bad), "--task", "classify",
                           "--epochs", "1"], env=_env(tmp_path / "run"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 4
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "learning_rate" in lines[0] and str(bad) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr

    proc = subprocess.run([sys.executable, str(TRAIN), "--config", str(_write_config(tmp_path, 10)),
                           "--task", "segment", "--epochs", "1"], env=_env(tmp_path / "run"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and "unknown task 'segment'" in proc.stderr, proc.stderr
