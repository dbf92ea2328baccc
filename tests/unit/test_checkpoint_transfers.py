"""What a checkpoint's trip between a host and the controller asks of the host, call by call
(orchestrator/tick/checkpoints.py), through a local host that records every command and transfer:

- every command has a time limit (a hung host never hangs the tick), and each file goes into a directory
  gpuq made first, so a directory that cannot be made is a clear error naming the host before any bytes
  move;
- every checkpoint transfer shows progress under the job's and the host's name, with its size;
- events are about the job; refusals and failed copies are said once, not every tick;
- the controller's copies stay consistent: a copy whose file is gone is no copy, and a project's checkpoint
  shipped again at the same path is replaced, never deleted;
- what a host says stays bounded in what the user reads (its stderr, file names).

The files' contents are checked in test_place_checkpoint.py and test_place_run_checkpoint.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator import host_documents as hd
from orchestrator.core.errors import GpuqError, HostError
from orchestrator.core.specs import CommandResult
from orchestrator.core.states import JobState
from orchestrator.hosts.local import LocalHost
from orchestrator.tick import checkpoints as ck
from orchestrator.transfer import progress as transfer_progress
from tests.support.checkpointworld import World, archive, running_world
from tests.support.jobspecs import spec_doc
from tests.support.jobtree import SHA
from tests.support.wire import status

RUN = {"checkpoint": ["ckpt/*.pt"], "metrics": "logs/train/metrics.csv", "command": ["train.py"]}


class RecordingHost(LocalHost):
    """The local host, recording each command (with its time limit) and each transfer."""

    def __init__(self, original: LocalHost) -> None:
        super().__init__(Path(original.root), name=original.name, python=original.python)
        self.agent_flags = original.agent_flags
        self.commands: list[tuple[tuple[str, ...], object]] = []
        self.puts: list[tuple[str, object]] = []
        self.gets: list[tuple[str, object]] = []

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        self.commands.append((tuple(argv), timeout))
        return super().run(argv, stdin=stdin, timeout=timeout)

    def put(self, local: Path, remote: str, *, progress: Any = None) -> None:
        self.puts.append((remote, progress))
        super().put(local, remote, progress=progress)

    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None, progress: Any = None) -> None:
        self.gets.append((remote, progress))
        super().get(remote, local, offset=offset, size=size, progress=progress)

    def made_dirs(self) -> list[str]:
        return [argv[2] for argv, _ in self.commands if argv[:2] == ("mkdir", "-p")]


class Bars:
    """A progress reporter like the CLI's: one bar per transfer, (what, total) and the bytes seen."""

    def __init__(self) -> None:
        self.shown: list[tuple[str, int]] = []
        self.done: list[int] = []

    @contextlib.contextmanager
    def __call__(self, what: str, total: int) -> Iterator[transfer_progress.Callback]:
        self.shown.append((what, total))
        yield self.done.append


def _recorded(world: World) -> RecordingHost:
    original = world.ctx.fleet.local()
    assert isinstance(original, LocalHost)
    host = RecordingHost(original)
    world.ctx.fleet._hosts["local"] = host
    return host


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from running_world(tmp_path, monkeypatch)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from running_world(tmp_path, monkeypatch, run=json.dumps(RUN))


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> Bars:
    shown = Bars()
    monkeypatch.setattr(transfer_progress, "_reporter", shown)
    monkeypatch.setattr(transfer_progress, "MIN_BYTES", 0)
    return shown


def _project_checkpoint(world: World, data: bytes = b"weights") -> float:
    jdir = world.root / "jobs" / world.job
    (jdir / "run" / "ckpt").mkdir(parents=True, exist_ok=True)
    (jdir / "run" / "logs" / "train").mkdir(parents=True, exist_ok=True)
    (jdir / "spec.json").write_text(json.dumps(spec_doc(job_id=world.job, attempt=1, run=RUN)))
    (jdir / "run" / "ckpt" / "e1.pt").write_bytes(data)
    (jdir / "run" / "logs" / "train" / "metrics.csv").write_text("step,loss\n1,2.0\n")
    return os.path.getmtime(jdir / "run" / "ckpt" / "e1.pt")


def _ship_project(world: World, mtime: float) -> list[str]:
    row = world.ctx.ledger.host("local")
    assert row is not None
    return ck.ship_checkpoints(world.ctx, row, status({"jobs": [{"job_id": world.job, "state": "running", "attempt": 1,
                                                          "run_ckpt_mtime": mtime}]}))


def _job_events(world: World) -> list[tuple[str, str]]:
    return [(e.kind, e.message) for e in world.ctx.ledger.events(subject=world.job) if e.subject == world.job]


