"""No invented numbers, honest seeds and provenance, on the embedded local host (docs/results.md,
docs/report.md): a project of its own whose trainer takes no epochs and ignores its seed, run as
`seeds=2` cells.  One sweep of four tiny jobs serves every check."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

import pytest

from orchestrator.report import trust
from tests.conftest import run_gpuq

pytestmark = [pytest.mark.integration, pytest.mark.honest]

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "4", "GPUQ_HEARTBEAT_S": "1"}
HOLD_S = 4  # the trainer waits at step 4 longer than a probe interval (2 s), then prints step 5 and exits

TRAIN = f"""\
import sys, time
lr = float(sys.argv[sys.argv.index("--lr") + 1])  # no --epochs, no --seed: it seeds nothing
with open("metrics.csv", "w") as fh:
    fh.write("step,val_loss\\n")
    for step in range(1, 6):
        if step == 5:
            time.sleep({HOLD_S})
        loss = 1.0 / (1.0 + step * lr * 100)
        print(f"step {{step}} loss {{loss:.6f}}", flush=True)
        fh.write(f"{{step}},{{loss}}\\n")
        fh.flush()
        time.sleep(0.2 if step < 5 else 0)
"""
TOML = """[run]
command = "train.py {args}"
launcher = "python"
metrics = "metrics.csv"
metric = "val_loss"
mode = "min"
"""
QUEUE = "name=baseline seeds=2 -- --lr 0.01\nname=fast seeds=2 -- --lr 0.02\n"


def _git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                           *args], capture_output=True, text=True, check=True).stdout.strip()


def _json(*args: str) -> dict:
    done = run_gpuq(*args, "--json", env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_project_without_epochs_or_seed_shows_no_invented_number(gpuq_home: Path, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "gpuq.toml").write_text(TOML)
    queue = project / "queue.txt"
    queue.write_text(QUEUE)
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "start")
    head = _git(project, "rev-parse", "HEAD")
    (project / "notes.txt").write_text("an uncommitted file ships in the bundle\n")

    dry = run_gpuq("submit", "--dry-run", str(queue), env=ENV)
    assert dry.returncode == 0, dry.stderr
    assert "baseline-seed0, baseline-seed1 differ only by their seed" in dry.stderr
    assert "must read GPUQ_SEED" in dry.stderr  # a warning: stderr
    header, *rows = [ln.split() for ln in dry.stdout.splitlines() if ln.split()[:1] in (["name"], ["baseline-seed0"])]
    assert rows and rows[0][header.index("epochs")] == "-"  # not 20
    assert "makespan unknown" in dry.stdout
    assert all(j["epochs"] is None and j["est_s"] is None for j in _json("submit", "--dry-run", str(queue))["jobs"])

    done = run_gpuq("submit", str(queue), "--wait", env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "makespan unknown" in done.stdout and "projected makespan" not in done.stdout
    assert "must read GPUQ_SEED" in done.stderr

    status = _json("status", "--all")
    assert {j["state"] for j in status["jobs"]} == {"SUCCEEDED"}
    assert all(j["epochs"] is None for j in status["jobs"])
    # a finished job's progress and loss are its last ones: step 5, printed after every probe of it running
    assert {(j["step"], round(j["loss"], 6)) for j in status["jobs"]} == {(5, round(1 / (1 + 5 * 1.0), 6)),
                                                                         (5, round(1 / (1 + 5 * 2.0), 6))}
    table = run_gpuq("status", "--all", env={**ENV, "COLUMNS": "250"}).stdout
    assert "step 5" in table and "/20" not in table and "ep ?" not in table

    results = _json("results")
    jobs = results["jobs"]
    assert all(j["epochs"] is None for j in jobs)
    assert all(j["gpu_hours"] == 0 and j["cpu_hours"] > 0 for j in jobs)  # CPU slots: CPU-hours
    ran = jobs[0]["ran_with"]
    assert ran["slot_kind"] == "cpu" and ran["gpu_count"] == 0 and ran["gpu_model"] is None
    assert ran["python"] == platform.python_version()
    assert ran["torch"] == importlib.metadata.version("torch")
    assert all(j["git_commit"] == head and j["git_dirty"] is True for j in jobs)
    text = run_gpuq("results", env={**ENV, "COLUMNS": "250"}).stdout
    assert "CPU-h" in text and "GPU-h" not in text
    shown = _json("hosts", "show", "local")["ran_with"]
    assert shown["python"] == platform.python_version() and shown["slot_kind"] == "cpu"

    report = _json_report()
    cells = {c["cell"]: c for c in report["cells"]}
    assert set(cells) == {"baseline", "fast"}
    assert all(trust.IDENTICAL in c["flags"] for c in cells.values()), cells
    fast = cells["fast"]
    assert fast["verdict"] == "seeds identical" and fast["p_value"] is None and fast["delta_ci_low"] is None
    assert fast["ci_low"] is None and fast["delta"] is not None  # the difference is shown, no certainty
    assert report["sweeps"][0]["git_commit"] == head and report["cpu_hours"] > 0


def _json_report() -> dict:
    done = run_gpuq("report", "--format", "json", env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)
