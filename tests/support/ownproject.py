"""The examples/ projects as a test copies and drives them: a copy of an example with its gpuq.toml
adjusted, a wheelhouse of hydra-core for hosts without network, and a Python for the hosts that can
import torch but not hydra (so the project's setup hook really installs it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

EXAMPLES = ROOT / "examples"
# Outside /tmp, /root and /run, which the namespace test hosts replace with their own: the hosts see these
SHARED = Path("/var/tmp")
WHEELHOUSE = SHARED / "gpuq-test-wheels"


def copy_example(name: str, dest: Path, *, queue: str | None = None, toml_extra: str = "") -> Path:
    """A copy of examples/<name> under ``dest`` (the user's checkout); returns its queue file."""
    work = dest / name
    shutil.copytree(EXAMPLES / name, work, ignore=shutil.ignore_patterns("__pycache__", "outputs", "*.pt", "*.csv"))
    if queue is not None:
        (work / "queue.txt").write_text(queue)
    if toml_extra:
        toml = work / "gpuq.toml"
        toml.write_text(toml.read_text() + toml_extra)
    return work / "queue.txt"


def hydra_wheelhouse() -> Path:
    """hydra-core and its dependencies as wheels, built once per machine (PyPI is reachable from here)."""
    if not any(WHEELHOUSE.glob("hydra_core-*.whl")) or not any(WHEELHOUSE.glob("antlr4*.whl")):
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "hydra-core", "-w", str(WHEELHOUSE)],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    return WHEELHOUSE


HYDRA_DISTS = ("hydra", "omegaconf", "antlr4")  # hydra-core and what it pulls in (packages, .dist-info dirs)


def host_python() -> tuple[Path, Path]:
    """A fresh venv whose site-packages chain to this interpreter's (torch importable), without hydra even
    when this interpreter has it (the suite's `examples` extra installs it); returns (its python, its dir
    to remove).  It lives where the namespace hosts can run it.  Its ``pip`` is this interpreter's pip run
    by the venv's python (what ``python -m venv`` would install, less ensurepip's 6 s of CPU): it installs
    into the venv, as a venv's own pip does."""
    venv = Path(tempfile.mkdtemp(prefix="gpuq-test-hostvenv-", dir=SHARED))
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    python = venv / "bin" / "python"
    pip = venv / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{python}" -m pip "$@"\n')
    pip.chmod(0o755)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    view = venv / "parent-site"  # this interpreter's site-packages, less hydra-core's distributions
    view.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(HYDRA_DISTS):
            (view / entry.name).symlink_to(entry)
    (Path(purelib) / "gpuq_test_parent.pth").write_text(f"{view}\n")
    probe = subprocess.run([str(python), "-c", "import torch, importlib.util as u; "
                            "assert u.find_spec('hydra') is None"], capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr
    where = subprocess.run([str(pip), "--version"], capture_output=True, text=True, check=False)
    assert where.returncode == 0 and f"(python {sys.version_info.major}.{sys.version_info.minor})" in where.stdout, \
        where.stdout + where.stderr
    return python, venv


def offline_pip_env(wheelhouse: Path) -> str:
    """A [run] env line that makes the setup hook's pip install from the wheelhouse only (no network), and
    gives the trainer one torch thread (its hosts have one GPU: see THREADS in tests/support/sweepproject.py)."""
    return (f'env = {{ PIP_NO_INDEX = "1", PIP_FIND_LINKS = "{wheelhouse}", '
            f'PIP_DISABLE_PIP_VERSION_CHECK = "1", OMP_NUM_THREADS = "1", MKL_NUM_THREADS = "1" }}\n')


def jobs_of(status_doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(status_doc.get("jobs", []))


def states(status_doc: dict[str, Any]) -> dict[str, str]:
    return {j["name"]: j["state"] for j in jobs_of(status_doc)}


def launches(root: Path, job_id: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / "jobs" / job_id / "attempts").glob("*/launch.json"))]


