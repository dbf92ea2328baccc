"""Hardware as a constraint on a mixed farm (docs/queue.md, "GPU model and memory"): two SSH hosts whose
nvidia-smi reports an A10 (23,028 MiB: 24.1 GB) and an A100 (81,920 MiB: 85.9 GB).  A `gpu=H100` line is
refused by the dry run
with a reason naming each host's GPUs; `gpu_mem=80` jobs run only on the A100 even while the A10 idles
(nor are they stolen onto it); a host whose card no longer is what the ledger saw fails the job's
preflight check (`--min-gpu-mem-mib`), is not held, and the job runs elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.support.gpuquser import User
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

CARDS = (("NVIDIA A10", 23028), ("NVIDIA A100-SXM4-80GB", 81920))  # g0, g1
TRAIN = 'import time\ntime.sleep(1)\nopen("metrics.csv", "w").write("step,val_acc\\n1,0.5\\n")\n'
TOML = '[run]\ncommand = "train.py {args}"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    farm = host_farm(n=2, gpus=1)
    for i, (name, mib) in enumerate(CARDS):
        farm.set_gpu(i, 0, {"name": name, "memory.total": mib})
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(farm, home, "/root/gpuq-gpus")
    yield u
    u.stop_everything()


def _jobs(user: User) -> dict[str, tuple[str, str | None]]:
    ledger = Ledger(user.home / "ledger.db")
    try:
        return {j.name: (j.state, j.host) for j in ledger.jobs()}
    finally:
        ledger.close()


def test_jobs_run_only_where_their_hardware_is(user: User, tmp_path: Path) -> None:
    small, big = user.add_hosts(2)
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "gpuq.toml").write_text(TOML)

    wants_h100 = tmp_path / "h100.txt"
    wants_h100.write_text("name=h gpu=H100 -- --lr 0.1\n")
    dry = user.gpuq("submit", str(wants_h100), "--dry-run")
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert (f"job 'h' cannot be placed: needs gpu=H100: no host has one (hosts: {small}: NVIDIA A10 24.1 GB, "
            f"{big}: NVIDIA A100-SXM4-80GB 85.9 GB)") in dry.stderr, dry.stderr

    wants_80 = tmp_path / "big.txt"
    wants_80.write_text("name=big seeds=2 gpu_mem=80 -- --lr 0.1\n")
    done = user.gpuq("submit", str(wants_80), "--wait", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + user.logs_of_unfinished()
    assert _jobs(user) == {"big-seed0": ("SUCCEEDED", big), "big-seed1": ("SUCCEEDED", big)}
    assert set(user.launches()) and all(hosts == [1] for hosts in user.launches().values())  # never on g0

    user.farm.set_gpu(0, 0, {"memory.total": 16384})  # the A10 now reports 17.2 GB; the ledger still says 24.1
    wants_20 = tmp_path / "mid.txt"
    wants_20.write_text("name=mid gpu_mem=20 -- --lr 0.1\n")
    done = user.gpuq("submit", str(wants_20), "--wait", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + user.logs_of_unfinished()
    said = done.stdout + done.stderr
    assert f"host {small} left out: its GPUs are not what the jobs planned there need" in said, said
    assert "below the 19073.5 MiB requested" in said, said  # the preflight was told what the job needs
    assert _jobs(user)["mid"] == ("SUCCEEDED", big)
    ledger = Ledger(user.home / "ledger.db")
    try:
        row = ledger.host(small)
        assert row is not None and not row.held and row.health == ""  # not held: only not for this job
        assert row.gpu_facts == '[["NVIDIA A10", 16384.0]]'  # what the preflight saw
    finally:
        ledger.close()
