"""seeds=auto end to end (docs/stopping.md, "seeds=auto") on the embedded local host, with a stub trainer that
writes a known final val_acc per cell and seed (no torch): the dry run says what it will do, `submit --wait`
runs the first seeds, the tick adds seeds only to the cell whose verdict against the baseline stays ambiguous,
stops at its MAX, settles the sweep once saying why, and only then is the sweep announced done."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "9", "GPUQ_PATROL_MIN_INTERVAL_S": "0.2", "GPUQ_PATROL_INTERVAL_S": "0.2",
       "GPUQ_PATROL_IDLE_INTERVAL_S": "0.2", "GPUQ_PREFLIGHT": "false"}
FINALS = {"baseline": [0.90, 0.91, 0.89, 0.90], "worse": [0.50, 0.51, 0.49, 0.50], "unclear": [0.88, 0.93, 0.90, 0.86]}
TRAIN = f'''\
import os, sys
value = {FINALS!r}[sys.argv[1]][int(os.environ["GPUQ_SEED"])]
with open("metrics.csv", "w") as fh:
    fh.write(f"step,val_acc\\n1,{{value}}\\n")
'''
TOML = ('[run]\ncommand = "train.py {args}"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'
        'mode = "max"\n')


def _project(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    queue = work / "queue.txt"
    queue.write_text("".join(f"name={cell} seeds=auto:3..4 -- {cell}\n" for cell in FINALS))
    return queue


def test_seeds_go_only_to_the_ambiguous_cell_and_stop_at_its_max(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path)
    dry = run_gpuq("submit", "--dry-run", str(queue), env=ENV, timeout=60)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "seeds=auto: baseline 3..4, unclear 3..4, worse 3..4 seeds; once every job has ended" in dry.stdout

    done = run_gpuq("submit", str(queue), "--wait", env=ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    try:
        jobs = conn.execute("SELECT name, state, seed, seeds_max FROM job ORDER BY name").fetchall()
        (sweep,) = conn.execute("SELECT id FROM sweep").fetchone()
        findings = conn.execute("SELECT rule, message FROM event WHERE subject = ? AND rule IN "
                                "('seeds_auto', 'sweep_done') ORDER BY id", (sweep,)).fetchall()
        values = dict(conn.execute("SELECT job.name, metric.value FROM metric JOIN job ON job.id = metric.job_id "
                                   "WHERE metric.scope = 'final' AND metric.name = 'val_acc'").fetchall())
    finally:
        conn.close()
    names = [n for n, *_ in jobs]
    assert names == sorted([f"baseline-seed{k}" for k in range(3)] + [f"worse-seed{k}" for k in range(3)]
                           + [f"unclear-seed{k}" for k in range(4)]), names
    assert {(s, m) for _, s, _, m in jobs} == {("SUCCEEDED", 4)}
    assert all(seed == int(name.rsplit("seed", 1)[1]) for name, _, seed, _ in jobs)
    assert values["unclear-seed3"] == FINALS["unclear"][3]  # the added seed ran with GPUQ_SEED=3
    assert [rule for rule, _ in findings] == ["seeds_auto", "sweep_done"], findings  # settled once, then done
    assert findings[0][1] == "seeds=auto is done: clear: worse; still ambiguous at their most seeds: unclear"
