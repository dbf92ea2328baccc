"""Lightning's progress as a newcomer reads it (issue 39): its Rich bar numbers epochs from 0
("Epoch 2/2" is the third of 3: ``f"Epoch {current_epoch}/{max_epochs - 1}"``) and counts one epoch's
batches, so the last epoch must not show ``100% ep 2/2`` while it runs; and its loss column shows
``train_loss`` from the CSVLogger's metrics.csv (newest ``version_N``) when the bar shows no loss."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.cli.jobstable import progress_cell
from orchestrator.ledger import Attempt, Job
from orchestrator.views import JobView
from tests.support.agentmodule import load_agent_module

OB = load_agent_module("gpuq_records.gpuq_observe")
ST = load_agent_module("gpuq_verbs.gpuq_status")
JOBSPEC = load_agent_module("gpuq_base.gpuq_jobspec")

BAR = "\u2501" * 10 + "\u2578" + "\u2501" * 9  # ━━━━━━━━━━╸━━━━━━━━━
# what Lightning's RichProgressBar leaves in a log (TTY_COMPATIBLE=1): colour codes, redraws after \r
LOG = ("epoch 2/3 rank 0 pid 41\r\n"
       "Epoch 1/2 \x1b[35m" + BAR + "\x1b[0m 8/8 0:00:01 \u2022 0:00:00 7.10it/s v_num: 0\r\n"
       "Epoch 2/2 \x1b[35m" + BAR + "\x1b[0m 4/8 0:00:00 \u2022 0:00:01 7.10it/s v_num: 0\r\n"
       "Validation DataLoader 0 \x1b[35m" + BAR + "\x1b[0m 1/2 0:00:00\r\n")


def _cell(progress: dict[str, Any]) -> str:
    """The dashboard's progress cell for the attempt fields the tick records from this progress."""
    step, total, epoch, epochs = (int(progress[k]) for k in ("step", "total", "epoch", "epochs"))
    att = Attempt(job_id="c1", number=1, host="local", state="RUNNING", bundle_sha="b" * 64, created_at=0.0,
                  step=step, total_steps=total, epoch=epoch)
    job = Job(id="c1", sweep_id="q1", name="lit", line=1, raw="", config="", config_sha256="0" * 64, task="",
              epochs=0, gpus=1, nodes=1, retries=1, spec_hash="h", state="RUNNING", host="local", created_at=0.0,
              updated_at=0.0)  # epochs 0: the line gave none (Lightning's bar tells)
    view = JobView(job=job, attempt=att, host_gpus=[], fraction=step / total, eta_s=None, heartbeat_age_s=None,
                   cost=None, epochs=epochs)
    console = Console(width=120, record=True)
    console.print(progress_cell(view, 0))
    return console.export_text().strip()


def test_the_last_epoch_of_lightnings_zero_based_bar_is_not_shown_done() -> None:
    p = OB.parse_progress(LOG)
    assert (p["epoch"], p["epochs"]) == (3, 3)  # the third of 3 epochs, 1-based as gpuq's contract has it
    assert (p["step"], p["total"]) == (2 * 8 + 4, 3 * 8)  # the run's steps, not the epoch's batches
    assert p["pct"] == 83.3
    assert _cell(p) == "83% ep 3/3"
    ended_epoch = OB.parse_progress(LOG.split("Epoch 2/2")[0])  # "Epoch 1/2 ... 8/8": two of three done
    assert ended_epoch["pct"] == 66.7 and _cell(ended_epoch) == "67% ep 2/3"


def test_the_loss_comes_from_metrics_csv_when_the_bar_shows_none(tmp_path: Path) -> None:
    jdir = tmp_path / "jobs" / "c1"
    for n, start in ((1, 1000.0), (2, 2000.0)):
        (jdir / "attempts" / str(n)).mkdir(parents=True)
        (jdir / "attempts" / str(n) / "launch.json").write_text(f'{{"time": {start}}}')
    old = jdir / "run" / "lightning_logs" / "version_0" / "metrics.csv"  # the first start of fit
    new = jdir / "run" / "lightning_logs" / "version_1" / "metrics.csv"  # the resumed one
    for path, rows, mtime in ((old, "0,7,0.91,\n0,7,,0.80\n", 1500.0), (new, "1,15,0.52,\n1,15,,0.47\n", 2500.0)):
        path.parent.mkdir(parents=True)
        path.write_text("epoch,step,train_loss,val_loss\n" + rows)
        os.utime(path, (mtime, mtime))
    entry = {"progress": OB.parse_progress(LOG), "run_metrics_mtime": None}
    assert entry["progress"]["loss"] is None  # the bar shows v_num only
    run = JOBSPEC.parse_run({"metrics": "lightning_logs/version_*/metrics.csv"})
    ST.observe_metrics(entry, str(jdir), run, 2)
    p = entry["progress"]
    assert p["loss"] == 0.52  # train_loss of the newest version_N
    assert (p["step"], p["epoch"], p["source"]) == (20, 3, "lightning")  # the log's progress stays
