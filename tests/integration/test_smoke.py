"""``gpuq submit --smoke`` (docs/your-project.md): every distinct cell runs briefly on this machine through
the real wrapper (start, metrics, checkpoint, stop, resume) and nothing is recorded.  Passes on the three
examples: examples/ddp_snapshot, examples/hydra_csv and the payload's example (one cell each), fails
clearly on a payload config with a bad key and on a trainer that ignores its checkpoint.  hydra_csv's setup
hook (`pip install -r requirements.txt`) finds Hydra installed (pyproject's `examples` extra) and stays
offline: a no-op, not the install a fresh machine would spend its CPU on."""

from __future__ import annotations

import json
import os
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
setup = "echo preparing; sleep 0.5"
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
    # never silent (issue 39 item 10): the setup hook's start and end, each cell's steps, on stderr
    said = [ln for ln in good.stderr.splitlines() if ln.startswith("gpuq: smoke ")]
    first = [ln.split(": ", 2)[2] for ln in said if ln.startswith("gpuq: smoke toy-3 (1/2): ")]
    assert first[0] == "attempt 1 started" and first[1].startswith("setup hook started ([run] setup; its output: ")
    assert first[2].startswith("setup hook done after ") and first[-1] == "passed", said
    assert "attempt 1 stopped (SIGTERM) once a checkpoint and a metrics row were written" in first, said
    assert "attempt 2 started: the resume from run/ckpt.json" in first and "attempt 2 ended: exit 0" in first, said
    assert sum("setup hook started" in ln for ln in said) == 1, said  # once per host and setup key
    assert said[-1] == "gpuq: smoke toy-4 (2/2): passed", said
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


SNOOP = """import json, os
def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return "unreadable: %s" % e.strerror
seen = {{name: read(path) for name, path in {paths!r}.items()}}
up = os.getcwd()  # walk up from the run dir, as a trainer looking for a config would
while up != os.path.dirname(up):
    up = os.path.dirname(up)
    if os.path.exists(os.path.join(up, "keys.toml")):
        seen["walked up"] = read(os.path.join(up, "keys.toml"))
pid = os.getpid()  # every ancestor's view of the machine, the controller's among them
while pid > 1:
    seen["/proc/%d/root" % pid] = read("/proc/%d/root%s" % (pid, {paths!r}["keys.toml"]))
    pid = int([ln.split()[1] for ln in open("/proc/%d/status" % pid) if ln.startswith("PPid:")][0])
seen["HOME"] = os.environ["HOME"]
with open("saw.json", "w") as f:
    json.dump(seen, f)
raise SystemExit(3)
"""


def _snoop(gpuq_home: Path, tmp_path: Path, env: dict[str, str]) -> tuple[str, Path, dict[str, Path],
                                                                         dict[str, str]]:
    """A smoke of a trainer that reads keys.toml and the user's credentials (a home of the test's own):
    (its output, the kept smoke root, the secrets' paths, what the trainer saw)."""
    home = tmp_path / "home"  # the user's home, as the smoke's own HOME would otherwise be
    secrets = {"keys.toml": gpuq_home / "keys.toml", "ssh key": home / ".ssh" / "id_ed25519",
               "aws": home / ".aws" / "credentials", "netrc": home / ".netrc",
               "gcloud": home / ".config" / "gcloud" / "credentials.db"}
    for name, path in secrets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"SECRET-{name}")
        path.chmod(0o600)
    work = tmp_path / "snoop"
    work.mkdir()
    (work / "train.py").write_text(SNOOP.format(paths={k: str(v) for k, v in secrets.items()}))
    (work / "gpuq.toml").write_text('[run]\ncommand = "train.py"\nlauncher = "python"\ncheckpoint = "ckpt.json"\n'
                                    'metrics = "metrics.csv"\nmetric = "loss"\nmode = "min"\n')
    (work / "queue.txt").write_text("name=snoop -- 1\n")
    done = run_gpuq("submit", "--smoke", str(work / "queue.txt"), env={**ENV, "HOME": str(home), **env},
                    timeout=300)
    assert done.returncode == 1 and "FAILED snoop: attempt 1 failed" in done.stdout, done.stdout + done.stderr
    (kept,) = (gpuq_home / "smoke").iterdir()
    (saw,) = kept.glob("jobs/*/run/saw.json")
    return done.stdout + done.stderr, kept, secrets, json.loads(saw.read_text())


def test_a_smoke_trainer_cannot_read_gpuq_home_ssh_or_aws(gpuq_home: Path, tmp_path: Path) -> None:
    out, kept, secrets, seen = _snoop(gpuq_home, tmp_path, {})
    assert "warning: the smoke runs the project with HOME" not in out  # namespaces work here
    assert set(secrets) <= set(seen) and any(k.startswith("/proc/") for k in seen), seen  # it looked
    assert not [k for k, v in seen.items() if "SECRET" in v], seen
    assert seen["HOME"] == str(kept), seen
    for path in secrets.values():  # the user's own files are untouched
        assert path.read_text().startswith("SECRET-")


def test_without_unshare_the_smoke_says_so_in_one_line_and_still_moves_home(gpuq_home: Path,
                                                                           tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # this machine's commands, all but unshare
    bin_dir.mkdir()
    for top in os.environ["PATH"].split(os.pathsep)[::-1]:
        for exe in Path(top).glob("*") if os.path.isdir(top) else []:
            if exe.name != "unshare":
                (bin_dir / exe.name).unlink(missing_ok=True)
                (bin_dir / exe.name).symlink_to(exe)
    out, kept, _secrets, seen = _snoop(gpuq_home, tmp_path, {"PATH": str(bin_dir)})
    (warning,) = [ln for ln in out.splitlines() if ln.startswith("warning: the smoke")]
    assert "cannot hide $GPUQ_HOME, ~/.ssh and ~/.aws from it (unshare not found)" in warning, out
    assert seen["HOME"] == str(kept), seen
