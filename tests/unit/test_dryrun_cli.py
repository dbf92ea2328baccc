"""`gpuq submit --dry-run`: every expanded job, its host, estimate and exact argv; errors exit 2, nothing written."""

from __future__ import annotations

import json
import os
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
    env = {"MY_TOKEN": "tok-123", "GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_LOCAL_PYTHON": "/usr/bin/python3",
           "GPUQ_FORWARD_ENV_ALLOW": "MY_*"}
    done = run_gpuq("submit", "--dry-run", str(queue), env=env)
    assert done.returncode == 0, done.stderr
    # warnings go to stderr (`submit --dry-run 2>/dev/null` is the plan alone)
    assert done.stderr.splitlines()[0] == "warning: forwarding these environment variables to the hosts " \
        f"([run] forward_env in {tmp_path}/gpuq.toml): MY_TOKEN"
    assert "warning" not in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["name", "config", "task", "epochs", "gpus", "host", "estimate", "argv"]
    assert lines[1].split()[:7] == ["lr-lr1e-3", "-", "-", "-", "1", "local", "no"]  # no epochs given: none shown
    assert lines[1].endswith("/usr/bin/python3 train.py --name lr-lr1e-3 --lr 1e-3 --key '***'")
    assert lines[2].endswith("--name lr-lr3e-4 --lr 3e-4 --key '***'")
    assert "tok-123" not in done.stdout + done.stderr
    assert lines[-1] == "makespan unknown until one job of each config has run"

    done = run_gpuq("submit", "--dry-run", "--json", str(queue), env=env)
    doc = json.loads(done.stdout)
    assert [j["name"] for j in doc["jobs"]] == ["lr-lr1e-3", "lr-lr3e-4"]
    assert doc["jobs"][0]["argv"][-1] == "***" and doc["jobs"][0]["estimate_from"] == "no history"
    assert doc["makespan_s"] is None and doc["forward_env"] == ["MY_TOKEN"]
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
    done = run_gpuq("submit", "--dry-run", str(queue), env={"MY_TOKEN": "", "GPUQ_FORWARD_ENV_ALLOW": "MY_TOKEN"})
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


def test_a_project_forwards_only_names_the_user_allowed_and_never_gpuqs_credentials(gpuq_home: Path,
                                                                                     tmp_path: Path) -> None:
    keys = {"RUNPOD_API_KEY": "rp-secret", "GPUQ_RUNPOD_API_KEY": "gq-secret", "MY_TOKEN": "tok-123"}
    everything = {**keys, "GPUQ_FORWARD_ENV_ALLOW": "*"}  # even a user who allows every name
    for name in ("RUNPOD_API_KEY", "GPUQ_RUNPOD_API_KEY"):
        queue = _project(tmp_path, "name=a -- x\n", f'[run]\ncommand = "train.py {{args}}"\nforward_env = ["{name}"]\n')
        for args in (("submit", "--dry-run", str(queue)), ("submit", str(queue))):
            done = run_gpuq(*args, env=everything)
            assert done.returncode == 2, done.stdout + done.stderr
            assert done.stderr.strip().splitlines() == [
                f"gpuq: {tmp_path}/gpuq.toml:3:1: [run] forward_env: Value error, {name} is gpuq's RunPod API "
                "credential: gpuq never sends it to a host; remove it"], done.stderr
            assert "secret" not in done.stdout + done.stderr
    queue = _project(tmp_path, "name=a -- x\n", TOML)
    done = run_gpuq("submit", str(queue), env=keys)  # MY_TOKEN set, but this user allowed nothing
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"gpuq: {tmp_path}/gpuq.toml: [run] forward_env: MY_TOKEN is not in your forward_env_allow; if this "
        f'project may send it to its hosts, add forward_env_allow = ["MY_TOKEN"] to {gpuq_home}/config.toml (or set '
        "GPUQ_FORWARD_ENV_ALLOW=MY_TOKEN); nothing was submitted")
    (gpuq_home / "config.toml").write_text('forward_env_allow = ["MY_TOKEN"]\n')
    done = run_gpuq("submit", "--dry-run", "--json", str(queue), env={**keys, "GPUQ_LOCAL_CPU_SLOTS": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["forward_env"] == ["MY_TOKEN"]
    (tmp_path / "gpuq.toml").write_text('forward_env_allow = ["MY_TOKEN"]\n' + TOML)
    done = run_gpuq("submit", "--dry-run", str(queue), env=keys)
    assert done.returncode == 2 and "forward_env_allow can only be set in your own" in done.stderr
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    assert conn.execute("SELECT COUNT(*) FROM sweep").fetchone()[0] == 0


def test_dry_run_names_the_framework_output_dirs_it_left_out(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, "name=a -- --x 1\n", '[run]\ncommand = "train.py {args}"\nlauncher = "python"\n')
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").write_text("epoch\n0\n")
    done = run_gpuq("submit", "--dry-run", str(queue), env={"GPUQ_LOCAL_CPU_SLOTS": "2"})
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stdout and done.stderr.splitlines()[0] == (
        "warning: left out of the bundle (training framework output, never the job's own; a `!name/` line in "
        ".gpuqignore ships one): lightning_logs/")


def test_a_workstation_with_one_gpu_refuses_a_two_gpu_job_before_its_host_was_ever_used(gpuq_home: Path,
                                                                                         tmp_path: Path) -> None:
    """This machine's agent takes its GPUs over its CPU slots: with one GPU listed by nvidia-smi (and
    sixteen CPU slots allowed), a gpus=2 line cannot be placed, in the dry run and in the real submit,
    though the local host has never been probed; nothing is written."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=index ] && echo 0 && exit 0\nexit 9\n")
    smi.chmod(0o755)
    queue = _project(tmp_path, "name=big gpus=2\nname=small gpus=1\n",
                     '[run]\ncommand = "train.py --name {name}"\nlauncher = "python"\n')
    # GPUQ_PREFLIGHT=false: the real submit would first check that GPU with the agent's health preflight
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUQ_LOCAL_CPU_SLOTS": "16", "GPUQ_PREFLIGHT": "false"}
    for extra in (["--dry-run"], []):
        done = run_gpuq("submit", *extra, str(queue), env=env)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert "queue.txt:1: job 'big' cannot be placed: needs 2 slots (gpus=2); the largest usable host has 1" \
            in done.stderr, done.stderr
        assert not (gpuq_home / "ledger.db").exists() or not sqlite3.connect(gpuq_home / "ledger.db").execute(
            "select count(*) from job").fetchone()[0]
    without = run_gpuq("submit", "--dry-run", str(queue), env={"GPUQ_LOCAL_CPU_SLOTS": "16"})
    assert without.returncode == 0, without.stderr  # the same queue on a CPU machine with 16 slots
