"""The gpuq CLI as a user meets it: real subprocesses, a real ledger, a real host agent, real torchrun."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_gpuq, wait_for
from tests.support.lightproject import light_config, light_project

pytestmark = pytest.mark.integration

TINY = {
    "seed": 7, "batch_size": 32,
    "model": {"width": 32, "depth": 1, "dropout": 0.0},
    "data": {"n_train": 512, "n_val": 128, "n_features": 8, "n_classes": 4, "noise": 1.0},
    "augment": {"noise_std": 0.1, "feature_drop": 0.0},
    "optim": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0},
    "schedule": {"warmup_steps": 2, "kind": "cosine"},
    "ckpt_every_steps": 8, "log_every_steps": 4,
}


def _project(tmp_path: Path, lines: list[str], configs: dict[str, dict[str, object]] | None = None) -> Path:
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    for name, cfg in (configs or {"tiny": TINY}).items():
        (work / "configs" / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    queue = work / "queue.txt"
    queue.write_text("\n".join(lines) + "\n")
    return queue


def _ledger_rows(home: Path, sql: str) -> list[tuple[object, ...]]:
    path = home / "ledger.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


# --- user mistakes: a clear message, exit 2, no traceback, nothing written ------------------------


def _assert_usage(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_missing_queue_file(gpuq_home: Path, tmp_path: Path) -> None:
    result = run_gpuq("submit", str(tmp_path / "nope.txt"))
    _assert_usage(result, "nope.txt: cannot read queue file: No such file or directory")


def test_bad_queue_reports_every_error_and_writes_nothing(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, [
        "configs/tiny.yaml classify 2O",
        "configs/tiny.yaml classify 2 gpus=0 name=b",
        "configs/missing.yaml classify name=c",
    ])
    result = run_gpuq("submit", str(queue))
    label = str(queue)
    _assert_usage(
        result,
        f'{label}:1:28: epochs must be a positive integer, got "2O"',
        f'{label}:2:30: gpus must be an integer from 1 to 64, got "0"',
        f"{label}:3:1: config file not found: configs/missing.yaml",
        "3 errors",
    )
    assert _ledger_rows(gpuq_home, "select * from sweep") == []
    assert not (gpuq_home / "local" / "inbox").exists()


def test_unknown_host_and_unplaceable_job(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, ["configs/tiny.yaml classify 1 gpus=8"])
    _assert_usage(run_gpuq("submit", str(queue), "--host", "box-7"), 'unknown host "box-7"')
    result = run_gpuq("submit", str(queue), env={"GPUQ_LOCAL_CPU_SLOTS": "2"})
    _assert_usage(result, "queue.txt:1: job 'tiny' cannot be placed: needs 8 slots", "nothing was submitted")
    assert _ledger_rows(gpuq_home, "select * from job") == []


def test_multi_node_is_refused_not_silently_shrunk(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, ["configs/tiny.yaml classify 1", "configs/tiny.yaml classify 1 name=mn nodes=2"])
    result = run_gpuq("submit", str(queue))
    _assert_usage(result, "queue.txt:2: job 'mn' cannot be placed: needs 2 nodes with gpus=1 each: 2 SSH hosts with "
                          "1 slots each (0 usable), or a Slurm host with 2 nodes", "nothing was submitted")
    assert _ledger_rows(gpuq_home, "select * from job") == []


def test_bad_setting_names_the_variable(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, ["configs/tiny.yaml classify 1"])
    _assert_usage(run_gpuq("submit", str(queue), env={"GPUQ_RETRIES": "lots"}), "GPUQ_RETRIES")


def test_job_references(gpuq_home: Path) -> None:
    _assert_usage(run_gpuq("results"), "no sweeps yet")
    _assert_usage(run_gpuq("logs", "c1"), "at least 4 characters")
    _assert_usage(run_gpuq("cancel"), "give one or more JOBs, --sweep SWEEP or --all")
    _assert_usage(run_gpuq("cancel", "--sweep", "qzzzzzz"), "no sweep matches 'qzzzzzz'")
    assert run_gpuq("submit").returncode == 2  # click usage error: missing argument


def test_dry_run_writes_nothing(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, ["configs/tiny.yaml classify 1", "configs/tiny.yaml classify 1 name=two"])
    result = run_gpuq("submit", str(queue), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "2 jobs valid" in result.stdout and "nothing was written" in result.stdout
    assert _ledger_rows(gpuq_home, "select * from sweep") == []
    assert _ledger_rows(gpuq_home, "select * from host") == []
    assert not (gpuq_home / "local" / "inbox").exists()


# --- the real thing -----------------------------------------------------------------------------


def test_submit_detaches_runs_to_success_and_reports(gpuq_home: Path, tmp_path: Path) -> None:
    bad = dict(TINY, model={"width": 32, "depth": 1, "dropout": 0.0, "colour": "red"})
    # one process each (two-process jobs on the local host: test_example_queue.py)
    queue = _project(tmp_path, [
        "configs/tiny.yaml classify 2 gpus=1",
        "configs/tiny.yaml classify 3 gpus=1 name=longer seed=11",
        "configs/bad.yaml  classify 1 gpus=1",
        "configs/tiny.yaml classify 2 gpus=1 name=quoted seed=0",
    ], configs={"tiny": TINY, "bad": bad})
    env = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1"}
    submitted = run_gpuq("submit", str(queue), env=env)
    assert submitted.returncode == 0, submitted.stderr
    sweep = submitted.stdout.split("sweep ", 1)[1].split(":", 1)[0]
    # gpuq has exited; the detached agent owns the jobs now
    states = {r[0] for r in _ledger_rows(gpuq_home, "select state from job")}
    assert states <= {"ASSIGNED", "RUNNING"}
    agent = json.loads((gpuq_home / "local" / "agent.pid").read_text())
    os.kill(agent["pid"], 0)

    waited = run_gpuq("wait", "--sweep", sweep, env=env, timeout=400)
    assert waited.returncode == 1  # the bad config failed, so wait reports failure
    snap = json.loads(run_gpuq("status", "--json", env=env).stdout)
    by_name = {j["name"]: j for j in snap["jobs"]}
    assert {n: j["state"] for n, j in by_name.items()} == {
        "tiny": "SUCCEEDED", "longer": "SUCCEEDED", "bad": "FAILED", "quoted": "SUCCEEDED"}
    assert by_name["bad"]["exit_code"] == 4 and "configuration error" in by_name["bad"]["message"]
    assert by_name["longer"]["step"] == by_name["longer"]["total_steps"] > 0
    assert snap["schema"] == "gpuq.cli.status/1" and snap["hosts"][0]["name"] == "local"
    assert snap["sweeps"][0]["states"] == {"SUCCEEDED": 3, "FAILED": 1}

    table = run_gpuq("results", "--csv", env=env)
    assert table.returncode == 0, table.stderr
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO(table.stdout))}
    for name in ("tiny", "longer", "quoted"):
        assert 0.0 <= float(rows[name]["final_val_acc"]) <= 1.0
        assert float(rows[name]["best_val_acc"]) >= float(rows[name]["final_val_acc"])
    assert rows["bad"]["final_val_acc"] == ""
    # every job of one sweep stores its attempt, checkpoint and hashed artifacts in the ledger
    artifacts = _ledger_rows(gpuq_home, "select job_id, path, bytes, sha256 from artifact")
    assert {p for _, p, _, _ in artifacts} >= {"result/metrics.jsonl", "result/summary.json", "ckpt/best.pt"}
    assert _ledger_rows(gpuq_home, "select count(*) from checkpoint")[0][0] >= 3

    log = run_gpuq("logs", f"{sweep}:longer", env=env)
    assert log.returncode == 0 and "GPUQ_RESUMED" not in log.stdout and "epoch 3/3" in log.stdout
    bad_log = run_gpuq("logs", by_name["bad"]["id"][:6], env=env)
    assert "colour" in bad_log.stdout
    followed = run_gpuq("logs", "-f", by_name["tiny"]["id"], env=env, timeout=60)  # ends with the job
    assert followed.returncode == 0 and followed.stdout.count("epoch 2/2") >= 1


def test_cancel_running_and_queued(gpuq_home: Path, tmp_path: Path) -> None:
    slow = dict(TINY, data=dict(TINY["data"], n_train=20000))  # type: ignore[arg-type]
    queue = _project(tmp_path, ["configs/slow.yaml classify 50 gpus=2", "configs/slow.yaml classify 50 gpus=2 name=b"],
                     configs={"slow": slow})
    env = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_KILL_GRACE_S": "5"}
    submitted = run_gpuq("submit", str(queue), "--json", env=env)  # like sbatch --parsable
    assert submitted.returncode == 0, submitted.stderr
    doc = json.loads(submitted.stdout)
    sweep = str(_ledger_rows(gpuq_home, "select id from sweep")[0][0])
    assert doc["sweep"] == sweep and [j["name"] for j in doc["jobs"]] == ["slow", "b"]
    assert {j["host"] for j in doc["jobs"]} == {"local"} and doc["schema"] == "gpuq.cli.submit/1"
    refused = run_gpuq("cancel", "--sweep", sweep, env=env)  # two jobs, no terminal, no -y
    assert refused.returncode == 2 and "-y" in refused.stderr
    result = run_gpuq("cancel", "--sweep", sweep, "-y", env=env)
    assert result.returncode == 0, result.stderr
    assert "withdrawn" in result.stdout  # the second job never left the inbox
    snap = json.loads(run_gpuq("status", "--json", env=env).stdout)
    assert {j["state"] for j in snap["jobs"]} == {"CANCELLED"}


# --- atomicity: kill gpuq anywhere during submit -----------------------------------------------


def test_kill_during_submit_leaves_all_or_nothing(gpuq_home: Path, tmp_path: Path) -> None:
    lines = [f"configs/tiny.yaml classify 1 name=j{i}" for i in range(150)]
    queue = _project(tmp_path, lines)
    root = gpuq_home / "local"
    root.mkdir()
    # Hold the agent lock: the host then looks busy with a live agent, so specs stay in the inbox
    # and nothing trains; the test inspects exactly what reached the host.
    lock = open(root / "agent.lock", "a+")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    rng = random.Random(1234)
    env = dict(os.environ)
    try:
        for _ in range(8):
            proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(queue)], env=env,
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                proc.wait(timeout=rng.uniform(0.3, 2.5))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            sweeps = _ledger_rows(gpuq_home, "select id, job_count from sweep")
            for sweep_id, count in sweeps:
                jobs = _ledger_rows(gpuq_home, f"select count(*) from job where sweep_id = '{sweep_id}'")
                assert jobs[0][0] == count == 150
            known = {r[0] for r in _ledger_rows(gpuq_home, "select id from job")}
            on_host = {p.stem for p in (root / "inbox").glob("*.json")}
            assert on_host <= known, "a job reached the host that the ledger does not know"
        # one submit that completes (the held lock keeps its jobs waiting in the inbox)
        assert run_gpuq("submit", str(queue)).returncode == 0
        # a placed job that has not started has no log yet: say so, do not print nothing
        waiting = str(_ledger_rows(gpuq_home, "select id from job where state = 'ASSIGNED' limit 1")[0][0])
        no_log = run_gpuq("logs", waiting)
        assert no_log.returncode == 1 and "has no log yet" in no_log.stderr and "Traceback" not in no_log.stderr
        # a later tick delivers whatever a killed submit recorded but never handed over
        assert run_gpuq("status", "--json").returncode == 0
        known = {r[0] for r in _ledger_rows(gpuq_home, "select id from job")}
        on_host = {p.stem for p in (root / "inbox").glob("*.json")}
        assert on_host == known
        assert {r[0] for r in _ledger_rows(gpuq_home, "select state from job")} <= {"ASSIGNED"}
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def test_dead_agent_is_revived_and_nothing_runs_twice(gpuq_home: Path, tmp_path: Path) -> None:
    # the light stdlib trainer (tests/support/lightproject.py): what is under test is the agent, not training
    queue = light_project(tmp_path, {"tiny": light_config(steps=8, step_s=0.5)},
                          ["configs/tiny.yaml classify 2 gpus=2", "configs/tiny.yaml classify 2 gpus=2 name=b"])
    env = {"GPUQ_LOCAL_CPU_SLOTS": "2"}
    assert run_gpuq("submit", str(queue), env=env).returncode == 0
    root = gpuq_home / "local"
    assert wait_for(lambda: any(root.glob("jobs/*/attempts/1/launch.json")), 30)
    agent = json.loads((root / "agent.pid").read_text())
    os.killpg(agent["pgid"], signal.SIGKILL)  # the agent dies; the first job's wrapper lives on
    assert wait_for(lambda: not Path(f"/proc/{agent['pid']}").exists(), 10)
    assert len(list((root / "inbox").glob("*.json"))) == 1  # the second job is stranded

    waited = run_gpuq("wait", env=env, timeout=300)  # each tick sees a dead agent with work pending
    assert waited.returncode == 0, waited.stdout + waited.stderr
    attempts = sorted(p.relative_to(root).as_posix() for p in root.glob("jobs/*/attempts/*"))
    assert len(attempts) == 2 and all(a.endswith("/attempts/1") for a in attempts)
    events = _ledger_rows(gpuq_home, "select message from event where kind = 'host'")
    assert any("agent was not running" in str(m[0]) for m in events)


def test_watch_without_a_sweep_waits_for_every_sweep_even_one_submitted_meanwhile(gpuq_home: Path,
                                                                                tmp_path: Path) -> None:
    """The unattended controller (docs/health.md): `gpuq watch` alone ends once every sweep is done,
    not just the newest one when it started."""
    env = {"GPUQ_LOCAL_CPU_SLOTS": "1", "GPUQ_PATROL_MIN_INTERVAL_S": "0.2"}
    first = light_project(tmp_path / "a", {"tiny": light_config(steps=10, step_s=0.5)},
                          ["configs/tiny.yaml classify 1 name=first"])
    assert run_gpuq("submit", str(first), env=env).returncode == 0
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "watch", "--interval", "0.5"],
                               env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        second = light_project(tmp_path / "b", {"tiny": light_config(steps=2, step_s=0.5)},
                               ["configs/tiny.yaml classify 1 name=second"])
        assert run_gpuq("submit", str(second), env=env).returncode == 0  # queued behind the first (one slot)
        out, _ = watcher.communicate(timeout=240)
    finally:
        watcher.kill()
    assert watcher.returncode == 0 and "watch: every sweep done" in out, out
    rows = _ledger_rows(gpuq_home, "select name, state from job")
    assert sorted(rows) == [("first", "SUCCEEDED"), ("second", "SUCCEEDED")], (rows, out)
