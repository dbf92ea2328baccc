"""``submit --into`` on the embedded local host with a stub trainer (no torch): a finished sweep grows by a new
cell and a new seed, runs them with the new part's bundle, and its one report compares them with the same
baseline; status and results say when the part joined; resubmitting adds nothing; a changed baseline is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq

pytestmark = [pytest.mark.integration]

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "4", "GPUQ_HEARTBEAT_S": "1"}
TRAIN = """\
import sys
lr = float(sys.argv[sys.argv.index("--lr") + 1])
with open("metrics.csv", "w") as fh:
    fh.write("step,val_loss\\n")
    for step in range(1, 4):
        fh.write(f"{step},{1.0 / (1.0 + step * lr * 100)}\\n")
"""
TOML = """[run]
command = "train.py {args}"
launcher = "python"
metrics = "metrics.csv"
metric = "val_loss"
mode = "min"
"""
FIRST = "name=baseline seeds=2 -- --lr 0.01\nname=fast seeds=2 -- --lr 0.02\n"
GROWN = "name=baseline seeds=2 -- --lr 0.01\nname=fast seeds=3 -- --lr 0.02\nname=faster seeds=2 -- --lr 0.04\n"


def _gpuq(*args: str, code: int = 0) -> str:
    done = run_gpuq(*args, env=ENV, timeout=120)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_finished_sweep_grows_by_a_cell_and_a_seed_against_the_same_baseline(gpuq_home: Path,
                                                                                tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "gpuq.toml").write_text(TOML)
    queue = project / "queue.txt"
    queue.write_text(FIRST)
    _gpuq("submit", str(queue), "--wait")
    sweep = _sweep_id(gpuq_home)

    queue.write_text(GROWN)
    grown = _gpuq("submit", str(queue), "--into", sweep[:5], "--wait")
    assert f"{queue}:1: baseline: 2 jobs already in sweep {sweep} (part 1): not new" in grown
    assert f"{queue}:2: fast: 2 jobs already in sweep {sweep} (part 1); 1 more join" in grown
    assert f"sweep {sweep}: part 2 joined: 3 jobs from {queue}" in grown

    ledger = Ledger(gpuq_home / "ledger.db")
    try:
        jobs = {j.name: j for j in ledger.jobs(sweep_id=sweep)}
        assert sorted(n for n, j in jobs.items() if j.part == 2) == ["fast-seed2", "faster-seed0", "faster-seed1"]
        assert all(j.state == "SUCCEEDED" for j in jobs.values()), {n: j.state for n, j in jobs.items()}
        parts = ledger.parts_of(sweep)
        assert [p.number for p in parts] == [1, 2] and parts[0].bundle_sha != parts[1].bundle_sha
        ran = {a.job_id: a.bundle_sha for a in ledger.attempts_of(j.id for j in jobs.values())}
        assert {ran[j.id] for j in jobs.values() if j.part == 2} == {parts[1].bundle_sha}  # its own bundle
        assert ledger.sweeps()[0].job_count == 7 and len(ledger.sweeps()) == 1
    finally:
        ledger.close()

    report = json.loads(_gpuq_out("report", "--format", "json"))
    cells = {c["cell"]: c for c in report["cells"]}
    assert report["baseline"] == "baseline" and cells["baseline"]["n_finished"] == 2
    assert (cells["fast"]["n_finished"], cells["faster"]["n_finished"]) == (3, 2)
    assert cells["faster"]["delta"] < cells["fast"]["delta"] < 0  # against the one baseline: lower loss is better
    assert any(n.startswith(f"sweep {sweep} joined: part 2, ") and n.endswith(": cells fast, faster")
               for n in report["notes"]), report["notes"]
    status = _gpuq("status", "--once", "--all")
    assert "joined: part 2, " in status and f"({queue}, 3 jobs)" in status
    results = _gpuq("results")
    assert "part" in results and "joined: part 2, " in results
    assert {j["name"]: j["part"] for j in json.loads(_gpuq_out("results", "--json"))["jobs"]}["faster-seed1"] == 2

    again = _gpuq("submit", str(queue), "--into", sweep)  # unchanged: nothing is new
    assert f"sweep {sweep}: nothing joined" in again
    queue.write_text(GROWN.replace("--lr 0.01", "--lr 0.015"))
    refused = _gpuq("submit", str(queue), "--into", sweep, code=2)
    assert f"{queue}:1: the baseline differs from sweep {sweep}'s (arguments)" in refused and "Traceback" not in refused
    ledger = Ledger(gpuq_home / "ledger.db")
    try:
        assert len(ledger.jobs()) == 7 and [p.number for p in ledger.parts_of(sweep)] == [1, 2]
    finally:
        ledger.close()


def _gpuq_out(*args: str) -> str:
    done = run_gpuq(*args, env=ENV, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _sweep_id(home: Path) -> str:
    ledger = Ledger(home / "ledger.db")
    try:
        return ledger.sweeps()[0].id
    finally:
        ledger.close()
