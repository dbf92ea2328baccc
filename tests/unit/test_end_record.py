"""The attempt's end record (payload/agent/gpuq_records/gpuq_outputs.py, docs/results.md): what the wrapper hashes as
an attempt ends well, what `collect` carries of it, how the controller keeps it, and a pull held to it
word for word.  Real files, the real agent (in process, and as a subprocess through the FakeHost), a
real ledger; tests/integration/test_end_record_e2e.py drives the same through sshd and a project's trainer.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.core import protocol
from orchestrator.host_documents import Outputs, Results
from orchestrator.tick.collect import collect
from orchestrator.transfer import NOT_PULLED, VERIFIED
from orchestrator.transfer.verify import Manifest, ManifestEntry, end_record_changes
from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc
from tests.support.jobtree import SHA
from tests.support.pullworld import SWEEP, World

outputs = load_agent_module("gpuq_records.gpuq_outputs")
files_mod = load_agent_module("gpuq_base.gpuq_files")
inbox = load_agent_module("gpuq_records.gpuq_inbox")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
P = load_agent_module("gpuq_base.gpuq_protocol")

pytestmark = pytest.mark.honest  # no silent wrong answer (docs/testing.md)

JOB = "c000000000001"
RUN = {"command": ["train.py"], "launcher": "python", "checkpoint": ["output/*.pth.tar"], "outputs": ["logs/**"]}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _run_job(root: Path, run: dict[str, Any] | None = None) -> Path:
    """A [run] job's tree as its trainer left it: checkpoints, hard links between them, a log dir."""
    jdir = root / P.JOBS_DIR / JOB
    (jdir / P.ATTEMPTS_DIR / "1").mkdir(parents=True)
    (jdir / P.SPEC_FILE).write_text(json.dumps(spec_doc(job_id=JOB, attempt=1, run=run or RUN)))
    out = jdir / P.RUN_DIR / "output"
    out.mkdir(parents=True)
    for epoch in (1, 2):
        (out / f"checkpoint-{epoch}.pth.tar").write_bytes(os.urandom(300_000) + b"%d" % epoch)
    os.link(out / "checkpoint-2.pth.tar", out / "last.pth.tar")
    os.link(out / "checkpoint-2.pth.tar", out / "model_best.pth.tar")
    (out / "notes.txt").write_text("no glob matches me")
    (jdir / P.RUN_DIR / "logs" / "train").mkdir(parents=True)
    (jdir / P.RUN_DIR / "logs" / "train" / "events.jsonl").write_text('{"step": 1}\n')
    return jdir


def _record(root: Path) -> dict[str, Any]:
    spec = jobspec.parse_spec(json.loads((root / P.JOBS_DIR / JOB / P.SPEC_FILE).read_text()))
    adir = root / P.JOBS_DIR / JOB / P.ATTEMPTS_DIR / "1"
    return outputs.record(files_mod.Layout(str(root)), JOB, 1, spec, str(adir))


def _written(root: Path) -> dict[str, Any]:
    return json.loads((root / P.JOBS_DIR / JOB / P.ATTEMPTS_DIR / "1" / P.OUTPUTS_FILE).read_text())


def test_the_end_record_lists_every_result_file_and_reads_each_inode_once(tmp_path: Path) -> None:
    jdir = _run_job(tmp_path)
    said = _record(tmp_path)
    doc = _written(tmp_path)
    names = ["checkpoint-1.pth.tar", "checkpoint-2.pth.tar", "last.pth.tar", "model_best.pth.tar"]
    want = ["run/logs/train/events.jsonl", *(f"run/output/{n}" for n in names)]
    assert [f["path"] for f in doc["files"]] == want  # sorted; notes.txt matches no glob
    for entry in doc["files"]:
        data = (jdir / entry["path"]).read_bytes()
        assert (entry["bytes"], entry["sha256"]) == (len(data), _sha(data))
    total = sum(f["bytes"] for f in doc["files"])
    linked = (jdir / "run/output/last.pth.tar").stat().st_size
    assert doc["hashed_bytes"] == total - 2 * linked  # three names of one inode, read once
    assert (doc["schema"], doc["job_id"], doc["attempt"], doc["error"]) == (P.OUTPUTS_SCHEMA, JOB, 1, None)
    assert (doc["total_files"], doc["total_bytes"]) == (5, total)
    assert said == {"outputs": {"files": 5, "bytes": total, "hashed_bytes": doc["hashed_bytes"],
                                "seconds": doc["seconds"], "error": None}, "best_sha256": None}


