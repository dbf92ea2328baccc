"""A checkpoint directory (HF Trainer's ``checkpoint-N/``, a DCP dir) between a host and the controller
(docs/checkpoints.md): the agent's ``snapshot`` copies the newest complete one file by file, the
controller verifies every file and the tree hash, keeps it as a unit, and a resume places it back whole.

Runs against the local host with the real host agent, like tests/unit/test_place_run_checkpoint.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core import filenames
from orchestrator.tick import checkpoints as ck
from tests.support.checkpointworld import World, running_world
from tests.support.jobspecs import spec_doc
from tests.support.wire import status

RUN = {"checkpoint": ["out/checkpoint-*"], "command": ["train.py"]}
HF_FILES = {"model.safetensors": b"weights", "optimizer.pt": b"adam", "trainer_state.json": b'{"global_step": 4}',
            "sub dir/rng_state.pth": b"rng"}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from running_world(tmp_path, monkeypatch, run=json.dumps(RUN))


def _save(world: World, step: int, files: dict[str, bytes], age_s: float = 60.0) -> Path:
    jdir = world.root / "jobs" / world.job
    jdir.mkdir(parents=True, exist_ok=True)
    (jdir / "spec.json").write_text(json.dumps(spec_doc(job_id=world.job, attempt=1, run=RUN)))
    directory = jdir / "run" / "out" / f"checkpoint-{step}"
    then = time.time() - age_s
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (then, then))
    return directory


def _ship(world: World) -> list[str]:
    row = world.ctx.ledger.host("local")
    assert row is not None
    doc = {"jobs": [{"job_id": world.job, "state": "running", "attempt": 1, "run_ckpt_mtime": time.time()}]}
    return ck.ship_checkpoints(world.ctx, row, status(doc))


def _tree(files: dict[str, bytes]) -> str:
    return filenames.tree_sha256([(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()])


def test_the_newest_complete_directory_comes_home_whole_and_goes_back_whole(world: World) -> None:
    _save(world, 4, HF_FILES, age_s=120)
    # checkpoint-6 was killed mid-save: its weights are there, its trainer_state.json never came
    _save(world, 6, {"model.safetensors": b"half"}, age_s=60)
    assert _ship(world) == [world.job]
    kept = world.home / "checkpoints" / world.job / "run" / "out" / "checkpoint-4"
    assert {p.relative_to(kept).as_posix(): p.read_bytes() for p in kept.rglob("*") if p.is_file()} == HF_FILES
    [row] = world.ctx.ledger.checkpoints(world.job)
    assert (row.file, row.sha256, row.bytes, row.durable_path) == (
        "run/out/checkpoint-4", _tree(HF_FILES), sum(map(len, HF_FILES.values())), str(kept))
    assert not (world.root / "jobs" / world.job / "ckpt" / ".ship.d").exists()  # the private copy is gone
    # the host holds those exact files: nothing moves; a replacement's empty disk gets the whole dir back
    job = world.job_row()
    assert ck.place_checkpoint(world.ctx, job, "local") == "kept the host's own checkpoint (same files)"
    jdir = world.root / "jobs" / world.job
    (jdir / "run" / "out" / "checkpoint-4" / "optimizer.pt").write_bytes(b"torn")
    (jdir / "run" / "out" / "checkpoint-4" / "stray.bin").write_bytes(b"not in the copy")
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint run/out/checkpoint-4/"
    placed = jdir / "run" / "out" / "checkpoint-4"
    assert {p.relative_to(placed).as_posix(): p.read_bytes() for p in placed.rglob("*") if p.is_file()} == HF_FILES
    assert not list((jdir / "run" / "out").glob("*.gpuq-incoming"))
    # a newer complete directory replaces the kept one (one copy per job)
    _save(world, 8, dict(HF_FILES, **{"trainer_state.json": b'{"global_step": 8}'}), age_s=30)
    assert _ship(world) == [world.job]
    assert sorted(p.name for p in kept.parent.iterdir()) == ["checkpoint-8"]


def test_a_directory_still_being_written_is_not_shipped(world: World) -> None:
    _save(world, 4, HF_FILES, age_s=0)  # complete, but written this instant: the trainer may still be at it
    assert _ship(world) == []
    assert world.ctx.ledger.checkpoints(world.job) == []


@pytest.mark.honest
def test_a_retry_that_restarted_from_scratch_is_loud_and_counted(world: World) -> None:
    """Requeued "with resume", the retry found no checkpoint: the history, the alert and `gpuq results`
    say it restarted from scratch (never that it resumed)."""
    from orchestrator.api import results
    from orchestrator.core.states import AttemptState, JobState
    from orchestrator.tick.findings import TickReport, resumed

    ledger = world.ctx.ledger
    ledger.requeue(world.job, message="killed: requeued with resume (retry 1 of 2)", end_attempt=AttemptState.LOST)
    ledger.start_attempt(world.job, host="local", bundle_sha="b" * 64)
    ledger.transition(world.job, AttemptState.RUNNING, attempt=2)
    ledger.transition(world.job, JobState.RUNNING)
    job = world.job_row()
    line = 'no file matched checkpoint ["out/checkpoint-*"] in the run dir'
    doc = status({"jobs": [{"job_id": world.job, "state": "running", "attempt": 2,
                            "scan": {"attempt": 2, "log_to": 10, "from_scratch": line}}]})
    assert doc is not None
    resumed(world.ctx, "local", [job], {e.job_id: e for e in doc.jobs}, TickReport())
    message = 'a a2: restarted from scratch: no file matched `checkpoint` ["out/checkpoint-*"] in its run dir'
    assert message in world.events()
    [alert] = [a for a in ledger.alerts() if a.subject == world.job]
    assert (alert.severity, alert.rule, alert.message) == ("escalate", "from_scratch", message)
    [row] = results(world.ctx, sweep="qaaaaaa")
    assert row.restarts_from_scratch == 1
