"""Metrics that follow the trainer, end to end on the local host with real processes (issue 29
items 1 and 5, issue 26 item 4).  A small handwritten trainer keeps Lightning's conventions: every
start logs to the next ``lightning_logs/version_N/metrics.csv`` (CSVLogger's header and gapped rows)
and saves ``version_N/checkpoints/last.ckpt``; a resume passes ``--ckpt_path``.  Three jobs:

- ``resume``: attempt 1 dies by SIGKILL after logging epoch 4 (its checkpoint is epoch 3's); attempt 2
  resumes into version_1 and trains epoch 4 again with other numbers.  results and the curve must be
  one series: epochs 0..3 of version_0, 4..5 of version_1, one point per step.
- ``quiet``: writes nothing to its log while it trains (as Lightning under a Rich bar) and no
  checkpoint, only metrics rows, for longer than the stall timeout: alive, never killed.
- ``nowhere``: logs to ``logs/`` which the glob does not match: a warning naming the setting, and the
  report names the setting, not the metric.

``gpuq pull`` brings home every file the glob matched."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_gpuq

pytestmark = [pytest.mark.integration, pytest.mark.honest]

TRAINER = textwrap.dedent("""
    import argparse, csv, json, os, signal, time
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt_path", default="")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--kill_after", type=int, default=-1)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--root", default="lightning_logs")
    p.add_argument("--no_ckpt", action="store_true")
    p.add_argument("--epoch_s", type=float, default=0.3)
    a = p.parse_args()
    attempt = int(os.environ["GPUQ_ATTEMPT"])
    start = 0
    if a.ckpt_path:
        with open(a.ckpt_path) as f:
            start = json.load(f)["epoch"] + 1
        print("Restoring states from the checkpoint path at " + a.ckpt_path, flush=True)
    os.makedirs(a.root, exist_ok=True)
    vdir = os.path.join(a.root, "version_%d" % len([d for d in os.listdir(a.root) if d.startswith("version_")]))
    os.makedirs(os.path.join(vdir, "checkpoints"))
    with open(os.path.join(vdir, "metrics.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "step", "train_loss", "val_loss"])
        f.flush()
        for e in range(start, a.epochs):
            time.sleep(a.epoch_s)
            step, val = (e + 1) * 10 - 1, round(1.0 / (e + 1) + 0.1 * attempt, 4)
            w.writerow([e, step, round(2.0 / (e + 1), 4), ""])
            w.writerow([e, step, "", val])
            f.flush()
            if not a.quiet:
                print("Epoch %d: val_loss=%s" % (e, val), flush=True)
            if attempt == 1 and e == a.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if not a.no_ckpt:
                tmp = os.path.join(vdir, "checkpoints", "last.ckpt.tmp")
                with open(tmp, "w") as c:
                    json.dump({"epoch": e}, c)
                os.replace(tmp, os.path.join(vdir, "checkpoints", "last.ckpt"))
    print("fit done", flush=True)
""")

TOML = """\
[run]
command = "train.py {args}"
launcher = "python"
checkpoint = "lightning_logs/version_*/checkpoints/last.ckpt"
resume_args = "--ckpt_path {checkpoint}"
metrics = "lightning_logs/version_*/metrics.csv"
metric = "val_loss"
mode = "min"
"""

QUEUE = """\
name=resume -- --epochs 6 --kill_after 4
name=quiet -- --epochs 9 --epoch_s 1.0 --quiet --no_ckpt
name=nowhere -- --epochs 2 --root logs
"""

# stall after 5 s of silence: the quiet job trains 9 s without a log line or a checkpoint
ENV = {"GPUQ_LOCAL_CPU_SLOTS": "3", "GPUQ_HEARTBEAT_S": "1", "GPUQ_STALL_AFTER_S": "5",
       "GPUQ_STARTUP_GRACE_S": "2"}


def test_metrics_glob_resume_liveness_and_a_setting_that_matched_nothing(gpuq_home: Path, tmp_path: Path) -> None:
    project = tmp_path / "lit"
    project.mkdir()
    (project / "train.py").write_text(TRAINER)
    (project / "gpuq.toml").write_text(TOML)
    (project / "queue.txt").write_text(QUEUE)
    done = run_gpuq("submit", str(project / "queue.txt"), "--host", "local", "--wait", env=ENV, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(run_gpuq("status", "--json", env=ENV).stdout)
    jobs = {j["name"]: j for j in status["jobs"]}
    assert {n: j["state"] for n, j in jobs.items()} == {"resume": "SUCCEEDED", "quiet": "SUCCEEDED",
                                                        "nowhere": "SUCCEEDED"}, status["jobs"]
    run_dir = gpuq_home / "local" / "jobs" / jobs["resume"]["id"] / "run"
    assert (run_dir / "lightning_logs" / "version_1" / "metrics.csv").is_file()  # attempt 2 logged elsewhere

    # results: the last value the trainer logged (version_1's epoch 5 of attempt 2), not version_0's
    results = json.loads(run_gpuq("results", "--json", env=ENV).stdout)
    by_name = {j["name"]: j for j in results["jobs"]}
    assert by_name["resume"]["attempts"] == 2
    assert by_name["resume"]["final"]["val_loss"] == pytest.approx(round(1.0 / 6 + 0.2, 4))
    assert by_name["quiet"]["attempts"] == 1  # never killed as stalled
    assert by_name["nowhere"]["final"] == {} and "matched no file" in by_name["nowhere"]["error"]

    conn = sqlite3.connect(gpuq_home / "ledger.db")
    curve = conn.execute("SELECT step, value FROM metric WHERE job_id = ? AND scope = 'curve' AND name = 'val_loss' "
                         "ORDER BY step", (jobs["resume"]["id"],)).fetchall()
    expected = {(e + 1) * 10 - 1: round(1.0 / (e + 1) + 0.1 * (1 if e < 4 else 2), 4) for e in range(6)}
    assert [s for s, _ in curve] == sorted(expected) and dict(curve) == pytest.approx(expected), curve
    rules = [r for (r,) in conn.execute("SELECT rule FROM event WHERE subject = ?", (jobs["quiet"]["id"],))]
    assert "stalled" not in rules, rules
    (warning,) = conn.execute("SELECT severity, message FROM event WHERE subject = ? AND rule = 'metrics_missing'",
                              (jobs["nowhere"]["id"],)).fetchall()
    assert warning[0] == "warn" and "lightning_logs/version_*/metrics.csv" in warning[1], warning

    pulled = run_gpuq("pull", env=ENV)  # every file the glob matched comes home with the job
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    home = sorted((gpuq_home / "results").glob(f"*/{jobs['resume']['id']}/run/lightning_logs/version_*/metrics.csv"))
    assert [p.parent.name for p in home] == ["version_0", "version_1"], home

    report = run_gpuq("report", "--format", "json", env=ENV)
    assert report.returncode == 0, report.stderr
    notes = json.loads(report.stdout)["notes"]
    assert any("matched no file" in n and "lightning_logs/version_*/metrics.csv" in n for n in notes), notes