def _bounded(host: RecordingHost) -> None:
    limits = [timeout for _, timeout in host.commands]
    assert limits and all(isinstance(t, (int, float)) and 0 < t <= 120 for t in limits), host.commands


def _into_made_dirs(host: RecordingHost) -> None:
    made = host.made_dirs()
    assert host.puts and all(remote.rsplit("/", 1)[0] in made for remote, _ in host.puts), (host.puts, made)


def test_a_payload_checkpoint_round_trip_is_bounded_shown_and_written_into_made_dirs(world: World, bars: Bars) -> None:
    host = _recorded(world)
    pointer = world.save(8, metrics='{"step": 1}\n', best=b"best")
    assert world.ship(pointer) == [world.job]
    assert bars.shown == [(f"checkpoint {world.job} <- local", pointer["bytes"])]
    assert [progress is not None for remote, progress in host.gets if remote.endswith("/.ship.pt")] == [True]
    shutil.rmtree(world.root / "jobs" / world.job)
    bars.done.clear()
    assert ck.place_checkpoint(world.ctx, world.job_row(), "local") == "pushed checkpoint step 8"
    assert bars.shown[1:] == [(f"checkpoint {world.job} -> local", pointer["bytes"])]
    assert bars.done and bars.done[-1] == pointer["bytes"]  # the push itself fed the bar
    jdir = f"{world.root}/jobs/{world.job}"
    assert sorted(set(host.made_dirs())) == [f"{jdir}/ckpt", f"{jdir}/result"]
    _bounded(host)
    _into_made_dirs(host)
    assert _job_events(world)[-1] == ("job", f"checkpoint step 8 ({str(pointer['sha256'])[:12]}) placed on local")


def test_a_projects_checkpoint_round_trip_is_bounded_shown_and_written_into_made_dirs(project: World,
                                                                                      bars: Bars) -> None:
    host = _recorded(project)
    mtime = _project_checkpoint(project)
    assert _ship_project(project, mtime) == [project.job]
    kept = project.home / "checkpoints" / project.job / "run"
    assert (kept / "logs" / "train" / "metrics.csv").read_text() == "step,loss\n1,2.0\n"  # two levels made at home
    shutil.rmtree(project.root / "jobs" / project.job)
    bars.done.clear()
    assert ck.place_checkpoint(project.ctx, project.job_row(), "local") == "pushed checkpoint run/ckpt/e1.pt"
    assert bars.shown == [(f"checkpoint {project.job} <- local", 7), (f"checkpoint {project.job} -> local", 7)]
    assert bars.done and bars.done[-1] == 7  # the push itself fed the bar
    jdir = f"{project.root}/jobs/{project.job}"
    assert sorted(set(host.made_dirs())) == [f"{jdir}/run/ckpt", f"{jdir}/run/logs/train"]
    _bounded(host)
    _into_made_dirs(host)
    events = _job_events(project)
    assert events[-1][0] == "job" and events[-1][1].startswith("checkpoint run/ckpt/e1.pt (")


def test_a_projects_checkpoint_shipped_again_at_the_same_path_replaces_the_copy(project: World) -> None:
    mtime = _project_checkpoint(project, b"epoch 1")
    assert _ship_project(project, mtime) == [project.job]
    _project_checkpoint(project, b"epoch 2")
    os.utime(project.root / "jobs" / project.job / "run" / "ckpt" / "e1.pt", (mtime + 10, mtime + 10))
    assert _ship_project(project, mtime + 10) == [project.job]
    newest = ck.newest_durable(project.ctx, project.job)
    assert newest is not None and Path(newest.durable_path).read_bytes() == b"epoch 2"


