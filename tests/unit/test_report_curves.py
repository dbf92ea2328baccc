"""Learning curves for gpuq report: the agent's downsampled curves, the controller's strict reading
of them, and the ledger's curve rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import host_documents as hd
from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Ledger
from orchestrator.tick.collect import record_collected
from tests.support.agentmodule import load_agent_module


def test_downsampling_keeps_the_ends_and_the_budget() -> None:
    rm = load_agent_module("gpuq_records.gpuq_runmetrics")
    points = [[i, float(i)] for i in range(1001)]
    kept = rm.downsample(points, 200)
    assert len(kept) == 200 and kept[0] == [0, 0.0] and kept[-1] == [1000, 1000.0]
    assert kept == sorted(kept) and rm.downsample(points[:5], 200) == points[:5]


def test_curves_take_the_metric_and_loss_columns_finite_only() -> None:
    rm = load_agent_module("gpuq_records.gpuq_runmetrics")
    rows = [{"kind": "train", "step": 1, "loss": 2.0}, {"kind": "train", "step": 2, "loss": float("nan")},
            {"kind": "eval", "step": 2, "val_loss": 1.5, "val_acc": 0.5}, {"kind": "train", "step": 3, "loss": 1.0},
            {"kind": "eval", "step": 4, "val_loss": 1.2, "val_acc": 0.7, "lr": 0.1}]
    assert rm.curves(rows, "val_acc") == {"val_acc": [[2, 0.5], [4, 0.7]], "loss": [[1, 2.0], [3, 1.0]],
                                          "val_loss": [[2, 1.5], [4, 1.2]]}
    many = [{f"loss{i}": 1.0 for i in range(20)} | {"step": 1, "acc": 1.0}]
    assert len(rm.curves(many, "acc")) == rm.CURVE_NAMES


def test_payload_curves_read_metrics_jsonl(tmp_path: Path) -> None:
    rm = load_agent_module("gpuq_records.gpuq_runmetrics")
    (tmp_path / "result").mkdir()
    lines = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in range(1, 501)]
    lines += [{"kind": "eval", "step": 500, "val_acc": 0.9, "val_loss": 0.3}]
    (tmp_path / "result" / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    got = rm.payload_curves(str(tmp_path), "val_acc")
    assert got["val_acc"] == [[500, 0.9]] and len(got["loss"]) == 200 and got["loss"][-1] == [500, 1.0 / 500]
    assert rm.payload_curves(str(tmp_path / "nothing"), "val_acc") == {}


def _collect(curves: object) -> str:
    return json.dumps({"c0123456789ab": {"attempt": 1, "summary": {"final": {"val_acc": 0.9}, "curves": curves}}})


@pytest.mark.parametrize(("curves", "why"), [
    ({"loss": [[1, "NaN"]]}, "finite"),
    ({"loss": [[1, 1e400]]}, "finite"),
    ({"loss": [[1]]}, "curves"),
    ({"loss": [[1, 2.0, 3.0]]}, "curves"),
    ({f"m{i}": [[1, 1.0]] for i in range(9)}, "curves"),
    ({"loss": [[i, 1.0] for i in range(hd.MAX_CURVE_POINTS + 1)]}, "curves"),
    ({"x" * 200: [[1, 1.0]]}, "curves"),
    ([[1, 1.0]], "curves"),
])
def test_hostile_curves_are_a_protocol_error(curves: object, why: str) -> None:
    with pytest.raises(hd.ProtocolError, match="bad collect document") as err:
        hd.read_collect("h1", _collect(curves).replace('"NaN"', "NaN"))
    assert why in str(err.value) and err.value.host == "h1"


def test_curves_land_in_the_ledger_beside_final_and_best(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    job = JobSpec(name="a", config="c.yaml", config_sha256="0" * 64, task="t", epochs=1, line=1, raw="c.yaml t 1")
    row = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q", workdir=str(tmp_path), queue_text="", jobs=[job],
                           default_retries=0)[0]
    doc = hd.read_collect("h1", json.dumps({row.id: {"attempt": 1, "summary": {
        "final": {"val_acc": 0.9, "step": 4}, "best": {"val_acc": 0.95, "step": 2},
        "curves": {"val_acc": [[4, 0.9], [2, 0.95]], "loss": [[1, 2.0], [3, 1.0]]}}}}))
    record_collected(ledger, doc.root)
    assert ledger.curves([row.id]) == {row.id: {"val_acc": [(2, 0.95), (4, 0.9)], "loss": [(1, 2.0), (3, 1.0)]}}
    kept = sorted((m.scope, m.name, m.value) for m in ledger.metrics([row.id], ("final", "best", "best_row")))
    # each metric's own best (the loss from its curve), the headline's best row, the final row
    assert kept == [("best", "loss", 1.0), ("best", "val_acc", 0.95), ("best_row", "val_acc", 0.95),
                    ("final", "val_acc", 0.9)]
