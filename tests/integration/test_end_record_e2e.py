"""What "verified" means for a project's own trainer on a namespace SSH host: equal to what the attempt
left when it ended (its end record, attempts/<n>/outputs.json, kept by the controller), not merely to the
host's files at pull time.  The trainer writes several checkpoints and hard links between them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gpuquser import User
from tests.support.ownproject import linked_checkpoints_project
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

LINKED = ("checkpoint-3.pth.tar", "last.pth.tar", "model_best.pth.tar")  # one inode, three names


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(host_farm(n=1, gpus=2), home, "/root/gpuq-end")
    yield u
    u.stop_everything()


def _flip_one_byte(path: Path) -> None:
    """Change one byte in place, keeping the size and the mtime (what a size/mtime check cannot see)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_checkpoint_changed_on_the_host_after_the_job_ended_is_refused_by_name(user: User,
                                                                                 tmp_path: Path) -> None:
    user.add_hosts(1)
    queue = linked_checkpoints_project(tmp_path)
    done = user.gpuq("submit", str(queue), "--wait", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr + user.logs_of_unfinished()
    jobs = {j["name"]: j for j in user.status_doc()["jobs"]}
    assert {j["state"] for j in jobs.values()} == {"SUCCEEDED"}, jobs
    sweep = jobs["a"]["sweep_id"]
    out = {name: user.host_dir(0) / "jobs" / job["id"] / "run" / "output" for name, job in jobs.items()}
    assert len({(out["b"] / n).stat().st_ino for n in LINKED}) == 1  # the trainer's hard links
    assert (out["b"] / "checkpoint-1.pth.tar").stat().st_ino != (out["b"] / "last.pth.tar").stat().st_ino
    _flip_one_byte(out["b"] / "checkpoint-3.pth.tar")  # after SUCCEEDED: a co-tenant, the host, an accident

    pulled = user.gpuq("pull")
    assert pulled.returncode == 1, pulled.stdout + pulled.stderr
    assert "Traceback" not in pulled.stderr and "1 of 2 jobs verified" in pulled.stdout, pulled.stdout
    as_json = user.gpuq("pull", "--json")
    assert as_json.returncode == 1, as_json.stdout + as_json.stderr
    by_name = {j["name"]: j for j in json.loads(as_json.stdout)["jobs"]}
    assert by_name["a"]["verified"] and by_name["a"]["state"] == "already verified"
    refused = by_name["b"]
    assert not refused["verified"] and refused["state"] == "not pulled", refused
    for name in LINKED:  # every name of the changed bytes is named, and nothing else
        assert f"run/output/{name}" in refused["reason"], refused["reason"]
    assert "checkpoint-1.pth.tar" not in refused["reason"] and "what attempt 1 left when it ended" in refused["reason"]
    assert not (user.home / "results" / sweep / jobs["b"]["id"]).exists()

    # the job that was left alone came home whole: every checkpoint, each hard link as a file of its own
    local = user.home / "results" / sweep / jobs["a"]["id"]
    for name in ("checkpoint-1.pth.tar", "checkpoint-2.pth.tar", *LINKED, "summary.csv"):
        assert (local / "run" / "output" / name).read_bytes() == (out["a"] / name).read_bytes(), name
    record = json.loads((local / "attempts" / "1" / "outputs.json").read_text())
    assert {f["path"] for f in record["files"]} >= {f"run/output/{n}" for n in LINKED}
    assert record["error"] is None and record["total_files"] == len(record["files"])
