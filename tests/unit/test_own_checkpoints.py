"""What in a job's run dir is the job's own (payload/agent/gpuq_records/gpuq_own.py, docs/checkpoints.md): the one
file-name rule the host and the controller share, which checkpoint ``{checkpoint}`` names (never one
reached through a link into the project; a link the job made to its own file counts; a directory only
when complete), and the line that makes a retry without a checkpoint loud.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import filenames
from tests.support.agentmodule import load_agent_module

pytestmark = pytest.mark.honest  # no silent wrong answer (docs/testing.md)

own = load_agent_module("gpuq_records.gpuq_own")
launch = load_agent_module("gpuq_attempt.gpuq_launch", qualified=True)
scan = load_agent_module("gpuq_watch.gpuq_scan")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")


def _run(rule: dict[str, Any]) -> Any:
    """The spec's ``run`` as the agent parses it (one glob given as a string, as gpuq.toml allows)."""
    globs = rule["checkpoint"]
    return jobspec.parse_run({"checkpoint": [globs] if isinstance(globs, str) else globs})

# real names of real trainers: Lightning, HF Trainer, DCP, Hydra, a user's own
ORDINARY = ["epoch=19-step=40.ckpt", "last.ckpt", "checkpoint-500", "model.safetensors", "trainer_state.json",
            ".metadata", "step+1@host,x y.pt", "2026-11-26_12-00-00", "résumé.pt", "-leading-dash", "x" * 255]
UNSAFE = ["", ".", "..", "a/b", "a\\b", "a\nb", "a\x00b", "a\x1bb", "a\x7fb", "a\x85b", "x" * 256, "é" * 128,
          "a\udcffb"]


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_names_travel_on_both_sides(name: str) -> None:
    assert own.name_problem(name) is None
    assert filenames.name_problem(name) is None


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_names_are_refused_on_both_sides_for_the_same_reason(name: str) -> None:
    why = own.name_problem(name)
    assert why is not None and why == filenames.name_problem(name)


def test_both_sides_hash_a_directory_alike() -> None:
    entries = [{"path": "b/x y.bin", "bytes": 3, "sha256": "b" * 64}, {"path": "a=1", "bytes": 0, "sha256": "a" * 64}]
    assert own.tree_sha256(entries) == filenames.tree_sha256([(e["path"], e["bytes"], e["sha256"]) for e in entries])


def _write(path: Path, data: bytes = b"x", mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_lightning_save_last_link_is_the_jobs_own_checkpoint(tmp_path: Path) -> None:
    """``save_last: link`` makes last.ckpt a symlink to the job's own epoch file: it counts as that file."""
    run = tmp_path / "run"
    ckpts = run / "lightning_logs" / "version_0" / "checkpoints"
    _write(ckpts / "epoch=1-step=4.ckpt", mtime=1000)
    (ckpts / "last.ckpt").symlink_to("epoch=1-step=4.ckpt")
    found = launch.newest_checkpoint(str(run), _run({"checkpoint": "**/last.ckpt"}))
    assert found == str(ckpts / "last.ckpt")
    # a link out of the run dir is never the job's
    (ckpts / "last.ckpt").unlink()
    (ckpts / "last.ckpt").symlink_to(_write(tmp_path / "elsewhere.ckpt"))
    assert launch.newest_checkpoint(str(run), _run({"checkpoint": "**/last.ckpt"})) is None


def test_a_checkpoint_reached_through_the_projects_link_is_never_the_jobs(tmp_path: Path) -> None:
    """An old lightning_logs/ of the project, linked into the run dir: the first attempt must not get it."""
    bundle = tmp_path / "bundles" / "sha" / "workdir"
    _write(bundle / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", b"the user's stale run")
    run = tmp_path / "jobs" / "c1" / "run"
    run.mkdir(parents=True)
    launch.link_project(str(bundle), str(run), _run({"checkpoint": "**/last.ckpt"}))
    assert (run / "lightning_logs").is_symlink()
    assert launch.newest_checkpoint(str(run), _run({"checkpoint": "**/last.ckpt"})) is None
    assert launch.resume_note(str(run), _run({"checkpoint": "**/last.ckpt"}), 1) is None
    found, refused = own.scan(str(run), ["**/last.ckpt", "**"], bundles=str(tmp_path / "bundles"))
    assert (found, refused) == ([], [])  # the project's links are not the job's, and not a refusal either


def test_the_newest_complete_checkpoint_directory_wins(tmp_path: Path) -> None:
    run = tmp_path / "run"
    now = time.time()
    for step, age in ((2, 300), (4, 200)):
        for name in ("model.safetensors", "trainer_state.json"):
            _write(run / "out" / f"checkpoint-{step}" / name, b"{}", mtime=now - age)
    _write(run / "out" / "checkpoint-6" / "model.safetensors", mtime=now - 100)  # killed mid-save: no marker
    _write(run / "out" / "checkpoint-8" / "trainer_state.json", b"{}", mtime=now - 90)
    _write(run / "out" / "checkpoint-8" / "model.safetensors.tmp", mtime=now - 90)  # a partial file
    (run / "out" / "checkpoint-9").mkdir()  # empty
    _write(run / "out" / "checkpoint-7" / "model.safetensors", mtime=now - 95)
    _write(run / "out" / "checkpoint-7" / "trainer_state.json", b'{"global_step": 7, "log_hi', mtime=now - 95)
    rule = {"checkpoint": "out/checkpoint-*"}
    assert launch.newest_checkpoint(str(run), _run(rule)) == str(run / "out" / "checkpoint-4")
    assert own.dir_problem(str(run / "out" / "checkpoint-6")) == \
        "it has no completion marker (trainer_state.json, .metadata)"
    assert own.dir_problem(str(run / "out" / "checkpoint-8")) == "it holds a partial file model.safetensors.tmp"
    assert own.dir_problem(str(run / "out" / "checkpoint-9")) == "it is empty"
    assert own.dir_problem(str(run / "out" / "checkpoint-7")) == "its trainer_state.json is cut short"
    # while the job runs, a directory written a moment ago may still be growing: not shipped yet
    _write(run / "out" / "checkpoint-4" / "extra.bin")
    assert own.newest_checkpoint(str(run), "out/checkpoint-*", settle_s=own.SETTLE_S).rel == "out/checkpoint-2"
    assert own.newest_checkpoint(str(run), "out/checkpoint-*").rel == "out/checkpoint-4"
    # a glob ending in ** asks for the files under it, not for directories
    assert own.newest_checkpoint(str(run), "out/**").kind == "file"


def test_a_retry_without_a_checkpoint_says_so_and_the_scan_finds_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rule = {"checkpoint": ["**/last.ckpt"]}
    assert launch.resume_note(str(run), _run(rule), 1) is None  # a first attempt starts fresh by design
    note = launch.resume_note(str(run), _run(rule), 2)
    assert note == 'gpuq: restarted from scratch: no file matched checkpoint ["**/last.ckpt"] in the run dir'
    assert launch.resume_note(str(run), _run({"checkpoint": []}), 2) is None  # no globs: nothing gpuq could pass
    log = _write(tmp_path / "job.log", f"=== gpuq start ===\n{note}\nepoch 0\n".encode())
    assert scan.scan_log(str(log), 0)["from_scratch"] == 'no file matched checkpoint ["**/last.ckpt"] in the run dir'
    _write(run / "ckpts" / "last.ckpt")
    assert launch.resume_note(str(run), _run(rule), 2) == "gpuq: resuming from checkpoint ckpts/last.ckpt"
    assert "from_scratch" not in scan.scan_log(str(log), log.stat().st_size)
