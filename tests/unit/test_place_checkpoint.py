"""Checkpoints between hosts and the controller (orchestrator/tick/checkpoints.py): which a tick ships
home, what travels with them, how a resume places them on a host, and every refusal word for word.

Runs against the local host with the real host agent (`snapshot`); tests/unit/test_ship_checkpoint.py
covers hostile documents and checkpoints (scripts/mutation.py checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import HostError
from orchestrator.core.specs import CommandResult
from orchestrator.host_documents import Pointer
from orchestrator.hosts.base import too_big
from orchestrator.tick import checkpoints as ck
from tests.support.checkpointworld import World, archive, running_world
from tests.support.jobtree import SHA
from tests.support.wire import status


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from running_world(tmp_path, monkeypatch)


def test_a_shipped_checkpoint_brings_its_best_and_whole_metric_lines(world: World) -> None:
    pointer = world.save(8, metrics='{"step": 1}\n{"step": 2}\n{"step": 3, "lo', best=b"best bytes")
    assert world.ship(pointer) == [world.job]
    kept = world.home / "checkpoints" / world.job
    assert world.kept() == [f"{world.job}/LATEST", f"{world.job}/best.pt", f"{world.job}/latest-000000008.pt",
                            f"{world.job}/metrics.jsonl"]
    assert (kept / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'  # the half line stays behind
    assert (kept / "best.pt").read_bytes() == b"best bytes"
    assert json.loads((kept / "LATEST").read_text()) == pointer
    [row] = world.ctx.ledger.checkpoints(world.job)
    assert (row.step, row.sha256, row.durable_path, row.host, row.attempt) == (
        8, pointer["sha256"], str(kept / "latest-000000008.pt"), "local", 1)
    assert not (world.root / "jobs" / world.job / "ckpt" / ".ship.pt").exists()  # the pin is gone
    assert ck.newest_durable(world.ctx, world.job).step == 8


def test_only_a_newer_checkpoint_is_shipped_and_the_old_copy_goes(world: World) -> None:
    first = world.save(8)
    assert world.ship(first) == [world.job]
    assert world.ship(first) == []  # the same bytes: nothing to do
    older = dict(first, sha256="0" * 64, step=4)
    assert world.ship(older) == []  # an older step is never shipped over a newer one
    second = world.save(16, archive(b"\x80\x02}q\x00X\x01\x00\x00\x00wK\x02s."))
    assert world.ship(second) == [world.job]
    assert world.kept() == [f"{world.job}/LATEST", f"{world.job}/latest-000000016.pt"]
    assert [c.durable_path != "" for c in world.ctx.ledger.checkpoints(world.job)] == [False, True]


@pytest.mark.parametrize("entry", [
    {"state": "exited"},  # only running jobs
    {"job_id": "c" + "0" * 12},  # not a job the ledger placed on this host
    {"job_id": "../x"},
])
def test_entries_that_are_not_shipped(world: World, entry: dict[str, Any]) -> None:
    pointer = world.save(8)
    row = world.ctx.ledger.host("local")
    assert row is not None
    doc = {"jobs": [{"job_id": world.job, "state": "running", "attempt": 1, "ckpt": pointer, **entry}]}
    assert ck.ship_checkpoints(world.ctx, row, status(doc)) == []
    assert ck.ship_checkpoints(world.ctx, row, status({"jobs": [{"job_id": world.job, "state": "running"}]})) == []
    assert not (world.home / "checkpoints").exists() or world.kept() == []


def test_entries_not_shipped_never_stop_the_ones_after_them(world: World) -> None:
    pointer = world.save(8)
    row = world.ctx.ledger.host("local")
    assert row is not None
    skipped: list[Any] = [{"job_id": world.job, "state": "exited", "ckpt": pointer},
                          {"job_id": "c" + "0" * 12, "state": "running", "ckpt": pointer},
                          {"job_id": world.job, "state": "running"},  # neither pointer nor project mtime
                          {"job_id": world.job, "state": "running", "run_ckpt_mtime": True}]  # no time: none
    doc = {"jobs": [*skipped, {"job_id": world.job, "state": "running", "attempt": 3, "ckpt": pointer}]}
    assert ck.ship_checkpoints(world.ctx, row, status(doc)) == [world.job]
    # the attempt the host reported is the checkpoint's; without one, the job's current attempt
    assert [c.attempt for c in world.ctx.ledger.checkpoints(world.job)] == [3]
    newer = world.save(9, archive(pickle.dumps({"step": 9}, protocol=2)))
    assert world.ship(newer, attempt=0) == [world.job]  # the host names no attempt (a string never passes the edge)
    assert [c.attempt for c in world.ctx.ledger.checkpoints(world.job)] == [3, 1]
    # an entry no newer than the kept copy is passed over, and the next one is still read
    newest = world.save(10, archive(pickle.dumps({"step": 10}, protocol=2)))
    doc = {"jobs": [{"job_id": world.job, "state": "running", "ckpt": newer},
                    {"job_id": world.job, "state": "running", "ckpt": newest}]}
    assert ck.ship_checkpoints(world.ctx, row, status(doc)) == [world.job]
    assert ck.newest_durable(world.ctx, world.job).step == 10


def test_a_failed_copy_is_an_event_once_and_nothing_is_kept(world: World) -> None:
    pointer = world.save(8)
    (world.root / "jobs" / world.job / "ckpt" / "latest-000000008.pt").unlink()
    (world.root / "jobs" / world.job / "ckpt" / "LATEST").unlink()
    assert world.ship(pointer) == []
    assert world.ship(pointer) == []
    failures = [m for m in world.events() if m.startswith("checkpoint copy from local failed: ")]
    assert len(failures) == 1, world.events()
    assert world.kept() == []


def test_placing_pushes_the_controllers_copy_with_its_companions(world: World) -> None:
    job = world.job_row()
    assert ck.place_checkpoint(world.ctx, job, "local") == "no shipped checkpoint"
    pointer = world.save(8, metrics='{"step": 1}\n', best=b"best")
    world.ship(pointer)
    # the host still has it: kept, nothing pushed
    assert ck.place_checkpoint(world.ctx, job, "local") == "kept the host's own checkpoint (step 8)"
    jdir = world.root / "jobs" / world.job
    shutil.rmtree(jdir)  # the disk of a replacement: empty
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint step 8"
    assert (jdir / "ckpt" / "latest-000000008.pt").read_bytes() == archive()
    assert (jdir / "ckpt" / "best.pt").read_bytes() == b"best"
    assert (jdir / "result" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert json.loads((jdir / "ckpt" / "LATEST").read_text()) == {
        "file": "latest-000000008.pt", "step": 8, "epoch": 1, "sha256": pointer["sha256"], "bytes": pointer["bytes"],
        "written_at": 1008.0}
    assert world.events()[-1] == f"checkpoint step 8 ({pointer['sha256'][:12]}) placed on local"
    assert not (world.home / "checkpoints" / world.job / ".LATEST.push").exists()
    # a host whose own checkpoint is older gets the newer one
    (jdir / "ckpt" / "LATEST").write_text(json.dumps({"file": "latest-000000004.pt", "step": 4}))
    assert ck.place_checkpoint(world.ctx, job, "local") == "pushed checkpoint step 8"


class _Host:
    """A host whose agent answers ``snapshot`` with a fixed result."""

    name = "h1"
    python = "python3"
    root = "/r"

    def __init__(self, code: int, stdout: str = "", stderr: str = "") -> None:
        self.result = CommandResult(host="h1", argv=("a",), exit_code=code, stdout=stdout, stderr=stderr,
                                    duration_s=0.0)

    def run(self, argv: Any, *, timeout: float = 60.0) -> CommandResult:
        return self.result

    def path(self, *parts: str) -> str:
        return "/r/" + "/".join(parts)


@pytest.mark.parametrize(("code", "stdout", "stderr", "why"), [
    (1, "", "  gpuq snapshot: no checkpoint yet  \n", "gpuq snapshot: no checkpoint yet"),
    (1, "", "", "the agent pinned no checkpoint"),
    (0, "not json", "", "not json"),
    (0, json.dumps({"file": "latest-000000001.pt", "sha256": "a" * 64}), "", ""),  # no snapshot named
    (0, json.dumps({"file": "../x.pt", "sha256": "a" * 64, "snapshot": "ckpt/.ship.pt", "bytes": 1}), "",
     "the pointer names an unsafe file '../x.pt'"),
    (0, json.dumps({"file": "latest-000000001.pt", "sha256": "a" * 64, "snapshot": "ckpt/other.pt", "bytes": 1}), "",
     "the agent pinned an unexpected file 'ckpt/other.pt'"),
    (0, json.dumps({"file": "latest-000000001.pt", "sha256": "a" * 64, "snapshot": "ckpt/.ship.pt"}), "",
     "the pointer's sha256 or size is malformed"),
])
def test_why_nothing_was_copied(tmp_path: Path, code: int, stdout: str, stderr: str, why: str) -> None:
    got = ck._fetch_checkpoint(_Host(code, stdout, stderr), SHA, "c1", tmp_path)
    assert isinstance(got, str)
    if why:
        assert got == why
    else:
        assert got == stdout[-300:]
    assert list(tmp_path.iterdir()) == []


def test_a_failed_snapshot_is_never_copied_even_with_a_pointer(tmp_path: Path) -> None:
    pointer = json.dumps({"file": "latest-000000001.pt", "sha256": "a" * 64, "snapshot": "ckpt/.ship.pt",
                          "bytes": 1})
    assert ck._fetch_checkpoint(_Host(1, pointer), SHA, "c1", tmp_path) == pointer  # no copy was tried
    assert list(tmp_path.iterdir()) == []


class _CopyHost(_Host):
    """A host whose agent pinned ``data`` (None: the copy breaks off before a byte arrives)."""

    def __init__(self, data: bytes | None, *, size: int | None = None, sha: str | None = None,
                 rm_fails: bool = False) -> None:
        real = data or b""
        pointer = {"file": "latest-000000001.pt", "step": 1, "snapshot": "ckpt/.ship.pt",
                   "sha256": sha or hashlib.sha256(real).hexdigest(), "bytes": len(real) if size is None else size}
        super().__init__(0, json.dumps(pointer))
        self.data, self.rm_fails = data, rm_fails
        self.gets: list[tuple[str, int | None]] = []
        self.removed: list[list[str]] = []

    def run(self, argv: Any, *, timeout: float = 60.0) -> CommandResult:
        if argv[0] != "rm":
            return self.result
        self.removed.append(list(argv))
        if self.rm_fails:
            raise HostError(self.name, "connection dropped")
        return CommandResult(host="h1", argv=tuple(argv), exit_code=0, stdout="", stderr="", duration_s=0.0)

    def get(self, remote: str, local: Path, *, size: int | None = None, progress: Any = None) -> None:
        self.gets.append((remote, size))
        if self.data is None:
            raise HostError(self.name, "download broke off")
        if size is not None and len(self.data) > size:
            raise too_big(self.name, remote, len(self.data), size)
        local.write_bytes(self.data)


def test_the_pinned_copy_is_fetched_within_its_size_and_unpinned(tmp_path: Path) -> None:
    host = _CopyHost(b"")  # an empty file is a size like any other
    got = ck._fetch_checkpoint(host, SHA, "c1", tmp_path)
    assert not isinstance(got, str), got
    pointer, part = got
    assert (part, part.read_bytes()) == (tmp_path / ".checkpoint.part", b"")
    assert pointer.model_dump(exclude_unset=True, exclude={"snapshot"}) == {
        "file": "latest-000000001.pt", "step": 1, "sha256": hashlib.sha256(b"").hexdigest(), "bytes": 0}
    assert host.gets == [("/r/jobs/c1/ckpt/.ship.pt", 0)]
    assert host.removed == [["rm", "-f", "/r/jobs/c1/ckpt/.ship.pt"]]
    # the pin cannot be removed (the link dropped after the copy): the copy still counts
    assert not isinstance(ck._fetch_checkpoint(_CopyHost(b"abc", rm_fails=True), SHA, "c1", tmp_path), str)


@pytest.mark.parametrize(("host", "why"), [
    (_CopyHost(None), "host h1: download broke off"),
    (_CopyHost(b"abcdef", size=3), str(too_big("h1", "/r/jobs/c1/ckpt/.ship.pt", 6, 3))),
    (_CopyHost(b"abc", sha="0" * 64), "latest-000000001.pt did not match its pointer (torn or replaced)"),
    (_CopyHost(b"abc", size=4), "latest-000000001.pt did not match its pointer (torn or replaced)"),
])
def test_a_copy_that_breaks_off_or_does_not_match_leaves_nothing(tmp_path: Path, host: _CopyHost, why: str) -> None:
    assert ck._fetch_checkpoint(host, SHA, "c1", tmp_path) == why
    assert list(tmp_path.iterdir()) == []


def test_a_host_pointer_that_is_not_json_means_the_controllers_copy_is_pushed(world: World) -> None:
    world.ship(world.save(8))
    (world.root / "jobs" / world.job / "ckpt" / "LATEST").write_text("{not json")
    assert ck.place_checkpoint(world.ctx, world.job_row(), "local") == "pushed checkpoint step 8"
    assert json.loads((world.root / "jobs" / world.job / "ckpt" / "LATEST").read_text())["step"] == 8


@pytest.mark.parametrize(("have", "pointer", "newer"), [
    (None, {}, True),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "a", "step": 9}, False),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "b", "step": 6}, True),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "b", "step": 5}, False),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "b", "step": True, "mtime": 11.0}, True),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "b", "mtime": 10.0}, False),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "b", "mtime": 10.5}, True),
    ({"sha256": "a", "step": 5, "written_at": 10.0}, {"sha256": "b", "mtime": "11"}, False),
])
def test_which_checkpoint_is_newer(have: dict[str, Any] | None, pointer: dict[str, Any], newer: bool) -> None:
    class Row:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    assert ck._is_newer(Row(**have) if have else None, Pointer.model_validate(pointer)) is newer


@pytest.mark.parametrize(("mode", "kind", "provider", "wanted"), [
    ("never", "ssh", "runpod", False), ("auto", "local", "", False), ("always", "local", "", False),
    ("auto", "ssh", "", False), ("auto", "ssh", "lambda", True), ("always", "ssh", "", True),
])
def test_which_hosts_ship(mode: str, kind: str, provider: str, wanted: bool) -> None:
    class Settings:
        ship_checkpoints = mode

    class Row:
        pass

    row = Row()
    row.kind, row.provider = kind, provider  # type: ignore[attr-defined]
    assert ck.ship_wanted(Settings(), row) is wanted  # type: ignore[arg-type]


def test_a_growing_file_is_copied_to_its_last_whole_line(tmp_path: Path) -> None:
    class Host:
        def get(self, remote: str, local: Path) -> None:
            local.write_bytes(Path(remote).read_bytes())

    src = tmp_path / "m.jsonl"
    src.write_bytes(b"a\nb\nhalf")
    ck._fetch_whole_lines(Host(), str(src), tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == b"a\nb\n"
    src.write_bytes(b"no newline yet")
    ck._fetch_whole_lines(Host(), str(src), tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == b""
    ck._fetch_whole_lines(Host(), str(src), tmp_path / "x.pt")  # a checkpoint is binary: kept whole
    assert (tmp_path / "x.pt").read_bytes() == b"no newline yet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "out.jsonl", "x.pt"]  # no .part left