def test_what_cannot_travel_or_passes_a_bound_is_recorded_as_why_not(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    jdir = _run_job(tmp_path)
    os.mkfifo(jdir / "run/output/pipe.pth.tar")
    said = _record(tmp_path)
    doc = _written(tmp_path)
    assert doc["files"] == [] and "'output/pipe.pth.tar': not a regular file" in doc["error"]
    assert said["outputs"]["error"] == doc["error"] and said["outputs"]["files"] == 0
    os.unlink(jdir / "run/output/pipe.pth.tar")
    monkeypatch.setattr(P, "OUTPUTS_MAX_FILES", 4)
    assert "5 result files, more than the 4 an end record lists" in _record(tmp_path)["outputs"]["error"]
    monkeypatch.undo()
    deep = jdir / "run" / "logs" / "/".join(["d" * 200] * 6)
    deep.mkdir(parents=True)
    (deep / "x.txt").write_text("x")
    assert "a path of more than 1024 characters" in _record(tmp_path)["outputs"]["error"]
    # a record that cannot be written is said in exit.json: a training that succeeded is not failed for it
    adir = jdir / P.ATTEMPTS_DIR / "1"
    (adir / P.OUTPUTS_FILE).unlink()
    (adir / P.OUTPUTS_FILE).mkdir()
    said = _record(tmp_path)["outputs"]
    assert said["files"] == 0 and said["error"].startswith("cannot write outputs.json: ")


def test_collect_carries_the_record_and_never_hashes_again(tmp_path: Path) -> None:
    jdir = _run_job(tmp_path)
    _record(tmp_path)
    raw = (jdir / P.ATTEMPTS_DIR / "1" / P.OUTPUTS_FILE).read_bytes()
    got = inbox.collect_one(str(tmp_path), JOB, write=False)
    assert got["files"] == []
    doc = _written(tmp_path)
    assert got["outputs"] == {"attempt": 1, "sha256": _sha(raw), "bytes": len(raw), "files": doc["files"],
                              "seconds": doc["seconds"], "error": None}
    # a record that is gone while exit.json says it was written is carried as an error, never as "none"
    (jdir / P.ATTEMPTS_DIR / "1" / P.EXIT_FILE).write_text(json.dumps({"wrapper_code": 0, "outputs": {"files": 5}}))
    (jdir / P.ATTEMPTS_DIR / "1" / P.OUTPUTS_FILE).unlink()
    gone = inbox.collect_one(str(tmp_path), JOB, write=False)["outputs"]
    assert gone["error"] == "attempts/1/outputs.json: it is gone, though exit.json says it was written"
    assert (gone["files"], gone["sha256"]) == ([], None)
    (jdir / P.ATTEMPTS_DIR / "1" / P.OUTPUTS_FILE).symlink_to(jdir / P.SPEC_FILE)  # never followed
    assert "cannot read it" in inbox.collect_one(str(tmp_path), JOB, write=False)["outputs"]["error"]


def test_the_controller_reads_the_record_strictly_and_keeps_its_rows() -> None:
    entry = {"path": "run/output/last.pth.tar", "bytes": 3, "sha256": "a" * 64}
    doc = Results.model_validate({"attempt": 2, "files": [], "outputs": {
        "attempt": 2, "files": [entry], "sha256": "b" * 64, "bytes": 99, "seconds": 0.5, "error": None}})
    assert doc.artifacts() == [("run/output/last.pth.tar", 3, "a" * 64), ("attempts/2/outputs.json", 99, "b" * 64)]
    unread = Outputs.model_validate({"attempt": 2, "error": "gone"})
    assert unread.artifacts() == [("attempts/2/outputs.json", 0, "")]  # a record no file can match
    for bad in ({**entry, "path": "run/../../etc/passwd"}, {**entry, "path": "/etc/passwd"},
                {**entry, "path": "run/a\x1bb"}, {**entry, "path": "r/" * 600}, {**entry, "bytes": -1}):
        with pytest.raises(ValidationError):
            Outputs.model_validate({"attempt": 1, "files": [bad]})
    with pytest.raises(ValidationError):
        Outputs.model_validate({"attempt": 1, "files": [entry] * (protocol.OUTPUTS_MAX_FILES + 1)})
    # another attempt's record is not this one's: the files hashed at collect time are
    other = Results.model_validate({"attempt": 3, "files": [entry], "outputs": {"attempt": 2, "files": []}})
    assert other.artifacts() == [("run/output/last.pth.tar", 3, "a" * 64)]


def test_the_differences_from_an_end_record_are_named_in_path_order() -> None:
    def manifest(*entries: tuple[str, int, str]) -> Manifest:
        return Manifest(JOB, 1, SWEEP, tuple(ManifestEntry(*e) for e in entries), "0" * 64)

    evidence = [("attempts/1/exit.json", 9, "e" * 64), ("attempts/1/job.log", 9, "f" * 64)]
    recorded = {"a.pt": (1, "1" * 64), "b.pt": (1, "2" * 64), "attempts/1/outputs.json": (5, "3" * 64)}
    same = manifest(("a.pt", 1, "1" * 64), ("b.pt", 1, "2" * 64), ("attempts/1/outputs.json", 5, "3" * 64), *evidence)
    assert end_record_changes(same, recorded) == []  # the log and the exit record are evidence
    moved = manifest(("a.pt", 1, "9" * 64), ("c.pt", 1, "4" * 64), ("attempts/1/outputs.json", 5, "3" * 64))
    assert end_record_changes(moved, {**recorded, "attempts/1/outputs.json": (0, "")}) == [
        "a.pt (sha256 999999999999, recorded 111111111111)", "attempts/1/outputs.json (sha256 333333333333, "
        "recorded unreadable)", "b.pt (gone)", "c.pt (new)"]


def _ended(world: World, job_id: str) -> None:
    """The wrapper's end record for a fabricated job, then the tick's collect through the real agent."""
    root = world.root
    spec = jobspec.parse_spec(spec_doc(job_id=job_id, attempt=1))
    outputs.record(files_mod.Layout(str(root)), job_id, 1, spec, str(world.remote(world.ledger.job(job_id),
                                                                                 "attempts/1")))
    collect(world.ledger, world.host, SHA, [job_id])


def test_an_end_record_the_ledger_never_got_is_no_weaker_check(world: World) -> None:
    job = world.jobs[0]
    outputs.record(files_mod.Layout(str(world.root)), job.id, 1, jobspec.parse_spec(spec_doc(job_id=job.id, attempt=1)),
                   str(world.remote(job, "attempts/1")))  # on the host, but never collected
    [out] = world.pull([job])
    assert (out.state, out.reason) == (NOT_PULLED, (
        f"the ledger holds no end record of attempt 1 (its results were not collected when it ended); "
        f"`gpuq results --sweep {SWEEP}` collects them, then pull again"))
    collect(world.ledger, world.host, SHA, [job.id])
    assert world.pull([job])[0].state == VERIFIED


def test_a_pull_is_held_to_the_end_record_word_for_word(world: World) -> None:
    job, other = world.jobs
    _ended(world, job.id)
    _ended(world, other.id)
    arts = {a.path: a for a in world.ledger.artifacts(job.id)}
    assert set(arts) == {"result/metrics.jsonl", "result/summary.json", "result/plots/curve.csv", "ckpt/best.pt",
                         "attempts/1/outputs.json"}
    curve = world.remote(job, "result/plots/curve.csv")
    before = curve.read_bytes()
    curve.write_bytes(before.replace(b"0.5", b"0.6"))  # same size
    world.remote(job, "result/extra.txt").write_text("added later")
    world.remote(job, "result/summary.json").unlink()
    # a later collect of the same attempt (`gpuq results`) never replaces what was recorded as it ended
    collect(world.ledger, world.host, SHA, [job.id])
    assert {a.path: a.sha256 for a in world.ledger.artifacts(job.id)} == {p: a.sha256 for p, a in arts.items()}
    [out, fine] = world.pull()
    new = hashlib.sha256(curve.read_bytes()).hexdigest()
    assert (out.state, out.reason) == (NOT_PULLED, (
        f"3 file(s) on fake differ from what attempt 1 left when it ended: result/extra.txt (new), "
        f"result/plots/curve.csv (sha256 {new[:12]}, recorded {arts['result/plots/curve.csv'].sha256[:12]}), "
        f"result/summary.json (gone); nothing was copied; inspect {world.root / 'jobs' / job.id}"))
    assert not world.final(job).exists() and not world.ledger.pulls([job.id])
    assert fine.state == VERIFIED and (world.final(other) / "attempts/1/outputs.json").is_file()
    # the record itself is held too: a host that rewrites it to match its changed files is refused
    curve.write_bytes(before)
    (world.remote(job, "result/summary.json")).write_text("{}")
    world.remote(job, "result/extra.txt").unlink()
    outputs.record(files_mod.Layout(str(world.root)), job.id, 1, jobspec.parse_spec(spec_doc(job_id=job.id, attempt=1)),
                   str(world.remote(job, "attempts/1")))
    [again] = world.pull([job])
    assert again.state == NOT_PULLED and "attempts/1/outputs.json (sha256" in again.reason
    assert "result/summary.json (sha256" in again.reason and "curve.csv" not in again.reason
