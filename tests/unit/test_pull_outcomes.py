"""`gpuq pull`'s outcomes word for word: each state's reason, the records it writes (ledger pull
rows, PULL_VERIFIED, the quarantine's PROVENANCE) and every refusal of the host's answer.

tests/unit/test_transfer.py checks the transfer's behaviour; this file pins what the user reads
and what later pulls rely on, so that a changed word or field fails (scripts/mutation.py pull).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError, HostError, HostUnreachable
from orchestrator.core.specs import CommandResult
from orchestrator.host_documents import ManifestReply
from orchestrator.transfer import (
    ALREADY,
    INCOMPLETE,
    NOT_PULLED,
    PROVENANCE,
    PULL_VERIFIED,
    QUARANTINED,
    VERIFIED,
    backoff_delay,
    durable,
    job_copy,
)
from orchestrator.transfer import pull as pull_mod
from orchestrator.transfer.job_copy import PullOutcome
from orchestrator.transfer.pull import request_manifests, sweep_lock
from tests.support.jobtree import SHA, finished_job
from tests.support.pullworld import SWEEP, World

pytestmark = pytest.mark.honest  # no silent wrong answer (docs/testing.md)

UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _manifest_sha(world: World, job_id: str) -> str:
    return hashlib.sha256((world.final(world.ledger.job(job_id)) / protocol.JOB_MANIFEST_FILE).read_bytes()).hexdigest()


def test_a_verified_pull_word_for_word(world: World) -> None:
    job = world.jobs[0]
    [out] = world.pull([job])
    final = world.final(job)
    manifest = json.loads((final / protocol.JOB_MANIFEST_FILE).read_text())
    size = sum(int(f["bytes"]) for f in manifest["files"])
    assert out == PullOutcome(job.id, job.name, SWEEP, "fake", VERIFIED, "", files=6, bytes=size,
                              local_dir=str(final), transferred=size)
    assert out.verified
    record = json.loads((final / PULL_VERIFIED).read_text())
    stamp = record.pop("verified_at")
    assert UTC.match(stamp), stamp
    assert record == {"schema": job_copy.PULL_VERIFIED_SCHEMA, "queue_id": SWEEP, "job_id": job.id, "name": job.name,
                      "attempt": 1, "host": "fake", "manifest_sha256": _manifest_sha(world, job.id), "files": 6,
                      "bytes": size}
    [row] = world.ledger.pulls([job.id])
    assert (row.state, row.attempt, row.host, row.files, row.bytes, row.local_dir, row.reason,
            row.manifest_sha256) == (VERIFIED, 1, "fake", 6, size, str(final), "", record["manifest_sha256"])
    assert [p.name for p in final.parent.iterdir()] == [job.id]  # no staging dir or temp file left
    # a second pull answers from the ledger with the same figures
    [again] = world.pull([job])
    assert again == PullOutcome(job.id, job.name, SWEEP, "fake", ALREADY, "", files=6, bytes=size,
                                local_dir=str(final), transferred=0)
    assert again.verified and not PullOutcome("j", "n", "s", "h", INCOMPLETE).verified


def test_a_missing_verified_record_means_the_job_is_pulled_again(world: World) -> None:
    job = world.jobs[0]
    world.pull([job])
    (world.final(job) / PULL_VERIFIED).unlink()  # the ledger's mark alone is not proof
    [out] = world.pull([job])
    assert out.state == NOT_PULLED
    assert out.reason == (f"{world.final(job)} exists without a valid verification record; {world.final(job)} is kept "
                          "(verified results are never overwritten); move it away and pull again")


@pytest.mark.parametrize(("reply", "why"), [
    ({"error": "exited 4 (config error)"}, "exited 4 (config error)"),
    ({"sha256": None}, "no manifest in the agent's reply"),  # a sha256 that is no hash never passes the edge
    ({}, "no manifest in the agent's reply"),
])
def test_a_refused_manifest_word_for_word(world: World, reply: dict[str, Any], why: str) -> None:
    run = job_copy.PullRun(world.ledger, world.host, world.results, world.quarantine, 5, (10.0, 120.0),
                         world.sleeps.append, lambda: 0.0)
    out = job_copy.pull_one(run, world.jobs[0], ManifestReply.model_validate(reply))
    assert (out.state, out.reason) == (NOT_PULLED, f"fake refused to manifest it: {why}")
    assert not world.results.exists()


def test_a_job_missing_from_the_agents_reply(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull_mod, "request_manifests", lambda host, agent, ids: {})
    outcomes = world.pull()
    assert [(o.state, o.reason) for o in outcomes] == [(NOT_PULLED, "fake refused to manifest it: missing from the "
                                                                    "reply")] * 2


def test_a_manifest_that_changed_between_build_and_fetch(world: World) -> None:
    job = world.jobs[0]
    world.host.after_manifest = lambda: world.remote(job, protocol.JOB_MANIFEST_FILE).write_text("{}")
    [out] = world.pull([job])
    assert (out.state, out.reason) == (NOT_PULLED, "manifest from fake unusable: the manifest fetched differs from the "
                                                   "one the agent just built (is another `gpuq pull` running?); pull "
                                                   "again")


def test_a_manifest_fetch_that_never_gets_through(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks[protocol.JOB_MANIFEST_FILE] = [0, 0, 0]
    [out] = world.pull([job], tries=3)
    reason = "manifest not fetched after 3 tries: host fake: connection reset (fake, mid-file)"
    assert (out.state, out.reason) == (INCOMPLETE, reason)
    assert world.sleeps == [10.0, 20.0]


def test_a_manifest_of_another_attempt_is_refused(world: World) -> None:
    job = world.jobs[0]
    finished_job(world.root, job.id, queue_id=SWEEP, attempt=2)
    [out] = world.pull([job])
    reason = ("the host's manifest is of attempt 2 but the ledger's latest attempt is 1; `gpuq status` reconciles, "
              "then pull again")
    assert (out.state, out.reason) == (NOT_PULLED, reason)
    assert (out.files, out.bytes > 0) == (6, True)


def test_a_file_changed_after_collection_word_for_word(world: World) -> None:
    job = world.jobs[0]
    metrics = world.remote(job, "result/metrics.jsonl")
    collected = metrics.read_bytes()
    old = hashlib.sha256(collected).hexdigest()
    world.ledger.record_results(job.id, 1, metrics=[], artifacts=[("result/metrics.jsonl", len(collected), old),
                                                                 ("result/gone.txt", 3, "0" * 64)])
    metrics.write_bytes(collected + b"\n")
    new = hashlib.sha256(collected + b"\n").hexdigest()
    [out] = world.pull([job])
    assert (out.state, out.reason) == (NOT_PULLED, f"result/metrics.jsonl on fake changed after the job finished "
                                                   f"(sha256 {new[:12]}, collected {old[:12]}); inspect "
                                                   f"{world.remote(job, 'result/metrics.jsonl')}")
    # the same bytes with the same size pass: only a change is refused
    metrics.write_bytes(collected)
    assert world.pull([job])[0].state == VERIFIED


def test_an_exhausted_copy_word_for_word(world: World) -> None:
    job = world.jobs[0]
    world.host.breaks["best.pt"] = [10, 10]
    [out] = world.pull([job], tries=2)
    staging = world.staging(job)
    reason = (f"transfer failed 2 times, last: host fake: connection reset (fake, mid-file); partial copy kept in "
              f"{staging}, `gpuq pull` resumes it")
    assert (out.state, out.reason, out.local_dir, out.files) == (INCOMPLETE, reason, str(staging), 6)
    [row] = world.ledger.pulls([job.id])
    assert (row.state, row.reason, row.local_dir, row.files, row.attempt) == (INCOMPLETE, reason, str(staging), 6, 1)
    assert row.bytes == out.bytes > 0


def test_a_file_that_vanished_on_the_host(world: World) -> None:
    job = world.jobs[0]
    world.host.after_manifest = lambda: world.remote(job, "result/plots/curve.csv").unlink()
    [out] = world.pull([job])
    assert out.state == INCOMPLETE
    assert out.reason.endswith(f"; partial copy kept in {world.staging(job)}; `gpuq pull` rebuilds the manifest and "
                               "resumes"), out.reason
    assert [p.state for p in world.ledger.pulls([job.id])] == [INCOMPLETE]


def test_a_quarantine_word_for_word(world: World) -> None:
    job = world.jobs[0]
    metrics = world.remote(job, "result/metrics.jsonl")
    world.host.after_manifest = lambda: metrics.write_bytes(metrics.read_bytes().replace(b"0.75", b"0.76"))
    (world.quarantine / f"{job.id}--a1--sha256-mismatch").mkdir(parents=True)  # an earlier one: not overwritten
    [out] = world.pull([job])
    where = world.quarantine / f"{job.id}--a1--sha256-mismatch-2"
    assert out.state == QUARANTINED and out.local_dir == str(where)
    detail, moved = out.reason.rsplit("; moved to ", 1)
    assert moved == str(where) and detail.startswith("result/metrics.jsonl")
    assert out.transferred == out.bytes and out.files == 6
    [row] = world.ledger.pulls([job.id])
    assert (row.state, row.reason, row.local_dir) == (QUARANTINED, detail, str(where))
    lines = (where / PROVENANCE).read_text().splitlines()
    sha = hashlib.sha256((where / protocol.JOB_MANIFEST_FILE).read_bytes()).hexdigest()
    assert lines[:5] == [
        "gpuq pull moved this copy here instead of marking it verified; nothing was deleted.",
        f"job:      {job.id} ({job.name}) of sweep {SWEEP}, attempt 1",
        f"host:     fake  {world.root / protocol.JOBS_DIR / job.id}",
        f"manifest: sha256 {sha} (MANIFEST.json here, when it arrived)",
        f"failed:   sha256-mismatch: {detail}",
    ]
    assert UTC.match(lines[5].removeprefix("time:     ")), lines[5]
    assert lines[6:] == [f"next:     `gpuq pull --sweep {SWEEP}` fetches a fresh copy; delete this directory only when "
                         "you no longer need the evidence."]
    assert not list(where.glob("*.tmp"))


def test_an_existing_final_dir_is_never_overwritten(world: World) -> None:
    job = world.jobs[0]
    world.pull([job])
    final = world.final(job)
    keep = f"{final} is kept (verified results are never overwritten); move it away and pull again"
    world.ledger.record_pull(job.id, attempt=1, host="fake", state=INCOMPLETE, manifest_sha256="", files=0,
                             total_bytes=0, local_dir="", reason="x")  # the ledger lost its verified mark
    (final / "result" / "plots" / "curve.csv").write_text("edited\n")
    [out] = world.pull([job])
    assert (out.state, out.reason) == (NOT_PULLED, f"{final} no longer matches its manifest (result/plots/curve.csv "
                                                   f"has 7 bytes, the manifest says 22); {keep}")
    finished_job(world.root, job.id, queue_id=SWEEP, extra={"result/new.txt": b"new"})  # the host lists more now
    [out] = world.pull([job])
    assert (out.state, out.reason) == (NOT_PULLED, f"{final} holds a verified copy of a different manifest; {keep}")
    assert not world.staging(job).exists()


def test_a_repaired_ledger_mark_word_for_word(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    job = world.jobs[0]
    real = world.ledger.record_pull
    monkeypatch.setattr(world.ledger, "record_pull", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt)
                        if kw.get("state") == VERIFIED else real(*a, **kw))
    with pytest.raises(KeyboardInterrupt):
        world.pull([job])
    monkeypatch.undo()
    [out] = world.pull([job])
    final = world.final(job)
    size = json.loads((final / PULL_VERIFIED).read_text())["bytes"]
    assert out == PullOutcome(job.id, job.name, SWEEP, "fake", ALREADY, "the ledger mark was missing and is now "
                              "recorded", files=6, bytes=size, local_dir=str(final))
    [row] = world.ledger.pulls([job.id])
    assert (row.state, row.reason, row.files, row.bytes, row.local_dir, row.attempt, row.manifest_sha256) == (
        VERIFIED, "recorded by a later pull (the ledger write was lost)", 6, size, str(final), 1,
        _manifest_sha(world, job.id))


def test_an_unreachable_host_word_for_word(world: World) -> None:
    world.host.down = True
    outcomes = world.pull(tries=2)
    reason = "host unreachable after 2 tries: host fake: connection refused (fake link cut)"
    assert [(o.state, o.reason) for o in outcomes] == [(INCOMPLETE, reason)] * 2
    events = [e.message for e in world.ledger.events(limit=50) if e.subject == "fake"]
    assert "pull: unreachable after 2 tries: host fake: connection refused (fake link cut)" in events


def test_a_local_disk_error_is_incomplete_and_names_the_file(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*a: Any, **kw: Any) -> Any:
        raise OSError(28, "No space left on device", "/results/x")

    monkeypatch.setattr(job_copy, "_copy_files", full)
    [out] = world.pull([world.jobs[0]])
    assert (out.state, out.reason) == (INCOMPLETE, "local file error: No space left on device (/results/x); nothing "
                                                   "was marked verified, `gpuq pull` resumes")
    monkeypatch.setattr(job_copy, "_copy_files", lambda *a, **kw: (_ for _ in ()).throw(OSError("disk gone")))
    [out] = world.pull([world.jobs[0]])
    assert out.reason == "local file error: disk gone; nothing was marked verified, `gpuq pull` resumes"


class _Answer:
    """A host whose agent answers ``manifest`` with a fixed result."""

    name = "h1"

    def __init__(self, code: int, stdout: str = "", stderr: str = "") -> None:
        self.result = CommandResult(host="h1", argv=("agent",), exit_code=code, stdout=stdout, stderr=stderr,
                                    duration_s=0.0)
        self.calls: list[tuple[list[str], float]] = []

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        self.calls.append((argv, timeout))
        return self.result


def test_request_manifests_asks_once_with_a_long_timeout() -> None:
    host = _Answer(0, json.dumps({"c1": {"sha256": "a" * 64}}) + "\n")
    replies = request_manifests(host, ["agent"], ["c1", "c2"])  # type: ignore[arg-type]
    assert list(replies) == ["c1"] and replies["c1"].sha256 == "a" * 64 and replies["c1"].error is None
    assert host.calls == [(["agent", "manifest", "c1", "c2"], pull_mod.MANIFEST_TIMEOUT_S)]
    assert pull_mod.MANIFEST_TIMEOUT_S == 900.0


def test_an_old_agent_or_a_broken_answer_is_a_clear_transfer_error() -> None:
    old = _Answer(protocol.AGENT_EXIT_USAGE, stderr="gpuq_agent.py: error: argument verb: invalid choice: 'manifest'")
    with pytest.raises(HostError) as info:
        request_manifests(old, ["agent"], ["c1"])  # type: ignore[arg-type]
    assert info.value.host == "h1"
    assert str(info.value) == ("host h1: its host agent predates `gpuq pull` (no `manifest` verb); submit any sweep "
                               "to this host with this gpuq to place a newer agent, then pull again")
    usage = _Answer(protocol.AGENT_EXIT_USAGE, stderr="bad job id 'x'")
    with pytest.raises(HostError) as info:
        request_manifests(usage, ["agent"], ["c1"])  # type: ignore[arg-type]
    code = protocol.AGENT_EXIT_USAGE
    assert str(info.value) == f"host h1: the agent could not build manifests (exit {code}): bad job id 'x'"
    quiet = _Answer(1, stdout="not json")
    with pytest.raises(HostError) as info:
        request_manifests(quiet, ["agent"], ["c1"])  # type: ignore[arg-type]
    assert str(info.value).startswith("host h1: the agent could not build manifests (exit 1): ")
    assert len(str(info.value)) > len("host h1: the agent could not build manifests (exit 1): ")  # the parser's reason
    long = _Answer(2, stderr="x" * 400 + "END\n")
    with pytest.raises(HostError) as info:
        request_manifests(long, ["agent"], ["c1"])  # type: ignore[arg-type]
    assert str(info.value) == "host h1: the agent could not build manifests (exit 2): " + ("x" * 297 + "END")
    assert not isinstance(info.value, HostUnreachable)


def test_a_transfer_error_from_the_host_is_every_jobs_outcome(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(host: Any, agent: Any, ids: Any) -> Any:
        raise pull_mod.TransferError("fake", "its host agent predates `gpuq pull`")

    monkeypatch.setattr(pull_mod, "request_manifests", refuse)
    outcomes = world.pull()
    expected = (NOT_PULLED, "host fake: its host agent predates `gpuq pull`")
    assert [(o.state, o.reason) for o in outcomes] == [expected] * 2


def test_two_pulls_of_one_sweep_never_share_it(tmp_path: Path) -> None:
    with sweep_lock(tmp_path / "q1"), pytest.raises(GpuqError) as info, sweep_lock(tmp_path / "q1"):
        pass
    lock = tmp_path / "q1" / ".pull.lock"
    assert str(info.value) == (f"another `gpuq pull` of sweep q1 is running (it holds {lock}); wait for it to "
                               "finish, then pull again")
    with sweep_lock(tmp_path / "q1"):  # released: the next pull gets it
        pass


@pytest.mark.parametrize(("failures", "jitter", "delay"), [
    (1, 2.0, 8.0),  # jitter is clamped to 1: at most 20 % off
    (1, -1.0, 10.0),
    (0, 0.0, 10.0),
    (3, 0.5, 36.0),
    (9, 0.0, 120.0),
])
def test_backoff_clamps_its_jitter(failures: int, jitter: float, delay: float) -> None:
    assert backoff_delay(failures, (10.0, 120.0), jitter) == pytest.approx(delay)


def test_timestamps_are_utc_seconds() -> None:
    assert durable.utc_stamp(0) == "1970-01-01T00:00:00Z"
    assert durable.utc_stamp(1_800_000_000.7) == "2027-01-15T08:00:00Z"
    assert UTC.match(durable.utc_stamp())


def test_the_agents_bundle_is_the_one_asked(world: World) -> None:
    world.pull([world.jobs[0]])
    assert any(SHA in " ".join(call) for call in world.host.calls if "manifest" in call)
