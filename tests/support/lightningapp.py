"""examples/lightning_cli as the tests drive it: what Lightning wrote in a job's run dir, and the one
piece of test-machine care its processes need (the bytecode of the modules LightningCLI imports).

Lightning's import is the whole cost of these tests: about 5 s of CPU per process when its modules'
bytecode is cached, about 13 s when every process compiles them again.  A trainer never writes
bytecode (gpuq's wrapper gives it PYTHONDONTWRITEBYTECODE=1), and CI installs with ``pip
--no-compile`` (README), so without ``warm_bytecode`` every rank of every job would compile
lightning, jsonargparse and their dependencies from source.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.ownproject import EXAMPLES

# what LightningCLI's app imports (examples/lightning_cli/train.py); their find_spec imports nothing
NEEDS = ("lightning", "jsonargparse", "docstring_parser", "typeshed_client")


def missing() -> str | None:
    """Why the example cannot run here (a package of examples/lightning_cli/requirements.txt is not
    installed), or None.  Found without importing anything: a test module that imported lightning at
    collection would cost every xdist worker seconds of CPU, whether or not it runs the test."""
    absent = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    return f"the example's requirements are not installed: {', '.join(absent)}" if absent else None


def warm_bytecode(scratch: Path) -> None:
    """Compile, once per installation, the modules the app imports, by running a copy of it (under
    ``scratch``) once as its user would, with bytecode written: a no-op when ``lightning/pytorch/cli.py``'s
    bytecode is cached already."""
    spec = importlib.util.find_spec("lightning")  # a submodule's find_spec would import lightning.pytorch
    assert spec is not None and spec.origin is not None
    cli = os.path.join(os.path.dirname(spec.origin), "pytorch", "cli.py")
    if os.path.exists(importlib.util.cache_from_source(cli)):
        return
    app = scratch / "lightning_cli"
    shutil.copytree(EXAMPLES / "lightning_cli", app, ignore=shutil.ignore_patterns("__pycache__", "lightning_logs"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "train.py", "fit", "--config", "config.yaml", "--trainer.max_epochs=1",
                           "--data.samples=64"],
                          cwd=app, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def val_losses(path: Path) -> list[tuple[int, float]]:
    """(epoch, val_loss) of every validation row of one CSVLogger metrics.csv."""
    rows = csv.DictReader(path.read_text().splitlines()) if path.is_file() else []
    return [(int(r["epoch"]), float(r["val_loss"])) for r in rows if r.get("val_loss")]


def versions(run: Path) -> list[Path]:
    """The job's lightning_logs/version_N dirs, oldest first (one per start of ``fit``)."""
    return sorted((run / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


def checkpoints(job_dir: Path) -> list[str]:
    """Every .ckpt under the job's lightning_logs, relative to the job dir (as a pull lays them out)."""
    return sorted(p.relative_to(job_dir).as_posix() for p in (job_dir / "run" / "lightning_logs").rglob("*.ckpt"))


def story(*roots: Path) -> str:
    """What a failed wait should show: each host root's setup logs and every attempt's log tail."""
    out = []
    for root in roots:
        for log in [*root.glob("setup/*/setup.log"), *root.glob("jobs/*/attempts/*/job.log")]:
            out.append(f"--- {log}\n{log.read_text(errors='replace')[-2500:]}")
    return "\n".join(out) or f"(no logs under {', '.join(map(str, roots))})"
