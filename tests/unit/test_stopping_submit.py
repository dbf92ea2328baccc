"""`submit --stop RULE` and gpuq.toml's [stop]: the dry run says what stopping will do, a bad table exits 2
with nothing written, and the sweep's policy is kept in the ledger (docs/stopping.md)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Ledger
from orchestrator.stopping.policy import StopPolicy
from tests.conftest import run_gpuq

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_LOCAL_PYTHON": "/usr/bin/python3"}
RUN = '[run]\ncommand = "train.py --name {name} {args}"\nlauncher = "python"\n'


def _project(tmp_path: Path, toml: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "gpuq.toml").write_text(RUN + toml)
    path = tmp_path / "queue.txt"
    path.write_text("name=base seeds=3 --\nname=wide seeds=3 -- --wide\n")
    return path


def test_the_dry_run_says_what_stopping_will_do(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, '[stop]\nrule = "baseline"\nalpha = 0.1\n')
    done = run_gpuq("submit", "--dry-run", str(queue), env=ENV)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("stop: ")]
    assert len(said) == 1 and "alpha=0.1" in said[0] and "never the baseline" in said[0]
    done = run_gpuq("submit", "--dry-run", "--stop", "halving", str(queue), env=ENV)
    assert "successive halving" in done.stdout
    done = run_gpuq("submit", "--dry-run", "--stop", "off", str(queue), env=ENV)
    assert done.returncode == 0 and not any(line.startswith("stop: ") for line in done.stdout.splitlines())


def test_a_bad_stop_table_exits_2_with_one_line_and_nothing_written(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, '[stop]\nrule = "baseline"\nmin_seeds = 1\n')
    done = run_gpuq("submit", str(queue), env=ENV)
    assert done.returncode == 2
    assert "gpuq.toml: [stop] min_seeds" in done.stderr and "Traceback" not in done.stderr
    db = gpuq_home / "ledger.db"
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM sweep").fetchone()[0] == 0


def test_the_sweep_keeps_its_policy(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    policy = StopPolicy(rule="baseline", margin=0.01)
    spec = JobSpec(name="a", config="", task="", epochs=0, gpus=1, line=1, raw="a")
    ledger.add_sweep(
        sweep_id="s1",
        queue_path="q",
        workdir="/w",
        queue_text="",
        jobs=[spec],
        default_retries=0,
        stop=policy.model_dump_json(),
    )
    sweep = ledger.sweep("s1")
    assert sweep is not None and StopPolicy.model_validate_json(sweep.stop) == policy
    ledger.add_sweep(sweep_id="s2", queue_path="q", workdir="/w", queue_text="", jobs=[spec], default_retries=0)
    off = ledger.sweep("s2")
    assert off is not None and off.stop == ""


def test_a_policy_without_its_baseline_cell_in_the_queue_is_said_to_stop_nothing(gpuq_home: Path,
                                                                                  tmp_path: Path) -> None:
    queue = _project(tmp_path, '[stop]\nrule = "baseline"\n')  # cells "base" and "wide": no "baseline"
    done = run_gpuq("submit", "--dry-run", str(queue), env=ENV)
    assert done.returncode == 0, done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "[stop] compares each cell with the cell 'baseline'" in said and "nothing will be stopped" in said, said
    (tmp_path / "gpuq.toml").write_text(RUN + '[stop]\nrule = "baseline"\nbaseline = "base"\n')
    done = run_gpuq("submit", "--dry-run", str(queue), env=ENV)
    assert done.returncode == 0 and "nothing will be stopped" not in done.stdout + done.stderr
    assert "(cell 'base')" in done.stdout


def test_the_direction_follows_the_headline_metric_unless_stop_says_otherwise(gpuq_home: Path,
                                                                                tmp_path: Path) -> None:
    """gpuq's payload maximises val_acc: a [stop] without a direction takes "max"; a [stop] direction
    against the headline's mode would stop the better cells, and submit says so."""
    from orchestrator import api

    queue = _project(tmp_path, '[stop]\nrule = "baseline"\nbaseline = "base"\n')
    ctx = api.open_context()
    try:
        found = api.submit(ctx, queue, dry_run=True)
    finally:
        ctx.close()
    assert found.stop is not None and found.stop.direction == "max"
    assert not any("[stop] direction" in w for w in found.warnings)
    (tmp_path / "gpuq.toml").write_text(RUN + '[stop]\nrule = "baseline"\nbaseline = "base"\ndirection = "min"\n')
    done = run_gpuq("submit", "--dry-run", str(queue), env=ENV)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0 and "[stop] direction = 'min', but the headline metric 'val_acc' is maximised" in said
