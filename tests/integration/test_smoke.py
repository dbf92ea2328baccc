"""``gpuq submit --smoke`` (docs/your-project.md): every distinct cell runs briefly on this machine through
the real wrapper (start, metrics, checkpoint, stop, resume) and nothing is recorded.  Passes on the three
examples: examples/ddp_snapshot, examples/hydra_csv and the payload's example (one cell each), fails
clearly on a payload config with a bad key and on a trainer that ignores its checkpoint.  hydra_csv's setup
hook (`pip install -r requirements.txt`) finds Hydra installed (pyproject's `examples` extra) and stays
offline: a no-op, not the install a fresh machine would spend its CPU on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_gpuq
from tests.support.ownproject import copy_example

pytestmark = pytest.mark.integration

ENV = {"GPUQ_KILL_GRACE_S": "2"}

TRAINER = """import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("words")  # the [data] file, synced into the smoke root as onto a host
p.add_argument("epochs", type=int)
p.add_argument("--resume", default="")
p.add_argument("--sleep", type=float, default=2.0)
a = p.parse_args()
assert open(a.words).read() == "hello" and a.words == os.environ["GPUQ_DATA_WORDS"]
start = 0
if a.resume and {honour}:
    start = json.load(open(a.resume))["epoch"]
    print("resumed from", a.resume, "at epoch", start, flush=True)
new = not os.path.exists("metrics.csv")
for epoch in range(start, a.epochs):
    time.sleep(a.sleep)
    with open("metrics.csv", "a") as f:
        f.write(("epoch,loss\\n" if new else "") + "%d,%f\\n" % (epoch + 1, 1.0 / (epoch + 1)))
    new = False
    with open("ckpt.json.tmp", "w") as f:
        json.dump({{"epoch": epoch + 1}}, f)
    os.replace("ckpt.json.tmp", "ckpt.json")
"""

TOML = """[data]
words = "words.txt"
[run]
command = "train.py {data.words} {args}"
launcher = "python"
checkpoint = "ckpt.json"
resume_args = "--resume {checkpoint}"
metrics = "metrics.csv"
metric = "loss"
mode = "min"
smoke_args = "--sleep 0.4"
"""


def _no_sweep_recorded() -> None:
    status = run_gpuq("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["jobs"] == []


def _table(out: str) -> dict[str, list[str]]:
    """{cell: its row's columns} of the smoke table."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("cell "))
    rows = {}
    for ln in lines[head + 1:]:
        if not ln or ln.startswith(("FAILED", "smoke:", "the smoke")):
            break
        cols = ln.split()
        rows[cols[0]] = cols[1:]
    return rows


def _toy(tmp_path: Path, honour: bool) -> Path:
    work = tmp_path / ("good" if honour else "forgetful")
    work.mkdir()
    (work / "train.py").write_text(TRAINER.format(honour=honour))
    (work / "gpuq.toml").write_text(TOML)
    (work / "words.txt").write_text("hello")
    # two seeds and two cells: one smoke run per cell
    (work / "queue.txt").write_text("name=toy seeds=2 -- {3,4}\n")
    return work / "queue.txt"


def test_smoke_passes_a_trainer_that_resumes_and_fails_one_that_starts_over(gpuq_home: Path,
                                                                            tmp_path: Path) -> None:
    good = run_gpuq("submit", "--smoke", str(_toy(tmp_path, True)), env=ENV, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    assert not list((gpuq_home / "smoke").iterdir())  # a smoke that passed leaves nothing behind
    rows = _table(good.stdout)
    assert len(rows) == 2, good.stdout  # a cell per argument, not per seed
    for cols in rows.values():  # started, metrics, checkpoint, resumed, exit
        assert cols[0] == "yes" and cols[2] == "rows" and cols[3] == "run/ckpt.json" and cols[4] == "yes" \
            and cols[5] == "0", good.stdout
    bad = run_gpuq("submit", "--smoke", str(_toy(tmp_path, False)), env=ENV, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "started over instead of resuming from run/ckpt.json" in bad.stdout, bad.stdout
    assert all(cols[4] == "no" for cols in _table(bad.stdout).values()), bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr
    _no_sweep_recorded()
    (kept,) = (gpuq_home / "smoke").iterdir()  # one that failed is kept for a look
    assert str(kept) in bad.stdout and list(kept.glob("jobs/*/attempts/2/job.log")), bad.stdout


def test_smoke_passes_the_ddp_example(gpuq_home: Path, tmp_path: Path) -> None:
    ddp = copy_example("ddp_snapshot", tmp_path, queue="name=bs gpus=1 -- 4 1 --batch_size 64\n")
    done = run_gpuq("submit", "--smoke", str(ddp), env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (cols,) = _table(done.stdout).values()
    assert cols[0] == "yes" and cols[3] == "run/snapshot.pt" and cols[4] == "yes" and cols[5] == "0", done.stdout
    _no_sweep_recorded()


def test_smoke_passes_the_hydra_example(gpuq_home: Path, tmp_path: Path) -> None:
    pytest.importorskip("hydra", reason="examples/hydra_csv needs hydra-core (pyproject's `examples` extra)")
    # the setup hook's pip stays offline; one OpenMP thread: a tiny model's second thread only spins
    offline = 'env = { PIP_NO_INDEX = "1", PIP_DISABLE_PIP_VERSION_CHECK = "1", OMP_NUM_THREADS = "1" }\n'
    hydra = copy_example("hydra_csv", tmp_path, queue="name=lr gpus=1 -- model.width=64 optim.lr=1e-2\n",
                         toml_extra=offline)
    done = run_gpuq("submit", "--smoke", str(hydra), env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (cols,) = _table(done.stdout).values()
    assert cols[0] == "yes" and cols[2] == "rows" and int(cols[1]) >= 2, done.stdout  # [run] smoke_args: 3 epochs
    assert cols[3] == "run/checkpoint.pt" and cols[4] == "yes" and cols[5] == "0", done.stdout
    _no_sweep_recorded()


def test_smoke_passes_the_payload_and_fails_clearly_on_a_bad_config_key(gpuq_home: Path, tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    shutil.copytree(ROOT / "payload" / "configs", payload / "configs")
    config = payload / "configs" / "baseline.yaml"
    (payload / "configs" / "typo.yaml").write_text(config.read_text().replace("batch_size: 32", "batch_sise: 32"))
    (payload / "queue.txt").write_text("configs/baseline.yaml classify 12 gpus=1\n"
                                       "configs/typo.yaml classify 12 gpus=1\n")
    done = run_gpuq("submit", "--smoke", str(payload / "queue.txt"), env=ENV, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = _table(done.stdout)
    assert rows["baseline"][0] == "yes" and rows["baseline"][4] == "yes" and rows["baseline"][5] == "0", done.stdout
    assert rows["typo"][3] == "no" and rows["typo"][5] != "0", done.stdout
    (failed,) = [ln for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
    assert failed.startswith("FAILED typo:") and "unknown key 'batch_sise'" in failed, done.stdout
    _no_sweep_recorded()