def test_a_projects_checkpoint_without_a_time_counts_as_written_at_zero(project: World,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pointer without mtime (an agent that could not stat the file) is no newer than any copy."""
    mtime = _project_checkpoint(project)
    real = ck._fetch_checkpoint

    def without_mtime(*args: Any) -> Any:
        got = real(*args)
        if not isinstance(got, str):
            got = (got[0].model_copy(update={"mtime": None}), got[1])
        return got

    monkeypatch.setattr(ck, "_fetch_checkpoint", without_mtime)
    assert _ship_project(project, mtime) == [project.job]
    [row] = project.ctx.ledger.checkpoints(project.job)
    assert row.written_at == 0.0


def test_a_copy_whose_file_is_gone_is_no_copy(world: World) -> None:
    assert world.ship(world.save(8)) == [world.job]
    newest = ck.newest_durable(world.ctx, world.job)
    assert newest is not None
    Path(newest.durable_path).unlink()  # the user cleaned $GPUQ_HOME
    assert ck.newest_durable(world.ctx, world.job) is None
    assert ck.place_checkpoint(world.ctx, world.job_row(), "local") == "no shipped checkpoint"


def test_refusals_and_failed_copies_are_job_events_said_once(world: World) -> None:
    good = world.save(8)
    assert world.ship(good) == [world.job]

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("true",))

    evil = world.save(16, archive(pickle.dumps({"w": Boom()}, protocol=2)))
    assert world.ship(evil) == [] and world.ship(evil) == []
    refused = [(k, m) for k, m in _job_events(world) if "refused" in m]
    assert refused == [("job", "checkpoint latest-000000016.pt from local refused: it references posix.system, "
                               "which torch.load(weights_only=True) refuses; the controller keeps its previous copy")]
    (world.root / "jobs" / world.job / "ckpt" / "LATEST").unlink()
    assert world.ship(evil) == []
    failed = [(k, m) for k, m in _job_events(world) if "copy from" in m]
    assert [k for k, _ in failed] == ["job"] and failed[0][1].startswith("checkpoint copy from local failed: ")


def test_only_jobs_still_running_on_the_host_are_shipped(world: World) -> None:
    pointer = world.save(8)
    world.ctx.ledger.transition(world.job, JobState.CANCELLED, message="cancelled by the user", of_attempt=1)
    assert world.ship(pointer) == []  # the host's document still says running: stale, not shipped
    assert not (world.home / "checkpoints").exists()


@pytest.mark.parametrize("jobs", [None, 7, {"job_id": "c0123456789ab"}])
def test_a_document_whose_jobs_are_not_a_list_never_reaches_the_shipper(world: World, jobs: object) -> None:
    with pytest.raises(hd.ProtocolError, match="jobs"):
        hd.read_status("local", json.dumps({"schema": "gpuq.status/1", "jobs": jobs}))
    row = world.ctx.ledger.host("local")
    assert row is not None
    assert ck.ship_checkpoints(world.ctx, row, status({"jobs": []})) == []


@pytest.mark.parametrize("job_id", [7, None, ["c0123456789ab"], 1.5])
def test_a_job_id_that_is_not_a_string_never_reaches_the_shipper(world: World, job_id: object) -> None:
    pointer = world.save(8)
    doc = {"schema": "gpuq.status/1", "jobs": [{"job_id": job_id, "state": "running", "ckpt": pointer},
                                               {"job_id": world.job, "state": "running", "ckpt": pointer}]}
    with pytest.raises(hd.ProtocolError, match="job_id"):
        hd.read_status("local", json.dumps(doc))
    row = world.ctx.ledger.host("local")
    assert row is not None
    assert ck.ship_checkpoints(world.ctx, row, status({"jobs": doc["jobs"][1:]})) == [world.job]


class _Answers:
    """A host whose commands answer as given (a HostError instance is raised)."""

    name = "h1"
    python = "python3"
    root = "/r"

    def __init__(self, answer: CommandResult | HostError) -> None:
        self.answer = answer

    def run(self, argv: Any, *, timeout: float = 60.0) -> CommandResult:
        if isinstance(self.answer, HostError):
            raise self.answer
        return self.answer

    def path(self, *parts: str) -> str:
        return "/r/" + "/".join(parts)


def _answer(code: int, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(host="h1", argv=("a",), exit_code=code, stdout=stdout, stderr=stderr, duration_s=0.0)


def test_a_snapshot_that_cannot_be_asked_for_says_why(tmp_path: Path) -> None:
    got = ck._fetch_checkpoint(_Answers(HostError("h1", "connection reset")), SHA, "c1", tmp_path)
    assert got == "host h1: connection reset"


def test_what_a_host_says_is_bounded_in_the_message(tmp_path: Path) -> None:
    said = "x" * 200 + "y" * 400
    assert ck._fetch_checkpoint(_Answers(_answer(1, stderr=said)), SHA, "c1", tmp_path) == "y" * 300
    long_name = "../" + "a" * 120
    snapshot = {"file": long_name, "sha256": "a" * 64, "snapshot": "ckpt/.ship.pt", "bytes": 1}
    got = ck._fetch_checkpoint(_Answers(_answer(0, json.dumps(snapshot))), SHA, "c1", tmp_path)
    assert got == f"the pointer names an unsafe file {long_name[:80]!r}"
    odd_pin = "ckpt/" + "b" * 120
    snapshot = {"file": "latest-000000001.pt", "sha256": "a" * 64, "snapshot": odd_pin, "bytes": 1}
    got = ck._fetch_checkpoint(_Answers(_answer(0, json.dumps(snapshot))), SHA, "c1", tmp_path)
    assert got == f"the agent pinned an unexpected file {odd_pin[:80]!r}"
    with pytest.raises(GpuqError) as raised:
        ck._mkdir(_Answers(_answer(1, stderr="  " + "e" * 300 + "\n")), "h1", "/r/x")
    assert str(raised.value) == "host h1: cannot create /r/x: " + "e" * 200


def test_a_checkpoint_dir_that_cannot_be_made_names_the_host(world: World) -> None:
    world.ship(world.save(8, metrics='{"step": 1}\n'))
    jdir = world.root / "jobs" / world.job
    shutil.rmtree(jdir)
    jdir.mkdir()
    (jdir / "ckpt").write_text("a file where the checkpoint dir belongs")
    with pytest.raises(GpuqError, match=rf"^host local: cannot create {jdir}/ckpt: mkdir: "):
        ck.place_checkpoint(world.ctx, world.job_row(), "local")
    (jdir / "ckpt").unlink()
    (jdir / "result").write_text("a file where the results belong")
    with pytest.raises(GpuqError, match=rf"^host local: cannot create {jdir}/result: mkdir: "):
        ck.place_checkpoint(world.ctx, world.job_row(), "local")


def test_every_node_loads_the_very_same_checkpoint(world: World) -> None:
    """A multi-node resume: a host keeps its own checkpoint only when it is the controller's copy, byte for
    byte; a newer one of its own is replaced, so that every node starts from the same step."""
    pointer = world.save(8)
    assert world.ship(pointer) == [world.job]
    job = world.job_row()
    assert ck.place_checkpoint(world.ctx, job, "local", same_on_every_node=True) == (
        "kept the host's own checkpoint (step 8, the same one)")
    world.save(12, archive(pickle.dumps({"step": 12}, protocol=2)))  # this node ran on past the copy
    assert ck.place_checkpoint(world.ctx, job, "local", same_on_every_node=True) == "pushed checkpoint step 8"
    there = json.loads((world.root / "jobs" / world.job / "ckpt" / "LATEST").read_text())
    assert (there["step"], there["sha256"]) == (8, pointer["sha256"])
    # without the multi-node rule, a host's own newer checkpoint is kept
    world.save(12, archive(pickle.dumps({"step": 12}, protocol=2)))
    assert ck.place_checkpoint(world.ctx, job, "local") == "kept the host's own checkpoint (step 12)"


def test_a_resuming_job_refreshes_its_copy_from_its_last_host_whatever_its_state(world: World) -> None:
    """Before a multi-node job resumes, the newest checkpoint is copied home from its last node 0, even
    though the job is no longer running there; a host that was removed meanwhile is said plainly."""
    assert world.ship(world.save(8)) == [world.job]
    newer = world.save(12, archive(pickle.dumps({"step": 12}, protocol=2)))
    world.ctx.ledger.transition(world.job, JobState.CANCELLED, message="cancelled by the user", of_attempt=1)
    job = world.job_row()
    assert ck.refresh_from(world.ctx, job, "local") is True
    newest = ck.newest_durable(world.ctx, world.job)
    assert newest is not None and (newest.step, newest.sha256, newest.attempt) == (12, newer["sha256"], 1)
    with pytest.raises(GpuqError, match=r"^host gone is no longer registered$"):
        ck.refresh_from(world.ctx, job, "gone")
    (world.root / "jobs" / world.job / "ckpt" / "LATEST").unlink()
    assert ck.refresh_from(world.ctx, job, "local") is False  # nothing to copy: the copy kept stands
    assert ck.newest_durable(world.ctx, world.job).step == 12


def test_a_projects_metrics_dir_that_cannot_be_made_names_the_host(project: World) -> None:
    assert _ship_project(project, _project_checkpoint(project)) == [project.job]
    jdir = project.root / "jobs" / project.job
    shutil.rmtree(jdir)
    (jdir / "run" / "ckpt").mkdir(parents=True)
    (jdir / "run" / "logs").write_text("a file where the metrics dir belongs")
    with pytest.raises(GpuqError, match=rf"^host local: cannot create {jdir}/run/logs/train: mkdir: "):
        ck.place_checkpoint(project.ctx, project.job_row(), "local")


def test_a_resuming_projects_checkpoint_is_refreshed_with_its_metrics(project: World) -> None:
    """refresh_from on a project's own checkpoint copies the metrics file beside it, as the tick's ship does."""
    assert _ship_project(project, _project_checkpoint(project)) == [project.job]
    metrics = project.root / "jobs" / project.job / "run" / "logs" / "train" / "metrics.csv"
    metrics.write_text("step,loss\n1,2.0\n2,1.5\n")
    project.ctx.ledger.transition(project.job, JobState.CANCELLED, message="cancelled by the user", of_attempt=1)
    assert ck.refresh_from(project.ctx, project.job_row(), "local") is True
    kept = project.home / "checkpoints" / project.job / "run" / "logs" / "train" / "metrics.csv"
    assert kept.read_text() == "step,loss\n1,2.0\n2,1.5\n"
