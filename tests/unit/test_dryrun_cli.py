"""`gpuq submit --dry-run`: every expanded job, its host, estimate and exact argv; errors exit 2, nothing written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.conftest import run_gpuq


def _project(tmp_path: Path, queue: str, toml: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "gpuq.toml").write_text(toml)
    path = tmp_path / "queue.txt"
    path.write_text(queue)
    return path


TOML = '[run]\ncommand = "train.py --name {name} {args}"\nlauncher = "python"\nforward_env = ["MY_TOKEN"]\n'


def test_dry_run_prints_every_job_with_its_argv_and_masks_secrets(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, "name=lr gpus=1 -- --lr {1e-3,3e-4} --key tok-123\n", TOML)
    env = {"MY_TOKEN": "tok-123", "GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_LOCAL_PYTHON": "/usr/bin/python3"}
    done = run_gpuq("submit", "--dry-run", str(queue), env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["name", "config", "task", "epochs", "gpus", "host", "estimate", "argv"]
    assert lines[1].split()[:7] == ["lr-lr1e-3", "-", "-", "20", "1", "local", "no"]
    assert lines[1].endswith("/usr/bin/python3 train.py --name lr-lr1e-3 --lr 1e-3 --key '***'")
    assert lines[2].endswith("--name lr-lr3e-4 --lr 3e-4 --key '***'")
    assert "tok-123" not in done.stdout + done.stderr
    assert lines[-1] == "makespan unknown until one job of each config has run"

    done = run_gpuq("submit", "--dry-run", "--json", str(queue), env=env)
    doc = json.loads(done.stdout)
    assert [j["name"] for j in doc["jobs"]] == ["lr-lr1e-3", "lr-lr3e-4"]
    assert doc["jobs"][0]["argv"][-1] == "***" and doc["jobs"][0]["estimate_from"] == "no history"
    assert doc["makespan_s"] is None
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    assert conn.execute("SELECT COUNT(*) FROM sweep").fetchone()[0] == 0


def test_payload_jobs_show_the_payload_argv_and_a_makespan(gpuq_home: Path, tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text("lr: 1\n")
    queue = _project(tmp_path, "configs/a.yaml classify 3 est_min=2 -- --extra 1\n", "")
    done = run_gpuq("submit", "--dry-run", str(queue), env={"GPUQ_LOCAL_CPU_SLOTS": "2"})
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[1]
    assert "2 min (est_min=)" in row
    assert "payload/train.py --config " in row
    assert "/workdir/configs/a.yaml --task classify --epochs 3 --extra 1" in row
    assert done.stdout.splitlines()[-1].startswith("projected makespan ")


def test_errors_exit_2_and_write_nothing(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, "name=a -- x\n", TOML)
    done = run_gpuq("submit", "--dry-run", str(queue), env={"MY_TOKEN": ""})
    assert done.returncode == 0, done.stderr  # set (even empty) is enough
    queue.write_text("name=a -- x\ngpus=2 -- y\n")
    done = run_gpuq("submit", "--dry-run", str(queue))
    assert done.returncode == 2
    assert f"{queue}:2: a line without a config path needs name= (job ids derive from names)" in done.stderr
    (tmp_path / "gpuq.toml").write_text('[run]\ncommand = "train.py {nope}"\n')
    done = run_gpuq("submit", str(queue))
    assert done.returncode == 2 and "gpuq.toml:2:21: [run] command: unknown placeholder {nope}" in done.stderr
    assert "Traceback" not in done.stderr
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    assert conn.execute("SELECT COUNT(*) FROM sweep").fetchone()[0] == 0
