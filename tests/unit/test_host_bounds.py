"""Every count a host reports is bounded at the edge and clamped again where it becomes a size; every
number it reports is a finite JSON number (docs/security.md: a host that lies about its slots, a NaN
metric).  Also: the typed fields the controller reads (host_documents/)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator import api
from orchestrator import host_documents as hd
from orchestrator.core.errors import LedgerError
from orchestrator.core.specs import MAX_SLOTS, HostSlots, JobSpec
from orchestrator.ledger import HostRow, Ledger
from orchestrator.scheduling.estimates import EpochRates
from orchestrator.scheduling.placements import PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.tick.capacity import capacities
from orchestrator.tick.collect import record_collected

HUGE = 10**12


def _status(**doc: Any) -> str:
    return json.dumps({"schema": "gpuq.status/1", **doc})


# --- counts: bounded at the edge ---------------------------------------------------------------


@pytest.mark.parametrize(("doc", "where"), [
    ({"slots": {"kind": "gpu", "total": HUGE, "free": 0}}, "slots.total"),
    ({"slots": {"kind": "gpu", "total": 8, "free": HUGE}}, "slots.free"),
    ({"slots": {"total": "8"}}, "slots.total"),  # a number, never a string that looks like one
    ({"slots": {"total": True}}, "slots.total"),
    ({"gpus": [{"index": HUGE}]}, "gpus.0.index"),
    ({"jobs": [{"job_id": "c1", "slots": [HUGE]}]}, "jobs.0.slots.0"),
    ({"jobs": [{"job_id": "c1", "attempt": HUGE}]}, "jobs.0.attempt"),
    ({"jobs": [{"job_id": "c1", "nodes": [{"rank": HUGE}]}]}, "jobs.0.nodes.0.rank"),
    ({"slurm": {"jobs": HUGE}}, "slurm.jobs"),
    # the agent reports at most 20 attempts it retried itself (gpuq_retry.MAX_CHAIN): a stand-in claiming 2,000
    ({"jobs": [{"job_id": "c1", "host_retried": [{"attempt": k} for k in range(1, 2_001)]}]}, "jobs.0.host_retried"),
])
def test_a_count_beyond_sane_is_a_protocol_error_naming_the_field(doc: dict[str, Any], where: str) -> None:
    with pytest.raises(hd.ProtocolError) as info:
        hd.read_status("liar", _status(**doc))
    assert str(info.value).startswith(f"host liar: protocol error: bad status document ({where}: ")


def test_the_host_audit_bounds_cpus_and_gpus() -> None:
    facts = {"root": "/r", "version": [3, 11], "writable": True}
    assert hd.read_facts("h", json.dumps({**facts, "cpus": 64})).cpus == 64
    for bad in ({"cpus": HUGE}, {"cpus": 0}, {"gpus": [{"index": HUGE}]}, {"version": [HUGE]}):
        with pytest.raises(hd.ProtocolError, match="bad host audit document"):
            hd.read_facts("h", json.dumps({**facts, **bad}))


def test_the_largest_sane_slot_count_still_passes() -> None:
    doc = hd.read_status("big", _status(slots={"kind": "slurm", "total": MAX_SLOTS, "free": MAX_SLOTS}))
    assert doc.slots.total == MAX_SLOTS


# --- counts: clamped where they become a size (issue 23.4) --------------------------------------


def test_a_slot_count_an_older_gpuq_stored_never_becomes_a_huge_list(gpuq_home: Path,
                                                                       tmp_path: Path) -> None:
    """A host once reported 10**12 slots and an older gpuq stored them: a later `gpuq submit` (its
    plan over every host's capacity) used to die with MemoryError.  The count is clamped where it
    becomes a list, and writing it to the ledger again clamps it too."""
    ctx = api.open_context()
    try:
        ctx.ledger.add_host(HostRow(name="liar", kind="ssh", root="/r", slots_kind="gpu", slots_total=HUGE,
                                    created_at=0.0))
        rows = [r for r in ctx.ledger.hosts() if r.name == "liar"]
        [cap] = capacities(ctx.ledger, ctx.settings, rows, EpochRates())
        assert cap.total == MAX_SLOTS and len(cap.slot_free_at) == MAX_SLOTS
        assert plan([PlanJob("j", 2, 60.0)], [cap]).assignments[0].host == "liar"
        (tmp_path / "configs").mkdir()
        (tmp_path / "configs" / "a.yaml").write_text("seed: 1\n")
        queue = tmp_path / "queue.txt"
        queue.write_text("configs/a.yaml classify\n")
        result = api.submit(ctx, queue, hosts=["liar"], dry_run=True)
        assert set(result.placements.values()) == {"liar"}
        ctx.ledger.update_host("liar", slots_total=HUGE)
        row = ctx.ledger.host("liar")
        assert row is not None and row.slots_total == MAX_SLOTS
    finally:
        ctx.close()


def test_the_scheduler_never_sizes_a_list_from_an_unbounded_count() -> None:
    slots = HostSlots(host="h", total=HUGE, busy=HUGE)
    assert (slots.total, slots.busy) == (MAX_SLOTS, MAX_SLOTS)
    assert plan([PlanJob("j", 1, 60.0)], [HostSlots(host="h", total=HUGE)]).assignments[0].host == "h"


# --- numbers: finite at the edge; a NaN metric never reaches the ledger (issue 23.10) -----------


def _collect(final: dict[str, Any]) -> str:
    return json.dumps({"c0123456789ab": {"attempt": 1, "summary": {"final": final, "best": final}}})


def test_a_nan_metric_never_reaches_the_ledger(tmp_path: Path) -> None:
    """Before, the summary's NaN went into the metrics table and every later `gpuq results` failed
    with an IntegrityError.  Now only finite metrics are recorded; the run's other results still are."""
    doc = hd.read_collect("h1", _collect({"val_loss": math.nan, "val_acc": 0.5, "acc2": math.inf, "step": 3}))
    row = doc.root["c0123456789ab"].summary
    assert row is not None and row.final is not None
    assert row.final.metrics() == {"val_acc": 0.5}
    ledger = Ledger(tmp_path / "ledger.db")
    spec = JobSpec(name="c", config="c.yaml", config_sha256="0" * 64, task="t", epochs=1, line=1, raw="c.yaml t 1")
    job = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q", workdir=str(tmp_path), queue_text="", jobs=[spec],
                           default_retries=0)[0]
    record_collected(ledger, {job.id: doc.root["c0123456789ab"]})
    assert sorted((m.scope, m.name, m.value, m.step) for m in ledger.metrics([job.id])) == [
        ("best", "val_acc", 0.5, 3), ("final", "val_acc", 0.5, 3)]
    # the ledger's own guard: a non-finite value handed to it is refused whole, and nothing changes
    with pytest.raises(LedgerError, match="not a finite number"):
        ledger.record_results(job.id, 1, metrics=[("final", "loss", math.nan, 1, None)], artifacts=[])
    assert len(ledger.metrics([job.id])) == 2


