"""Every document a host sends is checked at the edge (docs/security.md): whatever the agent prints,
the readers answer with the document or gpuq's own ProtocolError, never another exception."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator import host_documents as hd
from orchestrator.health.host_lines import host_line
from orchestrator.health.observed import attempt_progress
from orchestrator.health.patrol import HostView, JobView, Thresholds, host_findings, job_findings
from orchestrator.health.stops import interrupted, kernel_oom_kills
from orchestrator.transfer.verify import parse_manifest

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
KEYS = st.sampled_from(["schema", "jobs", "job_id", "attempt", "state", "slots", "disk", "memory", "agent",
                        "kernel", "gpus", "exit", "scan", "hits", "results", "files", "verdict", "checks",
                        "sha256", "file", "snapshot", "step", "ckpt", "free_bytes", "oom_kill", "total",
                        "wrapper_code", "log_to", "path", "bytes", "summary", "candidates", "killed",
                        "progress", "run_ckpt_mtime", "log_mtime", "launched_at", "heartbeat_age_s", "mtime",
                        "epoch", "total", "loss", "line", "xids", "code", "util_pct", "used_pct", "name",
                        "cancel_requested", "traceback", "signature", "metrics_to", "boot_id"])
KEYS = KEYS | st.text(max_size=8)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
                    max_leaves=40)
SCHEMAS = st.sampled_from(["gpuq.status/1", "gpuq.reap/1", "gpuq.health/1", "other"])


def _documents() -> st.SearchStrategy[Any]:
    """Arbitrary JSON, and arbitrary JSON grafted onto the shapes the readers expect."""
    status = st.fixed_dictionaries({"schema": SCHEMAS}, optional={
        "jobs": st.lists(st.dictionaries(KEYS, JSON, max_size=6) | JSON, max_size=3),
        "slots": JSON, "disk": JSON, "memory": JSON, "agent": JSON, "kernel": JSON, "gpus": JSON})
    health = st.fixed_dictionaries({"verdict": st.sampled_from(["pass", "warn", "fail", "x"])},
                                   optional={"checks": JSON})
    keyed = st.dictionaries(st.text(max_size=16), st.dictionaries(KEYS, JSON, max_size=5) | JSON, max_size=3)
    return JSON | status | health | keyed


def _read_all(stdout: str) -> None:
    for name, read in hd.READERS.items():
        try:
            doc = read("h1", stdout)
        except hd.ProtocolError as exc:
            assert exc.host == "h1" and str(exc).startswith("host h1: protocol error: "), name
            continue
        assert isinstance(doc, BaseModel), name  # never the host's raw JSON
        if isinstance(doc, hd.StatusDocument):
            _consume_status(doc)


def _read_manifest_file(raw: bytes) -> None:
    """The MANIFEST.json a host wrote, fetched by `gpuq pull`: its own ValueError, never another."""
    with contextlib.suppress(ValueError):
        parse_manifest(raw, job_id="c0123456789ab")


def _consume_status(doc: hd.StatusDocument) -> None:
    """What a tick does with a status document that passed the reader must not raise either."""
    th = Thresholds(stall_after_s=600, startup_grace_s=300)
    host_findings(HostView("h1", 0, None, 0), doc, th)
    host_line("h1", doc, ())
    for entry in doc.jobs:
        job_findings("h1", JobView(entry.job_id, "n", entry.attempt, 1.0), entry, 2.0, th)
        attempt_progress(entry)
        interrupted(entry)
    kernel_oom_kills(doc)
    assert 0 <= doc.slots.free <= hd.MAX_SLOTS and 0 <= doc.slots.total <= hd.MAX_SLOTS
    [0.0] * doc.slots.total  # a count from a host is fit to size a list
    doc.known_jobs_only(lambda job_id: job_id.startswith("c"))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents(), st.booleans(), st.text(max_size=30))
def test_any_json_is_a_document_or_a_protocol_error(doc: Any, framed: bool, noise: str) -> None:
    try:
        text = json.dumps(doc)
    except ValueError:
        return
    if framed:
        text = f"{noise}\n{hd.BEGIN_MARK}\n{text}\n{hd.END_MARK}\n{noise}"
    _read_all(text)
    _read_manifest_file(text.encode())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_a_document_or_a_protocol_error(raw: bytes) -> None:
    _read_all(raw.decode("utf-8", "replace"))
    _read_all(f"{hd.BEGIN_MARK}\n" + raw.decode("latin-1") + f"\n{hd.END_MARK}")
    _read_manifest_file(raw)


def test_deep_nesting_and_huge_answers_are_protocol_errors() -> None:
    with pytest.raises(hd.ProtocolError):
        hd.read_status("h1", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(hd.ProtocolError, match="characters"):
        hd.read_status("h1", " " * (hd.MAX_DOCUMENT_CHARS + 1))


@pytest.mark.parametrize("doc, why", [
    ([], "a list"),
    ({"schema": "gpuq.status/1", "jobs": [{"state": "running"}]}, "a job without job_id"),
    ({"schema": "gpuq.status/1", "jobs": "x"}, "jobs not a list"),
    ({"schema": "gpuq.status/1", "slots": {"total": "many"}}, "a count that is not one"),
    ({"schema": "gpuq.status/1", "disk": None}, "no disk section"),
    ({"schema": "gpuq.status/1", "jobs": [{"job_id": "c" * 500}]}, "an overlong id"),
    ({"schema": "gpuq.status/1", "jobs": [{"job_id": "c1", "attempt": -1}]}, "a negative attempt"),
    ({"schema": "gpuq.status/1", "gpus": [{"name": "x"}] * (hd.MAX_GPUS + 1)}, "too many GPUs"),
    ({"schema": "gpuq.status/2"}, "another schema"),
])
def test_bad_status_documents_name_the_host_and_the_fault(doc: Any, why: str) -> None:
    with pytest.raises(hd.ProtocolError) as info:
        hd.read_status("rented-1", json.dumps(doc))
    assert "host rented-1: protocol error: " in str(info.value), why


def test_noise_around_a_framed_document_is_ignored_and_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    body = json.dumps({"schema": "gpuq.status/1", "jobs": [{"job_id": "c1", "attempt": 1, "state": "running"}]})
    out = f"hi\nWelcome (conda base)\n{hd.BEGIN_MARK}\n{body}\n{hd.END_MARK}\nbye\n"
    for _ in range(3):
        doc = hd.read_status("noisy-host", out)
        assert doc.jobs[0].job_id == "c1"
    err = capsys.readouterr().err
    assert err.count("noisy-host") == 1 and "shell start-up" in err and "'hi" in err
    # an agent of an older bundle prints its document unframed: still read
    assert hd.read_status("old-agent", body + "\n").jobs[0].state == "running"
    # noise without a frame is not a document
    with pytest.raises(hd.ProtocolError, match="not JSON"):
        hd.read_status("old-agent", "hi\n" + body)


def test_jobs_gpuq_did_not_place_are_dropped() -> None:
    doc = hd.read_status("h", json.dumps({"schema": "gpuq.status/1", "jobs": [
        {"job_id": "cmine", "state": "running"}, {"job_id": "../../victim", "state": "exited"},
        {"job_id": "cforeign", "state": "queued"}]}))
    kept = doc.known_jobs_only({"cmine"}.__contains__)
    assert [j.job_id for j in kept.jobs] == ["cmine"]


def test_a_fetched_manifest_is_read_through_its_model() -> None:
    """MANIFEST.json (`gpuq pull`) is a host document like the others: hd.read_job_manifest checks its shape
    (the schema protocol.py names, bounded fields), transfer/verify.py what a pull asks of it."""
    import typing

    from orchestrator.core import protocol

    assert typing.get_args(hd.JobManifest.model_fields["schema_"].annotation) == (protocol.MANIFEST_SCHEMA,)
    good = {"path": "attempts/1/exit.json", "bytes": 1, "sha256": "a" * 64}
    doc = {"schema": protocol.MANIFEST_SCHEMA, "job_id": "c0123456789ab", "attempt": 1, "files": [good],
           "queue_id": 7, "total_bytes": 1}
    got = hd.read_job_manifest(json.dumps(doc).encode())
    assert (got.job_id, got.attempt, got.queue_id, got.files) == ("c0123456789ab", 1, None, [hd.ManifestFile(**good)])
    assert parse_manifest(json.dumps(doc).encode(), job_id="c0123456789ab", required=()).queue_id == ""
    for files, why in (({"a": 1}, "manifest files: Input should be a valid array"),
                       ([dict(good, path="a/" * 4100 + "b")], "manifest lists an unsafe path: ")):
        with pytest.raises(ValueError) as err:
            hd.read_job_manifest(json.dumps(dict(doc, files=files)).encode())
        assert str(err.value).startswith(why) and "\n" not in str(err.value)
