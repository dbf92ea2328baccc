"""Liveness and progress from what a trainer writes (issue 29 items 5 and 8): its metrics files are
signs of life for the stall rule and its progress when the log has none; a Rich progress bar (as
Lightning draws it) writes into the job's log as it goes; gpuq's own log lines are never the
trainer's last line; ``early_finish`` compares a job with its own cell only; and the dry run says
how a metrics glob will be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health.patrol import JobView, Thresholds
from orchestrator.tick.findings import TickReport, early_finishes
from tests.conftest import run_gpuq
from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc
from tests.support.wire import patrol

pytestmark = pytest.mark.honest  # no silent wrong answer (docs/testing.md)

OB = load_agent_module("gpuq_records.gpuq_observe")
ST = load_agent_module("gpuq_verbs.gpuq_status")
LAUNCH = load_agent_module("gpuq_attempt.gpuq_launch")
FILES = load_agent_module("gpuq_base.gpuq_files")
JOBSPEC = load_agent_module("gpuq_base.gpuq_jobspec")

TH = Thresholds(stall_after_s=900, startup_grace_s=600)
NOW = 1_800_000_000.0
JOB = JobView("c000000000001", "lightning", 1, launched_at=NOW - 3600)
HEADER = ("=== gpuq c000000000001 a1 lr-seed0 start 2026-11-26T16:00:00Z cwd /r/jobs/c000000000001/run argv: "
          "/usr/bin/python3 main.py fit --config config.yaml --trainer.max_epochs 20 --epoch 3 ===")


def test_a_growing_metrics_file_keeps_a_quiet_trainer_alive() -> None:
    # Lightning under Rich: nothing in the log since the start, no checkpoint yet, metrics.csv written 30 s ago
    quiet = {"state": "running", "heartbeat": None, "heartbeat_age_s": None, "log_mtime": NOW - 2000, "ckpt": None,
             "progress": None}
    assert patrol.job_findings("h", JOB, dict(quiet, run_metrics_mtime=NOW - 30), NOW, TH) == []
    (found,) = patrol.job_findings("h", JOB, dict(quiet, run_metrics_mtime=NOW - 1800), NOW, TH)
    assert found.rule == "stalled"


def test_gpuqs_own_lines_are_never_the_trainers_last_line_nor_its_progress() -> None:
    assert OB.parse_progress(HEADER + "\n") is None  # the trainer has printed nothing yet
    got = OB.parse_progress("Sanity Checking DataLoader 0\n" + HEADER + "\ngpuq: the bundle is read-only by mode "
                            "bits only (not root)\n")
    assert got["line"] == "Sanity Checking DataLoader 0" and got["epoch"] is None  # not the header's --epoch 3


def test_progress_comes_from_the_metrics_rows_when_the_log_has_none(tmp_path: Path) -> None:
    jdir = tmp_path / "jobs" / "c1"
    (jdir / "attempts" / "1").mkdir(parents=True)
    (jdir / "attempts" / "1" / "launch.json").write_text(json.dumps({"time": 1000.0}))
    csv = jdir / "run" / "lightning_logs" / "version_0" / "metrics.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("epoch,step,train_loss,val_loss\n0,49,0.91,\n0,49,,0.80\n1,99,0.52,\n")
    os.utime(csv, (1500.0, 1500.0))
    entry = {"progress": OB.parse_progress(HEADER + "\n"), "run_metrics_mtime": None}
    run = JOBSPEC.parse_run({"metrics": "lightning_logs/version_*/metrics.csv"})
    ST.observe_metrics(entry, str(jdir), run, 1)
    assert entry["run_metrics_mtime"] == 1500.0
    p = entry["progress"]
    assert (p["step"], p["epoch"], p["loss"], p["source"]) == (99, 1, 0.52, "metrics")
    shown = {"progress": {"step": 7, "epoch": None, "loss": None, "line": "step 7", "source": "pattern"}}
    ST.observe_metrics(shown, str(jdir), run, 1)
    assert shown["progress"]["step"] == 7 and shown["run_metrics_mtime"] == 1500.0  # the log's own progress stays


RICH_TRAINER = textwrap.dedent("""
    import os, sys, time
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    log = sys.argv[1]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()) as bar:
        task = bar.add_task("Epoch 2/9", total=40)
        for i in range(40):
            bar.update(task, advance=1)
            bar.refresh()
            time.sleep(0.01)
            if i == 20:
                with open(log + ".mid", "w") as f:
                    f.write(str(os.path.getsize(log)))