@pytest.mark.parametrize("field", ["heartbeat_age_s", "log_mtime", "run_ckpt_mtime"])
def test_non_finite_times_are_dropped(field: str) -> None:
    doc = hd.read_status("h", _status(jobs=[{"job_id": "c1", field: math.nan}]))
    assert getattr(doc.jobs[0], field) is None


def test_a_nan_in_a_field_that_must_be_a_number_is_a_protocol_error() -> None:
    with pytest.raises(hd.ProtocolError, match="curves"):
        hd.read_collect("h", json.dumps({"c1": {"summary": {"curves": {"loss": [[1, math.nan]]}}}}))
    with pytest.raises(hd.ProtocolError, match=r"c1\.ckpt\.written_at"):
        hd.read_collect("h", json.dumps({"c1": {"ckpt": {"sha256": "a" * 64, "written_at": math.inf}}}))


# --- the fields the controller reads, typed ----------------------------------------------------


def test_times_are_epoch_seconds_whatever_the_host_wrote() -> None:
    doc = hd.read_status("h", _status(jobs=[{
        "job_id": "c1", "launched_at": "2026-01-01T00:00:00Z",
        "exit": {"wrapper_code": 3, "started_at": "2026-01-01T00:00:00Z", "ended_at": 1767225660.5,
                 "vanished": True, "slurm_time_limit": True, "last_step": 40, "phase": "train"},
        "heartbeat": {"time": 1767225600.0, "step": 40, "loss": 0.25, "steps_per_s": 2.5}}]))
    entry = doc.jobs[0]
    assert entry.launched_at == 1767225600.0
    assert entry.exit is not None and (entry.exit.started_at, entry.exit.ended_at) == (1767225600.0, 1767225660.5)
    assert (entry.exit.vanished, entry.exit.slurm_time_limit, entry.exit.last_step, entry.exit.phase) == (
        True, True, 40, "train")
    assert entry.beat is not None and (entry.beat.step, entry.beat.loss, entry.beat.steps_per_s) == (40, 0.25, 2.5)


def test_what_a_trainer_writes_is_dropped_when_it_does_not_fit_never_the_document() -> None:
    doc = hd.read_status("h", _status(jobs=[{
        "job_id": "c1", "heartbeat": {"step": "12", "loss": "nan", "time": "yesterday", "epoch": 1.5},
        "progress": {"step": True, "loss": 1e400, "pct": 250.0, "line": 7},
        "ckpt": {"file": 3, "step": "x", "sha256": "a" * 64}, "exit": ["not", "a", "record"]}]))
    entry = doc.jobs[0]
    assert entry.heartbeat is not None and entry.heartbeat.model_dump(exclude_unset=True) == {
        "step": None, "loss": None, "time": None, "epoch": None}
    assert entry.progress is not None and (entry.progress.step, entry.progress.loss, entry.progress.line) == (
        None, None, None)
    assert entry.progress.pct == 250.0
    assert entry.ckpt is not None and (entry.ckpt.file, entry.ckpt.step, entry.ckpt.sha256) == (None, None, "a" * 64)
    assert entry.exit is None


def test_an_empty_heartbeat_says_nothing() -> None:
    doc = hd.read_status("h", _status(jobs=[{"job_id": "c1", "heartbeat": {}}]))
    assert doc.jobs[0].heartbeat is not None and doc.jobs[0].beat is None


def test_unknown_fields_are_kept_but_never_named() -> None:
    doc = hd.read_status("h", _status(newer_minor={"x": 1}, jobs=[{"job_id": "c1", "future": [1, 2]}]))
    assert doc.model_extra == {"newer_minor": {"x": 1}} and doc.jobs[0].model_extra == {"future": [1, 2]}
