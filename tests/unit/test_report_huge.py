"""`gpuq report` on huge finite metrics (issue 23 item 11): statistics never overflow and say
"cannot compute" where the float range ends; figures leave out points matplotlib cannot draw."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.report import build_report
from orchestrator.report import stats
from orchestrator.report.figures import PLOT_LIMIT, cell_band, drawable
from tests.conftest import run_gpuq
from tests.unit.test_report_build import _sweep

MAX = 1.7976931348623157e308
QUEUE = "configs/a.yaml classify 3 name=baseline seeds=2\nconfigs/b.yaml classify 3 name=big seeds=2\n"


def test_mean_std_ci_and_welch_of_huge_values() -> None:
    assert stats.mean([1.5e308, 1.5e308]) == 1.5e308
    assert stats.mean([MAX, MAX, MAX]) == MAX
    assert stats.std([1.5e308, 1.5e308]) == 0.0
    assert stats.std([1e200, 3e200]) == pytest.approx(math.sqrt(2) * 1e200)
    assert stats.std([-1.7e308, 1.7e308]) is None  # the spread itself exceeds the float range
    ci = stats.mean_ci([1e300, 1.2e300, 1.1e300])
    assert ci is not None and ci.low < 1.1e300 < ci.high
    assert stats.mean_ci([-1.7e308, 1.7e308]) is None
    w = stats.welch([1e300, 1.1e300, 1.2e300], [2e300, 2.1e300, 2.2e300])
    assert w is not None and w.delta == pytest.approx(-1e300) and w.p_value < 0.01
    assert stats.welch([1.7e308, 1.6e308], [-1.7e308, -1.6e308]) is None  # delta beyond the range
    # the scaling changes nothing for ordinary numbers
    assert stats.std([0.80, 0.82, 0.84]) == pytest.approx(0.02, abs=1e-15)


def test_report_of_huge_metrics_says_cannot_compute(gpuq_home: Path, tmp_path: Path) -> None:
    ctx = api.open_context()
    values = {"baseline-seed0": (1.5e308, 1.5e308), "baseline-seed1": (1.5e308, 1.5e308),
              "big-seed0": (-1.7e308, -1.7e308), "big-seed1": (1.7e308, 1.7e308)}
    _sweep(ctx, tmp_path, "qhuge01", QUEUE, values)
    report = build_report(ctx, ["qhuge01"])
    big = next(c for c in report.cells if c.cell == "big")
    assert big.mean == 0.0 and big.std is None and big.ci_low is None and big.verdict == "cannot compute"
    assert any("cannot compute" in n and "big" in n for n in report.notes), report.notes
    doc = run_gpuq("report", "--format", "json")
    assert doc.returncode == 0, doc.stderr
    json.loads(doc.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert run_gpuq("report").returncode == 0


def test_figures_leave_out_points_beyond_the_limit_and_say_so(tmp_path: Path) -> None:
    curves = {"j1": {"val_acc": [(1, 1.0), (2, 1.7e308), (3, -1.7e308)]}, "j2": {"val_acc": [(1, 2.0), (2, 1.5e308)]}}
    band = cell_band(["j1", "j2"], curves, "val_acc")
    assert band[1][1] == pytest.approx(1.6e308)  # the mean of two huge points, no OverflowError
    kept, dropped = drawable(band)
    assert [b[0] for b in kept] == [1] and dropped == 2
    assert all(abs(v) <= PLOT_LIMIT for b in kept for v in b[1:])
    pytest.importorskip("matplotlib")
    from orchestrator.report.figures import write_figures
    from orchestrator.report.model import CellRow, Report, SweepInfo

    cell = CellRow(cell="a", sweeps=["q"], jobs=["j1", "j2"], names=["j1", "j2"], n_finished=2, n_total=2, mean=1.0,
                   std=None, ci_low=None, ci_high=None, best=None, final=1.0, steps=None, gpu_hours=0.0,
                   cost_usd=None, is_baseline=True, delta=None, delta_ci_low=None, delta_ci_high=None, p_value=None,
                   verdict="baseline", flags=[])
    report = Report(generated_at=0.0, sweeps=[SweepInfo(id="q", queue="q", queue_text="", bundle_sha="",
                                                        created_at=0.0, hosts=[])],
                    metric="val_acc", mode="max", baseline="a", finished=2, total=2, partial=False, cells=[cell],
                    failures=[], gpu_hours=0.0, cost_usd=None, notes=[])
    written = write_figures(report, curves, tmp_path / "fig")
    assert written and written[0][1].stat().st_size > 0
