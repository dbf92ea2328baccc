"""Provenance on a mixed farm (docs/results.md, "Provenance"; docs/report.md, "Flags"): two SSH hosts
whose nvidia-smi reports different GPU models and drivers run the two seeds of one cell; each attempt
stores what it ran with, `results --json` and `hosts show` say so, and the report flags the cell."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gpuquser import User
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090")
DRIVERS = ("535.161.08", "550.54.15")
TRAIN = """\
import os
seed = int(os.environ["GPUQ_SEED"])
with open("metrics.csv", "w") as fh:
    fh.write("step,val_acc\\n")
    for step in range(1, 4):
        fh.write(f"{step},{0.5 + 0.1 * step + 0.01 * seed}\\n")
print("done", flush=True)
"""
TOML = '[run]\ncommand = "train.py {args}"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    farm = host_farm(n=2, gpus=1)
    for i, (model, driver) in enumerate(zip(MODELS, DRIVERS, strict=True)):
        farm.set_gpu(i, 0, name=model)
        farm.write_gpu_state(i, {**farm.read_gpu_state(i), "driver_version": driver})
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(farm, home, "/root/gpuq-mixed")
    yield u
    u.stop_everything()


def _json(user: User, *args: str) -> dict:
    done = user.gpuq(*args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_seeds_on_two_gpu_models_are_recorded_apart_and_flagged(user: User, tmp_path: Path) -> None:
    hosts = user.add_hosts(2)
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "gpuq.toml").write_text(TOML)
    queue = tmp_path / "queue.txt"
    queue.write_text("".join(f"name=base_s{i} seed={i} host={h} -- --lr 0.1\n" for i, h in enumerate(hosts)))
    done = user.gpuq("submit", str(queue), "--wait", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + user.logs_of_unfinished()

    ran = {j["name"]: j["ran_with"] for j in _json(user, "results")["jobs"]}
    for i, host in enumerate(hosts):
        got = ran[f"base_s{i}"]
        assert (got["host"], got["gpu_model"], got["gpu_count"], got["driver"]) == (host, MODELS[i], 1, DRIVERS[i])
        stored = [p.read_text() for p in user.host_dir(i).glob("jobs/*/attempts/*/provenance.json")]
        assert got["python"] == platform.python_version(), stored
        shown = _json(user, "hosts", "show", host)["ran_with"]
        assert (shown["gpu_model"], shown["driver"]) == (MODELS[i], DRIVERS[i])

    done = user.gpuq("report", "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    (cell,) = json.loads(done.stdout)["cells"]
    assert cell["cell"] == "base" and cell["n_finished"] == 2
    mixed = [f for f in cell["flags"] if f.startswith("mixed machines across seeds")]
    assert mixed and all(m in mixed[0] for m in (*MODELS, *DRIVERS)), cell["flags"]
    assert len(cell["ran_with"]) == 2 and not any("seeds identical" in f for f in cell["flags"])
    page = tmp_path / "report"
    done = user.gpuq("report", "--format", "html", "-o", str(page))
    assert done.returncode == 0, done.stdout + done.stderr
    html = (page / "report.html").read_text()
    assert all(m in html for m in (*MODELS, *DRIVERS, "mixed machines across seeds", "<h2>Machines</h2>"))
