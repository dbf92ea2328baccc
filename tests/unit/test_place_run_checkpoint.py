"""A project's own checkpoint between a host and the controller (orchestrator/tick/checkpoints.py): the
file the sweep's `checkpoint` globs match in the job's run dir is shipped home with the whole lines of
its metrics file, and a resume puts both back at the same paths unless the host holds those exact bytes.

Runs against the local host with the real host agent (`snapshot` copies the file); the payload's own
rolling checkpoints are in tests/unit/test_place_checkpoint.py (scripts/mutation.py checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import GpuqError
from orchestrator.tick import checkpoints as ck
from tests.support.checkpointworld import World, running_world
from tests.support.jobspecs import spec_doc
from tests.support.wire import status

RUN = {"checkpoint": ["ckpt/*.pt"], "metrics": "logs/metrics.csv", "command": ["train.py"]}
WEIGHTS = b"weights of epoch 1"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from running_world(tmp_path, monkeypatch, run=json.dumps(RUN))


def _project_job(world: World, data: bytes = WEIGHTS, metrics: str = "step,loss\n1,2.0\n2,1.5\n3,1.") -> float:
    """The job's spec on the host names the globs; its trainer wrote a checkpoint and some metrics."""
    jdir = world.root / "jobs" / world.job
    (jdir / "run" / "ckpt").mkdir(parents=True, exist_ok=True)
    (jdir / "run" / "logs").mkdir(parents=True, exist_ok=True)
    (jdir / "spec.json").write_text(json.dumps(spec_doc(job_id=world.job, attempt=1, run=RUN)))
    (jdir / "run" / "ckpt" / "e1.pt").write_bytes(data)
    (jdir / "run" / "logs" / "metrics.csv").write_text(metrics)
    return os.path.getmtime(jdir / "run" / "ckpt" / "e1.pt")


def _ship(world: World, mtime: float) -> list[str]:
    row = world.ctx.ledger.host("local")
    assert row is not None
    doc = {"jobs": [{"job_id": world.job, "state": "running", "attempt": 1, "run_ckpt_mtime": mtime}]}
    return ck.ship_checkpoints(world.ctx, row, status(doc))


def test_a_projects_checkpoint_comes_home_with_the_whole_lines_of_its_metrics(world: World) -> None:
    mtime = _project_job(world)
    assert _ship(world, mtime) == [world.job]
    kept = world.home / "checkpoints" / world.job
    assert world.kept() == [f"{world.job}/LATEST", f"{world.job}/run/ckpt/e1.pt", f"{world.job}/run/logs/metrics.csv"]
    assert (kept / "run" / "ckpt" / "e1.pt").read_bytes() == WEIGHTS
    assert (kept / "run" / "logs" / "metrics.csv").read_text() == "step,loss\n1,2.0\n2,1.5\n"
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    assert json.loads((kept / "LATEST").read_text()) == {
        "file": "run/ckpt/e1.pt", "sha256": sha, "bytes": len(WEIGHTS), "mtime": mtime, "step": 0,
        "written_at": mtime}
    [row] = world.ctx.ledger.checkpoints(world.job)
    assert (row.file, row.step, row.sha256, row.durable_path, row.written_at) == (
        "run/ckpt/e1.pt", 0, sha, str(kept / "run" / "ckpt" / "e1.pt"), mtime)
    assert not (world.root / "jobs" / world.job / "ckpt" / ".ship.pt").exists()  # the pinned copy is gone
    # the same file again (no newer mtime) is not copied again; a newer one is
    assert _ship(world, mtime) == []
    assert _ship(world, mtime - 5) == []
    row = world.ctx.ledger.host("local")
    assert row is not None
    stale_then_new = {"jobs": [{"job_id": world.job, "state": "running", "run_ckpt_mtime": mtime},
                               {"job_id": world.job, "state": "running", "run_ckpt_mtime": mtime + 1}]}
    assert ck.ship_checkpoints(world.ctx, row, status(stale_then_new)) == [world.job]  # the stale entry stops nothing
    _project_job(world, b"weights of epoch 2", "step,loss\n1,2.0\n")
    os.utime(world.root / "jobs" / world.job / "run" / "ckpt" / "e1.pt", (mtime + 10, mtime + 10))
    assert _ship(world, mtime + 10) == [world.job]
    assert (kept / "run" / "ckpt" / "e1.pt").read_bytes() == b"weights of epoch 2"
    assert (kept / "run" / "logs" / "metrics.csv").read_text() == "step,loss\n1,2.0\n"


def test_a_resume_puts_the_checkpoint_and_its_metrics_back_at_their_paths(world: World) -> None:
    assert _ship(world, _project_job(world)) == [world.job]
    job = world.job_row()
    jdir = world.root / "jobs" / world.job
    # the host still has those exact bytes: nothing is pushed
    assert ck.place_checkpoint(world.ctx, job, "local") == "kept the host's own checkpoint (same bytes)"
    # a replacement's empty disk: both files return to the same run-dir paths
    shutil.rmtree(jdir)
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint run/ckpt/e1.pt"
    assert (jdir / "run" / "ckpt" / "e1.pt").read_bytes() == WEIGHTS
    assert (jdir / "run" / "logs" / "metrics.csv").read_text() == "step,loss\n1,2.0\n2,1.5\n"
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    assert f"checkpoint run/ckpt/e1.pt ({sha[:12]}) placed on local" in world.events()
    # other bytes at that path (the host's trainer wrote on after the copy): the controller's copy wins
    (jdir / "run" / "ckpt" / "e1.pt").write_bytes(b"something else")
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint run/ckpt/e1.pt"
    assert (jdir / "run" / "ckpt" / "e1.pt").read_bytes() == WEIGHTS


