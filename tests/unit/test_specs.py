"""orchestrator/core/specs.py exactly: the value types' defaults and guards, and the identities derived
from a queue (sweep id, job id, spec hash; docs/queue.md)."""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import ValidationError

from orchestrator.core.specs import (
    DEFAULT_EPOCHS,
    Assignment,
    CommandResult,
    HostSlots,
    JobSpec,
    ParsedQueue,
    job_id_for,
    new_queue_id,
    spec_hash_for,
)


def test_queue_ids_are_q_and_six_base32_characters_of_the_first_four_bytes() -> None:
    assert new_queue_id(b"\x00\x00\x00\x00") == "qaaaaaa"
    assert new_queue_id(b"\xff\xff\xff\xff") == "q777777"
    assert new_queue_id(b"\x00\x00\x00\x01\xff") == "qbaaaaa"  # lowest 5 bits first; byte 5 is ignored
    assert new_queue_id(b"\x01\x00\x00\x00") == "qaaaaqa"  # big-endian: 2**24 is 16 << 20
    assert new_queue_id(b"\x12\x34\x56\x78") == "qytvidj"


def test_job_ids_hash_the_sweep_and_the_case_folded_name() -> None:
    expected = "c" + hashlib.sha256(b"qabcdef/baseline").hexdigest()[:12]
    assert job_id_for("qabcdef", "Baseline") == job_id_for("qabcdef", "BASELINE") == expected == "cfab0cb4d311b"
    assert job_id_for("qabcdeg", "baseline") != expected


def _job(**kw: object) -> JobSpec:
    fields: dict[str, object] = {"name": "n", "config": "c.yaml", "task": "t", "epochs": 3, "gpus": 2, "seed": 7,
                                 "config_sha256": "ab"}
    fields.update(kw)
    return JobSpec(**fields)  # type: ignore[arg-type]


def test_the_spec_hash_is_sha256_of_the_canonical_identity() -> None:
    canonical = ('{"config":"c.yaml","config_sha256":"ab","epochs":3,"gpus":2,"name":"n","nodes":1,'
                 '"seed":7,"task":"t"}')
    assert spec_hash_for(_job()) == hashlib.sha256(canonical.encode()).hexdigest()
    with_args = json.loads(canonical) | {"args": ["--lr", "1"]}
    assert spec_hash_for(_job(args=("--lr", "1"))) == hashlib.sha256(
        json.dumps(with_args, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_display_and_placement_fields_never_change_the_hash() -> None:
    base = spec_hash_for(_job())
    for change in ({"line": 9}, {"raw": "x"}, {"host": "h1"}, {"est_min": 5.0}, {"retries": 4}, {"cell": "c"}):
        assert spec_hash_for(_job(**change)) == base, change
    for change in ({"config": "d.yaml"}, {"config_sha256": "cd"}, {"task": "u"}, {"epochs": 4}, {"gpus": 1},
                   {"nodes": 2}, {"seed": None}, {"name": "m"}):
        assert spec_hash_for(_job(**change)) != base, change


def test_job_spec_defaults_and_guards() -> None:
    job = JobSpec(name="n", config="", task="t")
    assert (job.epochs, job.gpus, job.nodes, job.est_min, job.seed, job.host, job.retries) == (
        DEFAULT_EPOCHS, 1, 1, None, None, None, None) == (20, 1, 1, None, None, None, None)
    assert (job.config_sha256, job.args, job.cell, job.line, job.raw) == ("", (), "", 0, "")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        JobSpec(name="n", config="", task="t", gpu_count=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="Instance is frozen"):
        job.gpus = 2  # type: ignore[misc]


@pytest.mark.parametrize("model", [
    ParsedQueue(path="q.txt", workdir="/w", jobs=()),
    CommandResult(host="h", argv=("true",), exit_code=0, stdout="", stderr="", duration_s=0.1),
    HostSlots(host="h", total=1),
    Assignment(job_id="c1", host="h"),
])
def test_value_types_are_frozen(model: object) -> None:
    name = next(iter(type(model).model_fields))  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="Instance is frozen"):
        setattr(model, name, getattr(model, name))


def test_parsed_queue_has_no_warnings_by_default() -> None:
    assert ParsedQueue(path="q.txt", workdir="/w", jobs=()).warnings == ()


def test_host_slots_defaults_and_guards() -> None:
    host = HostSlots(host="h1", total=2)
    assert (host.busy, host.usable, host.slot_free_at, host.disk_free_bytes, host.reason, host.speed) == (
        0, True, (), None, "", 1.0)
    assert HostSlots(host="h1", total=2, slot_free_at=(0.0, 5.0)).slot_free_at == (0.0, 5.0)
    with pytest.raises(ValidationError, match=r"host h1: slot_free_at has 1 entries for 2 slots \[type=value_error"):
        HostSlots(host="h1", total=2, slot_free_at=(1.0,))
    with pytest.raises(ValidationError, match="Input should be greater than 0"):
        HostSlots(host="h1", total=1, speed=0.0)
    assert HostSlots(host="h1", total=1, speed=0.01).speed == 0.01
