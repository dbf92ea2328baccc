"""Each metric's own best by its direction (issue 39 item 1): not its value in the row where the headline
metric peaked, which ``best_row`` keeps, named as such."""

from __future__ import annotations

from orchestrator.host_documents import Summary
from orchestrator.tick.collect import direction, own_bests
from tests.support.agentmodule import load_agent_module

runmetrics = load_agent_module("gpuq_records.gpuq_runmetrics")


def _summary() -> Summary:
    return Summary.model_validate(
        {
            "metric": "val_acc",
            "mode": "max",
            "final": {"step": 30, "val_acc": 0.97, "val_loss": 0.0593, "train_loss": 0.3879},
            "best": {"step": 20, "val_acc": 0.9805, "val_loss": 0.0639, "train_loss": 0.6624},
            "curves": {
                "val_acc": [[10, 0.9], [20, 0.9805], [30, 0.97]],
                "val_loss": [[10, 0.2], [20, 0.0639], [25, 0.05], [30, 0.0593]],
                "train_loss": [[10, 0.9], [20, 0.6624], [30, 0.3879]],
            },
        }
    )


def test_each_metric_takes_its_own_best() -> None:
    bests = own_bests(_summary())
    assert bests == {"val_acc": (0.9805, 20), "val_loss": (0.05, 25), "train_loss": (0.3879, 30)}


def test_direction_follows_the_headline_mode_then_the_name() -> None:
    s = Summary(metric="val_loss", mode="min")
    assert direction("val_loss", s) == "min"
    assert direction("val_acc", s) == "max"
    assert direction("train_loss", s) == "min"
    assert direction("throughput", s) == ""
    assert "throughput" not in own_bests(Summary.model_validate({"final": {"throughput": 5.0}}))


def test_a_downsampled_curve_keeps_its_extremes() -> None:
    points = [[i, float((i * 37) % 1000)] for i in range(5000)]
    points[4321][1] = -7.0
    points[1234][1] = 9999.0
    kept = runmetrics.downsample(points, 200)
    assert len(kept) <= 200
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert [4321, -7.0] in kept and [1234, 9999.0] in kept