def all_text_under(path: Path, skip: tuple[str, ...] = ()) -> list[tuple[Path, bytes]]:
    """Every regular file under ``path`` (symlinks not followed), except under the named top-level dirs."""
    out = []
    for dirpath, _dirnames, filenames in os.walk(path):
        rel = Path(dirpath).relative_to(path)
        if rel.parts and rel.parts[0] in skip:
            continue
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                with contextlib.suppress(OSError):
                    out.append((p, p.read_bytes()))
    return out


PREPARE = """import os
os.makedirs("data", exist_ok=True)
with open(os.path.join("data", "train.txt"), "w") as f:
    f.write(" ".join(str(i) for i in range(1000)))
print("prepared data/train.txt")
"""

READ_DATA = """import sys
rows = open("data/train.txt").read().split()  # what the setup hook wrote next to itself
wrote = 0
for path in ("data/train.txt", "data/new.txt"):
    try:
        with open(path, "a") as f:
            f.write("x")
        wrote += 1
    except OSError as e:
        print("the prepared tree is read-only:", e)
with open("metrics.csv", "w") as f:
    f.write("step,rows,wrote\\n1,%d,%d\\n" % (len(rows), wrote))
print("read %d rows (%s)" % (len(rows), " ".join(sys.argv[1:])))
sys.exit(3 if wrote else 0)
"""


def data_prep_project(dest: Path, queue: str = "name=a -- 1\nname=b -- 2\n") -> Path:
    """A nanoGPT-like project whose setup hook prepares data/train.txt next to itself and whose trainer
    reads it (and fails if it can write the prepared tree); returns its queue file."""
    work = dest / "prep"
    work.mkdir(parents=True)
    (work / "prepare.py").write_text(PREPARE)
    (work / "train.py").write_text(READ_DATA)
    (work / "queue.txt").write_text(queue)
    (work / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\n'
                                    'setup = "python prepare.py"\nmetrics = "metrics.csv"\nmetric = "rows"\n'
                                    'mode = "max"\n')
    return work / "queue.txt"


LINKED_CHECKPOINTS = """import os, sys
# a timm-like trainer: each epoch saves tmp.pth.tar, renames it to last.pth.tar and hard-links that
# to checkpoint-<epoch>.pth.tar; the best is one more hard link of the newest
epochs = int(sys.argv[1])
os.makedirs("output", exist_ok=True)
with open(os.path.join("output", "summary.csv"), "w") as log:
    log.write("epoch,loss\\n")
    for epoch in range(1, epochs + 1):
        with open(os.path.join("output", "tmp.pth.tar"), "wb") as f:
            f.write(os.urandom(256 * 1024) + b"epoch %d" % epoch)
        os.replace(os.path.join("output", "tmp.pth.tar"), os.path.join("output", "last.pth.tar"))
        os.link(os.path.join("output", "last.pth.tar"), os.path.join("output", "checkpoint-%d.pth.tar" % epoch))
        log.write("%d,%f\\n" % (epoch, 1.0 / epoch))
        print("epoch %d/%d loss %.3f" % (epoch, epochs, 1.0 / epoch), flush=True)
os.link(os.path.join("output", "last.pth.tar"), os.path.join("output", "model_best.pth.tar"))
"""


def linked_checkpoints_project(dest: Path, queue: str = "name=a -- 3\nname=b -- 3\n") -> Path:
    """A project whose own trainer writes several checkpoints and hard links between them, as timm's
    CheckpointSaver does (checkpoint-N.pth.tar, last.pth.tar, model_best.pth.tar); returns its queue file."""
    work = dest / "linked"
    work.mkdir(parents=True)
    (work / "train.py").write_text(LINKED_CHECKPOINTS)
    (work / "queue.txt").write_text(queue)
    (work / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\n'
                                    'checkpoint = "output/*.pth.tar"\noutputs = ["output/summary.csv"]\n'
                                    'metrics = "output/summary.csv"\nmetric = "loss"\nmode = "min"\n')
    return work / "queue.txt"
