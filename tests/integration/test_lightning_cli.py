"""examples/lightning_cli run end to end on the local host, as a new user would (issue 29): a LightningCLI
app (CSVLogger, ModelCheckpoint(save_last=True), `fit --ckpt_path {checkpoint}`), seeds through `{seed}` in
the line's own arguments, one job kill -9'd mid-run and resumed from its own last.ckpt, results and pull.

One cell with seeds=2 (2 jobs, 3 short epochs of in-memory data): Lightning's import is seconds of CPU.

Which assertions need which work (docs/your-project.md, "PyTorch Lightning"):
- the seeds, the kill, the resume from version_0's last.ckpt into version_1: this branch (h29c);
- the final metric from the newest version_N (the `metrics` glob): the metrics-glob work (h29b);
- the `epoch=N-step=M.ckpt` files coming home verified: the pulled-names work (h29a).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq, wait_for
from tests.support.ownproject import copy_example

pytestmark = [pytest.mark.integration, pytest.mark.honest]
pytest.importorskip("lightning.pytorch", reason="the example's trainer needs lightning")
pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse[signatures] (examples/lightning_cli/"
                    "requirements.txt; the setup hook installs it on a host with network)")

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1", "GPUQ_PATROL_INTERVAL_S": "1",
       "GPUQ_PATROL_MIN_INTERVAL_S": "0.5"}
EPOCHS = 3
LINE = (f"name=lit seeds=2 retries=1 -- fit --config config.yaml --seed_everything {{seed}} --model.lr=0.05 "
        f"--trainer.max_epochs={EPOCHS} --model.epoch_sleep=1\n")


def _val_losses(path: Path) -> list[tuple[int, float]]:
    rows = csv.DictReader(path.read_text().splitlines()) if path.is_file() else []
    return [(int(r["epoch"]), float(r["val_loss"])) for r in rows if r.get("val_loss")]


def test_lightning_cli_grid_with_seeds_kill_and_resume(gpuq_home: Path, tmp_path: Path) -> None:
    queue = copy_example("lightning_cli", tmp_path, queue=LINE)
    dry = run_gpuq("submit", "--dry-run", "--json", str(queue), env=ENV)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    argv = {j["name"]: j["argv"] for j in json.loads(dry.stdout)["jobs"]}
    assert sorted(argv) == ["lit-seed0", "lit-seed1"]
    for name, words in argv.items():
        assert words[words.index("--seed_everything") + 1] == name[-1]  # {seed} rendered, as the host will

    submitted = run_gpuq("submit", str(queue), "--host", "local", env=ENV, timeout=600)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    root = gpuq_home / "local"
    ids = {j["name"]: j["id"] for j in json.loads(run_gpuq("status", "--json", env=ENV).stdout)["jobs"]}
    victim = root / "jobs" / ids["lit-seed1"]
    first_log = victim / "attempts" / "1" / "job.log"

    last = victim / "run" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    sizes: list[int] = []

    def after_first_checkpoint() -> bool:
        """Epoch 1 ended (the module's hook printed) and ModelCheckpoint saved after it: Lightning runs the
        monitoring callbacks' on_train_epoch_end after the module's, so the line comes first; last.ckpt is
        there, its size the same at two looks."""
        if not (first_log.is_file() and "epoch 1/3 rank 0" in first_log.read_text(errors="replace")):
            return False
        sizes.append(last.stat().st_size if last.is_file() else 0)
        return len(sizes) >= 2 and sizes[-1] == sizes[-2] > 0

    assert wait_for(after_first_checkpoint, timeout=400, interval=0.3)
    pid = int(re.findall(r"epoch 1/3 rank 0 pid (\d+)", first_log.read_text())[0])
    os.kill(pid, signal.SIGKILL)
    waited = run_gpuq("wait", "--timeout", "600", env=ENV, timeout=700)
    assert waited.returncode == 0, waited.stdout + waited.stderr

    ledger = Ledger(gpuq_home / "ledger.db")
    try:
        jobs = {j.name: j for j in ledger.jobs()}
        events = [e.message for e in ledger.events(subject=ids["lit-seed1"], limit=200)]
    finally:
        ledger.close()
    assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, (jobs, events)
    assert jobs["lit-seed1"].attempt_count == 2 and jobs["lit-seed0"].attempt_count == 1, events
    assert any("killed: requeued with resume" in m for m in events), events

    # each job ran with its own seed (Lightning's own record of its config)
    for name, job_id in ids.items():
        saved = (root / "jobs" / job_id / "run" / "lightning_logs" / "version_0" / "config.yaml").read_text()
        assert f"seed_everything: {name[-1]}\n" in saved, saved
    # attempt 2 resumed from the job's own last.ckpt and logged to the next version
    second_log = (victim / "attempts" / "2" / "job.log").read_text(errors="replace")
    own = victim / "run" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    header = next(line for line in second_log.splitlines() if line.startswith("=== gpuq "))  # the argv it ran
    assert f"--ckpt_path {own}" in header or f"--ckpt_path '{own}'" in header, header
    assert "gpuq: resuming from checkpoint lightning_logs/version_0/checkpoints/last.ckpt" in second_log
    assert "Restored all states from the checkpoint" in second_log, second_log[-3000:]
    before = _val_losses(victim / "run" / "lightning_logs" / "version_0" / "metrics.csv")
    after = _val_losses(victim / "run" / "lightning_logs" / "version_1" / "metrics.csv")
    assert before and after and after[0][0] > 0 and after[-1][0] == EPOCHS - 1, (before, after)

    # the final metric is Lightning's last val_loss, from the newest version_N (needs the metrics glob, h29b)
    results = run_gpuq("results", "--json", env=ENV)
    assert results.returncode == 0, results.stderr
    final = {j["name"]: j["final"].get("val_loss") for j in json.loads(results.stdout)["jobs"]}
    assert final["lit-seed1"] == pytest.approx(after[-1][1]), (final, after)
    seed0 = _val_losses(root / "jobs" / ids["lit-seed0"] / "run" / "lightning_logs" / "version_0" / "metrics.csv")
    assert final["lit-seed0"] == pytest.approx(seed0[-1][1]), (final, seed0)

    # the pull brings Lightning's own checkpoint names home, verified (needs names with "=", h29a)
    pulled = run_gpuq("pull", "--json", env=ENV)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    for job_id in ids.values():
        home = next((gpuq_home / "results").glob(f"*/{job_id}"))
        on_host = sorted(p.relative_to(root / "jobs" / job_id).as_posix()
                         for p in (root / "jobs" / job_id / "run" / "lightning_logs").rglob("*.ckpt"))
        assert any("epoch=" in p for p in on_host), on_host
        assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*.ckpt")) == on_host