""")


def test_a_rich_progress_bar_writes_into_the_log_as_it_goes(tmp_path: Path) -> None:
    """A real process drawing a Rich bar (Lightning's default when rich is installed) with the
    environment the wrapper gives a job: the log has progress while the bar runs, not only at its end."""
    pytest.importorskip("rich")
    lay = FILES.Layout(str(tmp_path / "root"))
    env = LAUNCH.build_env(lay, "c1", 1, JOBSPEC.parse_spec(spec_doc(bundle_sha="s", name="lr", env={})),
                           {"kind": "cpu", "slots": []})
    assert env["TTY_COMPATIBLE"] == "1"
    script = tmp_path / "trainer.py"
    script.write_text(RICH_TRAINER)
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, str(script), str(log)], stdout=out, stderr=subprocess.STDOUT,
                              env={"PATH": os.environ.get("PATH", ""), "TERM": "", **env}, timeout=120, check=False)
    assert done.returncode == 0, log.read_text()
    assert int(Path(str(log) + ".mid").read_text()) > 0  # the log grew while the bar ran
    mid = log.read_bytes()[: int(Path(str(log) + ".mid").read_text())].decode("utf-8", "replace")
    p = OB.parse_progress(mid)
    # Lightning's 0-based "Epoch 2/9" is the third of 10 epochs of 40 batches (test_lightning_progress.py)
    assert p is not None and p["epoch"] == 3 and p["epochs"] == 10 and p["total"] == 400, p
    assert 80 < p["step"] <= 80 + 21, p


# --- early_finish: the job's own cell ---------------------------------------------------------


@pytest.fixture
def ctx(gpuq_home: Path) -> api.Context:
    return api.open_context()


def _finished(ctx: api.Context, tmp_path: Path, seconds: dict[str, float]) -> dict[str, str]:
    """A grid sweep (``name=lr seeds=2 -- --lr {0.01,0.1}``) whose named jobs succeeded in the given times."""
    specs = []
    for i, name in enumerate(["lr-lr0.01-seed0", "lr-lr0.01-seed1", "lr-lr0.1-seed0", "lr-lr0.1-seed1"]):
        lr = name.split("-")[1][2:]
        specs.append(JobSpec(name=name, config="", config_sha256="0" * 64, task="", epochs=20, line=1, raw="x",
                             seed=i % 2, cell="lr", args=("--lr", lr)))
    rows = ctx.ledger.add_sweep(sweep_id="qcells1", queue_path=str(tmp_path / "q.txt"), workdir=str(tmp_path),
                                queue_text="", jobs=specs, default_retries=0)
    ids = {r.name: r.id for r in rows}
    for name, secs in seconds.items():
        ctx.ledger.start_attempt(ids[name], host="local", bundle_sha="s")
        ctx.ledger.transition(ids[name], AttemptState.EXITED, attempt=1)
        ctx.ledger.transition(ids[name], JobState.SUCCEEDED)
        ctx.ledger.update_attempt(ids[name], 1, started_at=1000.0, ended_at=1000.0 + secs, exit_code=0)
    return ids


def _early(ctx: api.Context, job_id: str) -> list[str]:
    report = TickReport()
    early_finishes(ctx, "local", [job_id], report)
    return [f.message for f in report.findings if f.rule == "early_finish"]


def test_early_finish_compares_a_job_with_its_own_cell_only(ctx: api.Context, tmp_path: Path) -> None:
    ids = _finished(ctx, tmp_path, {"lr-lr0.01-seed0": 30.0, "lr-lr0.01-seed1": 31.0, "lr-lr0.1-seed0": 10.0})
    assert _early(ctx, ids["lr-lr0.1-seed0"]) == []  # the other cell's 30 s says nothing of this one
    ctx.ledger.start_attempt(ids["lr-lr0.1-seed1"], host="local", bundle_sha="s")
    ctx.ledger.transition(ids["lr-lr0.1-seed1"], AttemptState.EXITED, attempt=1)
    ctx.ledger.transition(ids["lr-lr0.1-seed1"], JobState.SUCCEEDED)
    ctx.ledger.update_attempt(ids["lr-lr0.1-seed1"], 1, started_at=1000.0, ended_at=1003.0, exit_code=0)
    (found,) = _early(ctx, ids["lr-lr0.1-seed1"])  # its own cell's seed took 10 s
    assert "succeeded in 3s" in found and "expected 10s" in found, found


def test_the_dry_run_says_how_a_metrics_glob_is_read(gpuq_home: Path, tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "gpuq.toml").write_text('[run]\ncommand = "main.py {args}"\nlauncher = "python"\n'
                                        'metrics = "lightning_logs/version_*/metrics.csv"\nmetric = "val_loss"\n'
                                        'mode = "min"\n')
    (tmp_path / "queue.txt").write_text("name=lr -- --lr {0.01,0.1}\n")
    env = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_LOCAL_PYTHON": "/usr/bin/python3"}
    done = run_gpuq("submit", "--dry-run", str(tmp_path / "queue.txt"), env=env)
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("metrics: ")]
    assert "glob 'lightning_logs/version_*/metrics.csv'" in line and "merged by step" in line and "val_loss" in line
    doc = json.loads(run_gpuq("submit", "--dry-run", "--json", str(tmp_path / "queue.txt"), env=env).stdout)
    assert doc["metrics"] == line[len("metrics: "):]