def test_without_a_kept_metrics_file_only_the_checkpoint_is_placed(world: World) -> None:
    assert _ship(world, _project_job(world)) == [world.job]
    (world.home / "checkpoints" / world.job / "run" / "logs" / "metrics.csv").unlink()
    jdir = world.root / "jobs" / world.job
    shutil.rmtree(jdir)
    assert ck.place_checkpoint(world.ctx, world.job_row(), "local") == "pushed checkpoint run/ckpt/e1.pt"
    assert sorted(p.relative_to(jdir).as_posix() for p in jdir.rglob("*") if p.is_file()) == ["run/ckpt/e1.pt"]


def test_a_run_dir_path_that_cannot_be_made_is_a_clear_error(world: World) -> None:
    assert _ship(world, _project_job(world)) == [world.job]
    jdir = world.root / "jobs" / world.job
    shutil.rmtree(jdir / "run")
    (jdir / "run").write_text("a file where the run dir belongs")
    with pytest.raises(GpuqError, match=rf"^host local: cannot create {jdir}/run/ckpt: mkdir: "):
        ck.place_checkpoint(world.ctx, world.job_row(), "local")


@pytest.mark.parametrize(("run", "metrics"), [
    (RUN, "logs/metrics.csv"),
    (dict(RUN, metrics="log"), None),  # metrics read from the job's log: no file to carry
    (dict(RUN, metrics=""), None),
    (dict(RUN, metrics="../../etc/passwd"), None),
    (dict(RUN, metrics=".hidden/m.csv"), ".hidden/m.csv"),  # a dot name is ordinary (docs/results.md)
    (dict(RUN, metrics="a/\x01b.csv"), None),
    (dict(RUN, metrics=5), None),
    (dict(RUN, metrics=["logs/m.csv"]), None),
    ({"checkpoint": ["ckpt/*.pt"]}, None),
    ("not json", None),
    ([1, 2], None),
])
def test_the_metrics_file_that_travels_is_a_clean_run_dir_path(world: World, run: object, metrics: str | None) -> None:
    raw = run if isinstance(run, str) else json.dumps(run)
    with sqlite3.connect(world.home / "ledger.db") as conn:
        conn.execute("UPDATE sweep SET run = ? WHERE id = 'qaaaaaa'", (raw,))
    assert ck._run_metrics(world.ctx, world.job_row()) == metrics


def test_same_host_trust_never_places_a_projects_checkpoint_from_another_host(world: World) -> None:
    """checkpoint_trust = "same-host": a project's own checkpoint (any format, loaded by the project's
    own code, gpuq never reads its content) goes back only to the host that wrote it (issue 23 item 18)."""
    assert _ship(world, _project_job(world)) == [world.job]
    job = world.job_row()
    jdir = world.root / "jobs" / world.job
    shutil.rmtree(jdir)
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    durable = str(world.home / "checkpoints" / world.job / "run" / "ckpt" / "e1.pt")
    world.ctx.settings = world.ctx.settings.model_copy(update={"checkpoint_trust": "same-host"})
    world.ctx.ledger.mark_checkpoint_durable(world.job, sha, durable, "rented-a")  # written on another host
    with pytest.raises(GpuqError, match='checkpoint_trust = "same-host": the project\'s own checkpoint '
                                       r"run/ckpt/e1\.pt was written on rented-a and is not placed on local"):
        ck.place_checkpoint(world.ctx, job, "local")
    assert not jdir.exists()  # nothing reached the host
    world.ctx.ledger.mark_checkpoint_durable(world.job, sha, durable, "local")  # the host that wrote it
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint run/ckpt/e1.pt"
    shutil.rmtree(jdir)
    world.ctx.ledger.mark_checkpoint_durable(world.job, sha, durable, "rented-a")
    world.ctx.settings = world.ctx.settings.model_copy(update={"checkpoint_trust": "any-host"})
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint run/ckpt/e1.pt"  # the default
    assert (jdir / "run" / "ckpt" / "e1.pt").read_bytes() == WEIGHTS


@pytest.mark.parametrize(("trust", "file", "wrote", "target", "refused"), [
    ("same-host", "run/ckpt/e1.pt", {"a"}, "a", False),
    ("same-host", "run/ckpt/e1.pt", {"a"}, "b", True),
    ("same-host", "run/ckpt/e1.pt", {"a", "b"}, "b", False),  # a node of the multi-node attempt that wrote it
    ("same-host", "run/ckpt/e1.pt", {""}, "a", True),  # the writer unrecorded: not trusted
    ("same-host", "latest-000000008.pt", {"a"}, "b", False),  # gpuq's own: read by opcodes before it is kept
    ("any-host", "run/ckpt/e1.pt", {"a"}, "b", False),
])
def test_the_trust_rule(trust: str, file: str, wrote: set[str], target: str, refused: bool) -> None:
    from orchestrator.health.checkpoint_trust import placement_refusal
    assert (placement_refusal(trust, file, wrote, target) is not None) is refused


def test_a_cloned_project_cannot_loosen_checkpoint_trust(tmp_path: Path) -> None:
    """Only the user's own config or environment sets it: a project's gpuq.toml saying "any-host"
    would undo a user's "same-host"."""
    from orchestrator.core.config import load_settings
    from orchestrator.core.errors import ConfigError
    project = tmp_path / "proj"
    project.mkdir()
    (project / "gpuq.toml").write_text('checkpoint_trust = "any-host"\n')
    env = {"GPUQ_HOME": str(tmp_path / "home"), "GPUQ_CHECKPOINT_TRUST": "same-host"}
    with pytest.raises(ConfigError, match="checkpoint_trust can only be set in your own"):
        load_settings(env=env, project_dir=project)
    assert load_settings(env=env).checkpoint_trust == "same-host"
