"""`gpuq pull`'s transfer: manifest, resumable copy with bounded retries, verification, quarantine.

Hosts are FakeHosts over fabricated host roots (tests/support/jobtree.py) running the real agent's
`manifest` verb; links are cut or broken mid-file on purpose.  No real sleeping: ``sleep`` is
injected and recorded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import protocol
from orchestrator.transfer import (
    ALREADY,
    INCOMPLETE,
    NOT_PULLED,
    PROVENANCE,
    PULL_VERIFIED,
    QUARANTINED,
    VERIFIED,
    backoff_delay,
    verify_copy,
)
from orchestrator.transfer.verify import checkpoint_problem, parse_manifest, pickle_problem, required_files
from tests.support.jobtree import fake_checkpoint, finished_job, pulled_paths
from tests.support.pullworld import SWEEP, World


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# --- the happy path, and not doing it twice ----------------------------------------------------


def test_pull_verifies_every_file_and_marks_the_ledger(world: World) -> None:
    outcomes = world.pull()
    assert [o.state for o in outcomes] == [VERIFIED, VERIFIED], [o.reason for o in outcomes]
    for job, out in zip(world.jobs, outcomes, strict=True):
        final = world.final(job)
        assert out.local_dir == str(final) and out.files == 6 and out.transferred == out.bytes > 0
        got = _tree(final)
        assert set(got) == pulled_paths() | {protocol.JOB_MANIFEST_FILE, PULL_VERIFIED}
        for rel in pulled_paths():
            assert got[rel] == world.remote(job, rel).read_bytes()
        record = json.loads(got[PULL_VERIFIED])
        assert record["manifest_sha256"] == hashlib.sha256(got[protocol.JOB_MANIFEST_FILE]).hexdigest()
        assert (record["job_id"], record["queue_id"], record["attempt"], record["files"]) == (job.id, SWEEP, 1, 6)
        assert not world.staging(job).exists()
    marks = world.ledger.verified_jobs(SWEEP)
    assert set(marks) == {j.id for j in world.jobs} == world.ledger.verified_job_ids()
    assert all(m.manifest_sha256 and m.local_dir for m in marks.values())
    assert world.sleeps == []
    # one manifest round trip for both jobs
    assert sum(1 for call in world.host.calls if "manifest" in call) == 1


def test_a_verified_job_is_not_fetched_again(world: World) -> None:
    world.pull()
    world.host.calls.clear()
    outcomes = world.pull()
    assert [o.state for o in outcomes] == [ALREADY, ALREADY]
    assert world.host.calls == []  # not even a manifest round trip
    assert all(o.transferred == 0 and o.files == 6 for o in outcomes)


def test_a_real_torch_checkpoint_verifies(world: World) -> None:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    torch.save({"model": model.state_dict(), "metrics": {"val_acc": 0.5}}, buf)
    job = world.jobs[0]
    finished_job(world.root, job.id, queue_id=SWEEP, ckpt=buf.getvalue())
    [out] = world.pull([job])
    assert out.state == VERIFIED, out.reason
    assert checkpoint_problem(world.final(job) / "ckpt" / "best.pt") is None


# --- corrupted, altered, incomplete: never verified --------------------------------------------


def test_a_byte_flipped_on_the_host_after_the_manifest_is_quarantined(world: World) -> None:
    job = world.jobs[0]
    metrics = world.remote(job, "result/metrics.jsonl")
    original = metrics.read_bytes()

    def flip() -> None:
        data = bytearray(original)
        data[10] ^= 0x01
        metrics.write_bytes(bytes(data))

    world.host.after_manifest = flip
    [out] = world.pull([job])
    assert out.state == QUARANTINED and "sha256" in out.reason
    assert not world.final(job).exists() and not world.staging(job).exists()
    [qdir] = list(world.quarantine.iterdir())
    assert qdir.name == f"{job.id}--a1--sha256-mismatch"
    provenance = (qdir / PROVENANCE).read_text()
    assert "sha256-mismatch" in provenance and world.host.name in provenance and job.id in provenance
    assert (qdir / "result" / "metrics.jsonl").exists()  # kept as evidence, never deleted
    assert world.ledger.verified_jobs(SWEEP) == {}
    assert [p.state for p in world.ledger.pulls([job.id])] == [QUARANTINED]
    # the host's file is whole again: the next pull uses a fresh staging dir and verifies
    world.host.after_manifest = None
    metrics.write_bytes(original)
    [again] = world.pull([job])
    assert again.state == VERIFIED, again.reason
    assert (qdir / PROVENANCE).exists()
    assert set(world.ledger.verified_jobs(SWEEP)) == {job.id}


def test_a_host_file_changed_since_collection_is_refused_before_any_copy(world: World) -> None:
    job = world.jobs[0]
    metrics = world.remote(job, "result/metrics.jsonl")
    collected = metrics.read_bytes()
    world.ledger.record_results(job.id, 1, metrics=[], artifacts=[
        ("result/metrics.jsonl", len(collected), hashlib.sha256(collected).hexdigest())])
    metrics.write_bytes(collected + b'{"kind": "forged"}\n')
    world.host.gets.clear()
    [out] = world.pull([job])
    assert out.state == NOT_PULLED and "changed after the job finished" in out.reason
    assert [g for g in world.host.gets if not g[0].endswith(protocol.JOB_MANIFEST_FILE)] == []
    assert world.ledger.verified_jobs(SWEEP) == {}


def test_the_host_refusing_a_manifest_is_reported_per_job(world: World) -> None:
    bad, good = world.jobs
    finished_job(world.root, bad.id, queue_id=SWEEP, code=4)
    outcomes = world.pull()
    assert outcomes[0].state == NOT_PULLED and "exited 4" in outcomes[0].reason
    assert outcomes[1].state == VERIFIED
    assert set(world.ledger.verified_jobs(SWEEP)) == {good.id}


def test_a_cut_link_mid_file_is_retried_and_resumed_from_the_partial_size(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks["best.pt"] = [100, 50]
    [out] = world.pull([job])
    assert out.state == VERIFIED, out.reason
    offsets = [off for remote, off in world.host.gets if remote.endswith("best.pt")]
    assert offsets == [0, 100, 150]
    assert world.sleeps == [10.0, 20.0]  # capped exponential backoff (jitter pinned to 0)
    assert out.transferred == out.bytes  # nothing fetched twice


def test_an_exhausted_retry_budget_leaves_an_incomplete_job_that_the_next_pull_resumes(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks["best.pt"] = [64, 64, 64]
    [out] = world.pull([job], tries=3)
    assert out.state == INCOMPLETE and "3 times" in out.reason and str(world.staging(job)) in out.reason
    assert world.sleeps == [10.0, 20.0]
    assert (world.staging(job) / "ckpt" / "best.pt").stat().st_size == 192
    assert not world.final(job).exists() and world.ledger.verified_jobs(SWEEP) == {}
    assert [p.state for p in world.ledger.pulls([job.id])] == [INCOMPLETE]
    world.host.gets.clear()
    [again] = world.pull([job])
    assert again.state == VERIFIED, again.reason
    assert [off for remote, off in world.host.gets if remote.endswith("best.pt")] == [192]
    assert [p.state for p in world.ledger.pulls([job.id])] == [INCOMPLETE, VERIFIED]


def test_an_unreachable_host_is_retried_then_reported_incomplete(world: World) -> None:
    world.host.down = True
    outcomes = world.pull()
    assert [o.state for o in outcomes] == [INCOMPLETE, INCOMPLETE]
    assert "unreachable after 5 tries" in outcomes[0].reason
    assert world.sleeps == [10.0, 20.0, 40.0, 80.0]
    assert not (world.results / SWEEP).exists() or not any((world.results / SWEEP).iterdir())


def test_a_controller_killed_mid_copy_resumes_and_the_ledger_stays_consistent(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks["metrics.jsonl"] = [200]
    world.host.crash = KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        world.pull([job])
    assert world.ledger.pulls([job.id]) == [] and world.ledger.verified_jobs(SWEEP) == {}
    assert (world.staging(job) / "result" / "metrics.jsonl").stat().st_size == 200
    world.host.crash = None
    world.host.gets.clear()
    [out] = world.pull([job])
    assert out.state == VERIFIED, out.reason
    assert [off for remote, off in world.host.gets if remote.endswith("metrics.jsonl")] == [200]


def test_a_partial_longer_than_the_manifest_restarts_from_zero(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks["metrics.jsonl"] = [200]
    world.host.crash = KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        world.pull([job])
    world.host.crash = None
    partial = world.staging(job) / "result" / "metrics.jsonl"
    partial.write_bytes(partial.read_bytes() + b"x" * 100_000)
    world.host.gets.clear()
    [out] = world.pull([job])
    assert out.state == VERIFIED, out.reason
    assert [off for remote, off in world.host.gets if remote.endswith("metrics.jsonl")] == [0]


def test_a_stale_partial_pull_of_other_bytes_is_set_aside_not_resumed(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks["metrics.jsonl"] = [200]
    world.host.crash = KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        world.pull([job])
    world.host.crash = None
    summary = world.remote(job, "result/summary.json")
    summary.write_text(json.dumps({"final": {"val_acc": 0.9}}))  # the host now lists other bytes
    [out] = world.pull([job])
    assert out.state == VERIFIED, out.reason
    [qdir] = list(world.quarantine.iterdir())
    assert qdir.name.endswith("--superseded") and (qdir / "result" / "metrics.jsonl").stat().st_size == 200
    assert (world.final(job) / "result" / "summary.json").read_bytes() == summary.read_bytes()


def test_a_verified_dir_whose_ledger_write_was_lost_is_recorded_by_the_next_pull(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    job = world.jobs[0]
    real = world.ledger.record_pull

    def killed(*args: Any, **kw: Any) -> Any:
        if kw.get("state") == VERIFIED:
            raise KeyboardInterrupt  # the controller dies after the rename, before the ledger write
        return real(*args, **kw)

    monkeypatch.setattr(world.ledger, "record_pull", killed)
    with pytest.raises(KeyboardInterrupt):
        world.pull([job])
    monkeypatch.undo()
    assert (world.final(job) / PULL_VERIFIED).is_file() and world.ledger.verified_jobs(SWEEP) == {}
    world.host.gets.clear()
    [out] = world.pull([job])
    assert out.state == ALREADY and "now recorded" in out.reason
    assert set(world.ledger.verified_jobs(SWEEP)) == {job.id}
    assert [g for g in world.host.gets if not g[0].endswith(protocol.JOB_MANIFEST_FILE)] == []


def test_verified_results_are_never_overwritten(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    job = world.jobs[0]
    real = world.ledger.record_pull
    monkeypatch.setattr(world.ledger, "record_pull", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt)
                        if kw.get("state") == VERIFIED else real(*a, **kw))
    with pytest.raises(KeyboardInterrupt):
        world.pull([job])
    monkeypatch.undo()
    before = _tree(world.final(job))
    with world.remote(job, "result/metrics.jsonl").open("a") as f:
        f.write('{"kind": "eval", "step": 99}\n')
    [out] = world.pull([job])
    assert out.state == NOT_PULLED and "different manifest" in out.reason and "never overwritten" in out.reason
    assert _tree(world.final(job)) == before
    assert world.ledger.verified_jobs(SWEEP) == {}
    assert not world.staging(job).exists()


# --- verification, pure --------------------------------------------------------------------------


def _manifest_of(copy: Path) -> Any:
    """The manifest describing ``copy`` as it is now (so only content checks can object)."""
    files = []
    for rel in sorted(pulled_paths()):
        data = (copy / rel).read_bytes()
        files.append({"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    raw = json.dumps({"schema": protocol.MANIFEST_SCHEMA, "job_id": "cpure", "attempt": 1, "files": files}).encode()
    (copy / protocol.JOB_MANIFEST_FILE).write_bytes(raw)
    return parse_manifest(raw, job_id="cpure")


def _copy(tmp_path: Path) -> tuple[Path, Any]:
    """A local copy that matches its manifest, and the manifest."""
    jdir = finished_job(tmp_path / "root", "cpure")
    copy = tmp_path / "copy"
    for rel in sorted(pulled_paths()):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((jdir / rel).read_bytes())
    (copy / "result" / "x.tmp").write_bytes(b"ignored")
    return copy, _manifest_of(copy)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing": (lambda c: (c / "result" / "summary.json").unlink(), "missing-file"),
    "extra": (lambda c: (c / "result" / "stray.txt").write_text("?"), "unexpected-file"),
    "symlink": (lambda c: os.symlink("summary.json", c / "result" / "alias.json"), "unexpected-file"),
    "short": (lambda c: (c / "result" / "metrics.jsonl").write_bytes(b"{}\n"), "size-mismatch"),
    "flipped": (lambda c: _flip(c / "result" / "plots" / "curve.csv"), "sha256-mismatch"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_copy_fails_on(tmp_path: Path, case: str) -> None:
    copy, manifest = _copy(tmp_path)
    assert verify_copy(copy, manifest) is None
    damage, slug = CASES[case]
    damage(copy)
    problem = verify_copy(copy, manifest)
    assert problem is not None and problem.slug == slug, problem


@pytest.mark.parametrize(("rel", "data", "slug"), [
    ("ckpt/best.pt", b"PK\x03\x04 not really a zip", "bad-checkpoint"),
    ("result/metrics.jsonl", b'{"step": 1}\n{"step": 2, trunc\n', "bad-metrics"),
    ("result/metrics.jsonl", b"\n\n", "bad-metrics"),
    ("result/summary.json", b"{half", "bad-metrics"),
])
def test_content_checks_catch_what_hashes_cannot(tmp_path: Path, rel: str, data: bytes, slug: str) -> None:
    copy, _ = _copy(tmp_path)
    (copy / rel).write_bytes(data)  # the host's bytes were bad all along: sizes and hashes agree
    problem = verify_copy(copy, _manifest_of(copy))
    assert problem is not None and problem.slug == slug and rel in problem.detail, problem


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


@pytest.mark.parametrize(("data", "needle"), [
    (fake_checkpoint(), None),
    (fake_checkpoint([1, 2]), "does not hold a dict"),
    (_zip({"archive/data.pkl": pickle.dumps({"x": _Evil()}, protocol=2)}), "refuses"),
    (_zip({"archive/data.pkl": pickle.dumps({"x": _Evil()}, protocol=4)}), "refuses"),
    (_zip({"archive/data.pkl": pickle.dumps({"a": 1}, protocol=2)[:-3]}), "damaged"),
    (_zip({"archive/other.bin": b"x"}), "no single"),
    # two state dicts in one archive: which one torch.load reads is not the manifest's to guess
    (_zip({"archive/data.pkl": pickle.dumps({"a": 1}, protocol=2),
           "other/data.pkl": pickle.dumps({"b": 2}, protocol=2)}), "no single"),
    (_zip({"archive/sub/data.pkl": pickle.dumps({"a": 1}, protocol=2)}), "no single"),
    (fake_checkpoint()[:-40], "not a readable zip"),
    (b"", "not a readable zip"),
])
def test_checkpoint_checks(tmp_path: Path, data: bytes, needle: str | None) -> None:
    path = tmp_path / "best.pt"
    path.write_bytes(data)
    problem = checkpoint_problem(path)
    assert (problem is None) if needle is None else (problem is not None and needle in problem), problem
    if needle == "no single":
        assert problem == "it is not a torch checkpoint archive (no single <name>/data.pkl)"


_REFUSED = "which torch.load(weights_only=True) refuses"
_MANY = {f"k{i}": f"v{i}" for i in range(300)}  # pushes the memo past 255: LONG_BINPUT / LONG_BINGET


@pytest.mark.parametrize(("data", "problem"), [
    # protocol 2 (what torch.save writes): a global is named inline, past a memo of any size
    (pickle.dumps({"a": OrderedDict(), "b": Counter()}, protocol=2), f"it references collections.Counter, {_REFUSED}"),
    (pickle.dumps({**_MANY, "a": OrderedDict(), "b": Counter()}, protocol=2),
     f"it references collections.Counter, {_REFUSED}"),
    # torch's weights-only unpickler reads protocol 2's opcodes only: protocol 4's framing and
    # stack globals, protocol 0's text opcodes and INST are refused before any global is looked at
    (pickle.dumps({"a": OrderedDict(), "b": Counter()}, protocol=4), f"it uses the pickle opcode FRAME, {_REFUSED}"),
    (pickle.dumps({"a": 1}, protocol=4), f"it uses the pickle opcode FRAME, {_REFUSED}"),
    (b"\x80\x04\x8c\x0bcollectionsq\x00\x8c\x0bOrderedDict\x930h\x00\x8c\x07Counter\x93.",
     f"it uses the pickle opcode SHORT_BINUNICODE, {_REFUSED}"),
    (b"\x80\x04\x93.", f"it uses the pickle opcode STACK_GLOBAL, {_REFUSED}"),
    (pickle.dumps({"a": OrderedDict(), "b": Counter()}, protocol=0), f"it uses the pickle opcode DICT, {_REFUSED}"),
    (b"(iposix\nsystem\np0\n.", f"it uses the pickle opcode INST, {_REFUSED}"),
    (b"\x80\x02.", "it does not hold a dict (a state dict) but STOP"),
    (pickle.dumps([1], protocol=2), "it does not hold a dict (a state dict) but EMPTY_LIST"),
    (pickle.dumps({"a": 1}, protocol=2), None),
    (pickle.dumps({**_MANY, "a": OrderedDict()}, protocol=2), None),
])
def test_pickle_problem_reads_opcodes_as_torch_does(data: bytes, problem: str | None) -> None:
    assert pickle_problem(data) == problem


def test_ordered_dict_top_level_is_a_state_dict() -> None:
    from collections import OrderedDict

    assert pickle_problem(pickle.dumps(OrderedDict(a=1), protocol=2)) is None


def _manifest(files: list[dict[str, Any]], **over: Any) -> bytes:
    doc: dict[str, Any] = {"schema": protocol.MANIFEST_SCHEMA, "job_id": "cpure", "attempt": 1, "files": files}
    doc.update(over)
    return json.dumps(doc).encode()


_GOOD_FILES = [{"path": "ckpt/best.pt", "bytes": 1, "sha256": "a" * 64},
               {"path": "result/metrics.jsonl", "bytes": 1, "sha256": "a" * 64},
               {"path": "attempts/1/exit.json", "bytes": 1, "sha256": "a" * 64}]


def _with(extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [*_GOOD_FILES, extra]


@pytest.mark.parametrize(("raw", "message"), [
    (b"not json", r"^manifest is not JSON: "),
    (_manifest(_GOOD_FILES, schema="gpuq.manifest/9"),
     rf"^manifest schema is 'gpuq.manifest/9', expected '{re.escape(protocol.MANIFEST_SCHEMA)}'$"),
    (b"[1, 2]", rf"^manifest schema is None, expected '{re.escape(protocol.MANIFEST_SCHEMA)}'$"),
    (_manifest(_GOOD_FILES, job_id="cother"), r"^manifest is for job 'cother'$"),
    (_manifest(_GOOD_FILES, job_id=None), r"^manifest is for job None$"),
    (_manifest(_GOOD_FILES, attempt=0), r"^manifest attempt 0 is not a positive integer$"),
    (_manifest(_GOOD_FILES, attempt=True), r"^manifest attempt True is not a positive integer$"),
    (_manifest(_GOOD_FILES, attempt="1"), r"^manifest attempt '1' is not a positive integer$"),
    *[(_manifest(_with({"path": bad, "bytes": 1, "sha256": "a" * 64})), r"^manifest lists an unsafe path: ")
      for bad in ("../escape", "/etc/passwd", "a//b", "result/x.tmp", "PULL_VERIFIED.json", "a\x01b", "a\\b", "./a",
                  "")],
    (_manifest(_with({"path": "ckpt/best.pt", "bytes": 1, "sha256": "a" * 64})), r"^manifest lists a path twice$"),
    (_manifest(_with({"path": "x.bin", "bytes": -1, "sha256": "a" * 64})),
     r"^manifest size of x\.bin is not a byte count: -1$"),
    (_manifest(_with({"path": "x.bin", "bytes": True, "sha256": "a" * 64})),
     r"^manifest size of x\.bin is not a byte count: True$"),
    (_manifest(_with({"path": "x.bin", "bytes": "1", "sha256": "a" * 64})),
     r"^manifest size of x\.bin is not a byte count: '1'$"),
    # the sha256 must be exactly 64 lowercase hex digits
    *[(_manifest(_with({"path": "x.bin", "bytes": 1, "sha256": sha})),
       rf"^manifest sha256 of x\.bin is malformed: {re.escape(repr(sha))}$")
      for sha in ("a" * 63, "a" * 65, "A" * 64, "g" * 64, "", 7, None)],
    (_manifest([]), r"^manifest lists no files$"),
    (_manifest([{"path": "result/metrics.jsonl", "bytes": 1, "sha256": "a" * 64},
                {"path": "attempts/1/exit.json", "bytes": 1, "sha256": "a" * 64}]), r"^manifest lacks ckpt/best\.pt$"),
    (_manifest(_GOOD_FILES[:2]), r"^manifest lacks attempts/1/exit\.json$"),
])
def test_a_malformed_or_unsafe_manifest_is_refused(raw: bytes, message: str) -> None:
    """Each way a manifest can be wrong is refused with its own message (not just any manifest error)."""
    with pytest.raises(ValueError, match=message):
        parse_manifest(raw, job_id="cpure")


def test_a_sound_manifest_is_accepted_exactly() -> None:
    raw = _manifest([*_GOOD_FILES, {"path": "x.bin", "bytes": 0, "sha256": "0123456789abcdef" * 4}], queue_id="q7")
    got = parse_manifest(raw, job_id="cpure")
    assert (got.job_id, got.attempt, got.queue_id) == ("cpure", 1, "q7")
    assert [(e.path, e.size, e.sha256) for e in got.files] == [
        ("attempts/1/exit.json", 1, "a" * 64), ("ckpt/best.pt", 1, "a" * 64),
        ("result/metrics.jsonl", 1, "a" * 64), ("x.bin", 0, "0123456789abcdef" * 4)]
    assert got.sha256 == hashlib.sha256(raw).hexdigest()


@pytest.mark.parametrize(("failures", "jitter", "delay"), [
    (1, 0.0, 10.0), (2, 0.0, 20.0), (3, 0.0, 40.0), (4, 0.0, 80.0), (5, 0.0, 120.0), (9, 0.0, 120.0),
    (1, 1.0, 8.0), (5, 1.0, 96.0),
])
def test_backoff_doubles_to_a_cap_with_bounded_jitter(failures: int, jitter: float, delay: float) -> None:
    assert backoff_delay(failures, (10.0, 120.0), jitter) == pytest.approx(delay)


def _doc(paths: list[str]) -> bytes:
    return json.dumps({"schema": protocol.MANIFEST_SCHEMA, "job_id": "cpure", "attempt": 2, "files": [
        {"path": p, "bytes": 1, "sha256": "a" * 64} for p in paths]}).encode()


def test_a_project_trainer_manifest_needs_only_its_exit_record() -> None:
    """A sweep that checks nothing at finalize (a project's own trainer) needs no best.pt or
    metrics.jsonl, but every manifest carries its attempt's exit record."""
    paths = ["run/outputs/model.safetensors", "run/metrics.csv", "attempts/2/job.log", "attempts/2/exit.json"]
    got = parse_manifest(_doc(paths), job_id="cpure", required=required_files([]))
    assert [e.path for e in got.files] == sorted(paths)
    with pytest.raises(ValueError, match=r"manifest lacks attempts/2/exit\.json"):
        parse_manifest(_doc(paths[:3]), job_id="cpure", required=())
    with pytest.raises(ValueError, match=r"manifest lacks ckpt/best\.pt"):
        parse_manifest(_doc(paths), job_id="cpure", required=required_files(["metrics", "best_ckpt"][1:]))
    assert required_files(["metrics", "best_ckpt"]) == ("result/metrics.jsonl", "ckpt/best.pt")


def _global_pickle(module: str, name: str) -> bytes:
    """{"x": <module.name>(b"")} written by hand: no such object needs to exist here."""
    return (b"\x80\x02}q\x00X\x01\x00\x00\x00xq\x01c" + module.encode() + b"\n" + name.encode()
            + b"\nq\x02)Rq\x03s.")


@pytest.mark.parametrize(("module", "name", "refused"), [
    ("torch", "load", True), ("torch.hub", "load", True), ("torch.serialization", "load", True),
    ("torch._C", "_set_print_stack_traces_on_fatal_signal", True), ("torch.nn.modules.linear", "Linear", True),
    ("torch._utils", "_rebuild_tensor_v2", False), ("torch", "FloatStorage", False),
    ("torch", "BFloat16Storage", False), ("collections", "OrderedDict", False),
])
def test_only_the_globals_a_state_dict_needs_pass(module: str, name: str, refused: bool) -> None:
    """An arbitrary torch.* global may be a callable a hostile host wants run on load; only tensor
    rebuilds, storages and ordered dicts are what a state dict needs."""
    problem = pickle_problem(_global_pickle(module, name))
    assert (problem is not None and "refuses" in problem) if refused else problem is None, problem


@pytest.mark.parametrize(("rel", "content", "problem"), [
    ("result/metrics.jsonl", b'{"a": 1}\n{"a": 2}\n', None),
    ("result/metrics.jsonl", b'{"a": 1}\n\n{"a": 2\n', "result/metrics.jsonl line 2 is not JSON"),
    ("result/metrics.jsonl", b"oops\n", "result/metrics.jsonl line 1 is not JSON"),
    ("result/metrics.jsonl", b"\n  \n", "result/metrics.jsonl is empty"),
    ("result/summary.json", b'{"best": 1}', None),
    ("result/summary.json", b"{", "result/summary.json is not JSON: "),
    ("result/metrics.jsonl", b"\xff\xfe", "result/metrics.jsonl is unreadable: "),
])
def test_metrics_checks_name_the_file_and_line(tmp_path: Path, rel: str, content: bytes, problem: str | None) -> None:
    from orchestrator.transfer.verify import _metrics_problem

    path = tmp_path / "m"
    path.write_bytes(content)
    got = _metrics_problem(path, rel)
    if problem is None or not problem.endswith(": "):
        assert got == problem
    else:
        assert got is not None and got.startswith(problem)


def test_a_verified_record_is_read_only_when_it_is_a_json_object(tmp_path: Path) -> None:
    from orchestrator.transfer.verify import read_verified_record

    assert read_verified_record(tmp_path) is None  # none written
    (tmp_path / PULL_VERIFIED).write_text('{"job_id": "c1"}')
    assert read_verified_record(tmp_path) == {"job_id": "c1"}
    (tmp_path / PULL_VERIFIED).write_text('["c1"]')
    assert read_verified_record(tmp_path) is None
    (tmp_path / PULL_VERIFIED).write_text("{")
    assert read_verified_record(tmp_path) is None


def test_verify_copy_names_each_problem_exactly(tmp_path: Path) -> None:
    from orchestrator.transfer.verify import Manifest, ManifestEntry, Problem, verify_copy

    def entry(rel: str, data: bytes) -> ManifestEntry:
        return ManifestEntry(rel, len(data), hashlib.sha256(data).hexdigest())

    d = tmp_path / "copy"
    (d / "run").mkdir(parents=True)
    (d / "run" / "a.txt").write_bytes(b"aaa")
    (d / "run" / "b.txt").write_bytes(b"bbb")
    (d / "run" / "c.txt.tmp").write_bytes(b"partial")  # a transfer's leftover is not a file of the job
    good = [entry("run/a.txt", b"aaa"), entry("run/b.txt", b"bbb")]

    def check(files: list[ManifestEntry]) -> Problem | None:
        return verify_copy(d, Manifest("c1", 1, "", tuple(files), "0" * 64))

    assert check(good) is None
    assert check([*good, entry("run/x.txt", b"x"), entry("run/y.txt", b"y")]) == Problem(
        "missing-file", "missing 2 file(s): run/x.txt, run/y.txt")
    assert check(good[:1]) == Problem("unexpected-file", "not in the manifest: run/b.txt")
    assert check([good[0], entry("run/b.txt", b"bbbb")]) == Problem(
        "size-mismatch", "run/b.txt has 3 bytes, the manifest says 4")
    wrong = ManifestEntry("run/b.txt", 3, "f" * 64)
    assert check([good[0], wrong]) == Problem(
        "sha256-mismatch", f"run/b.txt has sha256 {hashlib.sha256(b'bbb').hexdigest()[:12]}, the manifest says "
        f"{'f' * 12}")
    (d / "run" / "link").symlink_to(d / "run" / "a.txt")
    (d / "sub").mkdir()
    (d / "sub" / "z.txt").write_bytes(b"z")  # a regular file after the odd ones: the walk goes on
    (d / "dirlink").symlink_to(d / "run")
    assert check([*good, entry("sub/z.txt", b"z")]) == Problem(
        "unexpected-file", "not a regular file: dirlink, run/link")
