"""gpuq report on a real ledger with synthetic metrics whose answers are known (docs/report.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.report import build_report
from orchestrator.core.errors import UsageError
from orchestrator.core.states import AttemptState, JobState
from orchestrator.queue.queuefile import parse_queue
from orchestrator.report import cells as cells_mod
from orchestrator.report import tables
from tests.conftest import run_gpuq

QUEUE = """\
configs/a.yaml classify 3 name=baseline seeds=4
configs/b.yaml classify 3 name=wide seeds=3
configs/c.yaml classify 3 name=lr_high seeds=2
configs/d.yaml classify 3 name=no_aug
configs/e.yaml classify 3 name=flat seeds=2
"""
# job name -> (final, best) of val_acc; baseline-seed3 fails; flat ties the baseline exactly on both seeds
VALUES = {
    "baseline-seed0": (0.80, 0.81), "baseline-seed1": (0.82, 0.83), "baseline-seed2": (0.84, 0.85),
    "wide-seed0": (0.90, 0.90), "wide-seed1": (0.92, 0.93), "wide-seed2": (0.94, 0.94),
    "lr_high-seed0": (0.13, 0.94), "lr_high-seed1": (0.15, 0.93),
    "no_aug": (0.86, 0.87),
    "flat-seed0": (0.82, 0.82), "flat-seed1": (0.82, 0.82),
}


@pytest.fixture
def ctx(gpuq_home: Path) -> api.Context:
    return api.open_context()


def _sweep(ctx: api.Context, tmp_path: Path, sweep_id: str, queue_text: str, values: dict[str, tuple[float, float]],
           failed: tuple[str, ...] = (), running: tuple[str, ...] = ()) -> None:
    (tmp_path / "configs").mkdir(exist_ok=True)
    for name in "abcde":
        (tmp_path / "configs" / f"{name}.yaml").write_text(f"seed: 1\nx: {name}\n")
    queue = tmp_path / f"{sweep_id}.txt"
    queue.write_text(queue_text)
    rows = ctx.ledger.add_sweep(sweep_id=sweep_id, queue_path=str(queue), workdir=str(tmp_path),
                                queue_text=queue_text, jobs=parse_queue(queue).jobs, default_retries=0,
                                bundle_sha="b" * 64)
    for job in rows:
        if job.name in running:
            ctx.ledger.start_attempt(job.id, host="local", bundle_sha="s")
            continue
        if job.name not in values and job.name not in failed:
            continue
        ctx.ledger.start_attempt(job.id, host="local", bundle_sha="s")
        if job.name in failed:
            ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1, message="exit 1: trainer exited 1")
            ctx.ledger.transition(job.id, JobState.FAILED, message="config error: never retried (fix it, submit again)",
                                  failure_class="config")
            continue
        ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1)
        ctx.ledger.transition(job.id, JobState.SUCCEEDED)
        final, best = values[job.name]
        ctx.ledger.record_results(job.id, 1, metrics=[("final", "val_acc", final, 300, 3),
                                                      ("best", "val_acc", best, 200, 2),
                                                      ("final", "train_loss", 1 - final, 300, 3)], artifacts=[])


def _cell(report, name):  # type: ignore[no-untyped-def]
    return next(c for c in report.cells if c.cell == name)


def test_every_number_of_the_table(ctx: api.Context, tmp_path: Path) -> None:
    _sweep(ctx, tmp_path, "qaaaaaa", QUEUE, VALUES, failed=("baseline-seed3",))
    report = build_report(ctx, ["qaaaaaa"], collect=False)
    assert [c.cell for c in report.cells] == ["baseline", "wide", "lr_high", "no_aug", "flat"]
    assert (report.metric, report.mode, report.baseline) == ("val_acc", "max", "baseline")
    assert (report.finished, report.total, report.partial) == (11, 12, False)
    assert report.notes == ["1 of 12 jobs have not finished with the metric 'val_acc': only the 11 finished ones count",
                            "verdicts are Holm-corrected over 3 compared cells: p (Holm) decides, p is the raw Welch p"]

    base = _cell(report, "baseline")
    half = 4.30265272975 * 0.02 / math.sqrt(3)
    assert (base.n_finished, base.n_total, base.verdict, base.is_baseline) == (3, 4, "baseline", True)
    assert (base.mean, base.std) == (pytest.approx(0.82), pytest.approx(0.02))
    assert (base.ci_low, base.ci_high) == (pytest.approx(0.82 - half), pytest.approx(0.82 + half))
    assert (base.best, base.steps, base.delta) == (0.85, 300, None)
    assert base.flags == []

    wide = _cell(report, "wide")
    se = math.sqrt(0.0008 / 3)
    t = 0.10 / se
    assert (wide.n_finished, wide.mean, wide.best) == (3, pytest.approx(0.92), 0.94)
    assert wide.delta == pytest.approx(0.10)
    assert (wide.delta_ci_low, wide.delta_ci_high) == (pytest.approx(0.10 - 2.7764451052 * se),
                                                       pytest.approx(0.10 + 2.7764451052 * se))
    assert wide.p_value == pytest.approx(1 - t * (t * t + 6) / (t * t + 4) ** 1.5, rel=1e-9)
    assert wide.verdict == "better"

    lr = _cell(report, "lr_high")
    assert (lr.mean, lr.std) == (pytest.approx(0.14), pytest.approx(math.sqrt(0.0002)))
    assert (lr.ci_low, lr.ci_high) == (pytest.approx(0.14 - 12.7062047362 * 0.01),
                                       pytest.approx(0.14 + 12.7062047362 * 0.01))
    assert lr.delta == pytest.approx(-0.68) and lr.verdict == "worse" and lr.delta_ci_high < 0
    assert lr.flags[:2] == ["diverged: lr_high-seed0 ended at 0.13 vs its best 0.94",
                            "diverged: lr_high-seed1 ended at 0.15 vs its best 0.93"]

    one = _cell(report, "no_aug")
    assert (one.n_finished, one.mean, one.std, one.ci_low, one.p_value) == (1, 0.86, None, None, None)
    assert one.delta == pytest.approx(0.04) and one.verdict == "n too small"

    flat = _cell(report, "flat")
    assert (flat.delta, flat.p_value, flat.verdict) == (pytest.approx(0.0), 1.0, "within noise")

    assert [(f.name, f.failure_class, f.state) for f in report.failures] == [("baseline-seed3", "config", "FAILED")]
    assert wide.p_value is not None  # lr_high's p is smaller: Holm multiplies wide's by 2 of 3
    assert tables.cells(wide)[9:14] == ["+0.1", f"[+{0.10 - 2.7764451052 * se:.4g}, +{0.10 + 2.7764451052 * se:.4g}]",
                                         "0.004", tables.p_value(2 * wide.p_value), "better"]


def test_within_noise_and_seeds_that_disagree(ctx: api.Context, tmp_path: Path) -> None:
    values = {"baseline-seed0": (0.80, 0.80), "baseline-seed1": (0.84, 0.84),
              "wide-seed0": (0.70, 0.70), "wide-seed1": (0.98, 0.98)}
    _sweep(ctx, tmp_path, "qbbbbbb", "configs/a.yaml classify 3 name=baseline seeds=2\n"
           "configs/b.yaml classify 3 name=wide seeds=2\n", values)
    wide = _cell(build_report(ctx, [], collect=False), "wide")
    # delta 0.02; se = sqrt(0.0008/2 + 0.0392/2) = 0.141421; df = 0.02^2 / (0.0004^2 + 0.0196^2) = 1.0408
    assert wide.delta == pytest.approx(0.02) and wide.verdict == "within noise"
    assert wide.delta_ci_low < 0 < wide.delta_ci_high
    assert wide.flags == ["seeds disagree: std 0.198 is over 10% of the mean 0.84"]


def test_a_running_sweep_counts_only_finished_jobs(ctx: api.Context, tmp_path: Path) -> None:
    _sweep(ctx, tmp_path, "qcccccc", QUEUE, {k: v for k, v in VALUES.items() if not k.startswith("wide")},
           running=("wide-seed0",))
    report = build_report(ctx, [], collect=False)
    wide = _cell(report, "wide")
    assert report.partial and (wide.n_finished, wide.n_total, wide.verdict, wide.mean) == (0, 3, "no data", None)
    assert "only the 8 finished ones count" in report.notes[0]


def test_two_sweeps_merge_by_cell_name_and_min_mode(ctx: api.Context, tmp_path: Path) -> None:
    q = "configs/a.yaml classify 3 name=baseline seeds=2\nconfigs/b.yaml classify 3 name=wide seeds=2\n"
    _sweep(ctx, tmp_path, "qdddddd", q, {"baseline-seed0": (0.80, 0.8), "baseline-seed1": (0.82, 0.8),
                                        "wide-seed0": (0.90, 0.9), "wide-seed1": (0.92, 0.9)})
    _sweep(ctx, tmp_path, "qeeeeee", q, {"baseline-seed0": (0.84, 0.8), "wide-seed0": (0.94, 0.9)})
    report = build_report(ctx, ["qdddddd", "qeeeeee"], metric="train_loss", mode="min", collect=False)
    base, wide = _cell(report, "baseline"), _cell(report, "wide")
    assert base.sweeps == ["qdddddd", "qeeeeee"] and (base.n_finished, base.n_total) == (3, 4)
    assert base.mean == pytest.approx(0.18) and wide.mean == pytest.approx(0.08)  # 1 - final
    assert wide.delta == pytest.approx(-0.10) and wide.verdict == "better"  # lower loss is better


def test_mistakes_name_the_fix(ctx: api.Context, tmp_path: Path) -> None:
    _sweep(ctx, tmp_path, "qffffff", QUEUE, VALUES)
    cells = r"\(cells: baseline, flat, lr_high, no_aug, wide\)"
    with pytest.raises(UsageError, match=r"--baseline nope: no such cell " + cells):
        build_report(ctx, [], baseline="nope", collect=False)
    with pytest.raises(UsageError, match="reported the metric 'bleu'; name the one your trainer writes with --metric"):
        build_report(ctx, [], metric="bleu", collect=False)
    result = run_gpuq("report", "--format", "html")
    assert result.returncode == 2 and "needs -o DIR" in result.stderr and "Traceback" not in result.stderr
    result = run_gpuq("report", "qzzzzzz")
    assert result.returncode == 2 and "qzzzzzz" in result.stderr and "Traceback" not in result.stderr
    result = run_gpuq("report", "--baseline", "nope")
    assert result.returncode == 2 and "--baseline nope: no such cell" in result.stderr


def test_cli_formats(ctx: api.Context, tmp_path: Path) -> None:
    _sweep(ctx, tmp_path, "qgggggg", QUEUE, VALUES, failed=("baseline-seed3",))
    doc = json.loads(run_gpuq("report", "--format", "json").stdout)
    assert doc["schema"] == "gpuq.cli.report/1" and doc["baseline"] == "baseline"
    assert [c["verdict"] for c in doc["cells"]] == ["baseline", "better", "worse", "n too small", "within noise"]
    md = run_gpuq("report", "--format", "md").stdout
    assert "| wide | 3/3 | 0.92 | 0.02 |" in md and "| better |" in md
    rows = run_gpuq("report", "--format", "csv").stdout.splitlines()
    assert rows[0].startswith("cell,is_baseline,n_finished,n_total,mean,std,ci_low,ci_high,best,steps")
    assert rows[2].startswith("wide,False,3,3,0.92")
    table = run_gpuq("report", env={"COLUMNS": "250"}).stdout
    assert "within noise" in table and "failed baseline-seed3 (config)" in table


def test_cells_drop_seed_parts_and_join_seed_only_lines() -> None:
    assert cells_mod.cell_name("lr-lr1e-3-seed2", "lr") == "lr-lr1e-3"
    assert cells_mod.cell_name("x-small-random_seed3", "x") == "x-small"
    assert cells_mod.cell_name("seed1", "seed1") == "seed1"

    class J:
        def __init__(self, name: str, seed: int | None, sha: str = "s") -> None:
            self.name, self.cell, self.seed, self.config_sha256 = name, name, seed, sha
            self.task, self.epochs, self.gpus, self.nodes, self.args = "t", 1, 1, 1, "[]"

    jobs = [J("base_s1", 1), J("base_s2", 2), J("other", 3, sha="o")]
    assert {k: [j.name for j in v] for k, v in cells_mod.group(jobs).items()} == \
        {"base": ["base_s1", "base_s2"], "other": ["other"]}


HOLM_QUEUE = """\
configs/a.yaml classify 3 name=baseline seeds=3
configs/b.yaml classify 3 name=edge seeds=3
configs/c.yaml classify 3 name=same seeds=3
configs/d.yaml classify 3 name=also seeds=3
"""


def test_verdicts_are_holm_corrected_over_the_compared_cells(ctx: api.Context, tmp_path: Path) -> None:
    """``edge`` is better by its own Welch test (p near 0.02) but not once corrected for three cells."""
    base = {f"baseline-seed{i}": (v, v) for i, v in enumerate((0.80, 0.82, 0.81))}
    edge = {f"edge-seed{i}": (v, v) for i, v in enumerate((0.83, 0.85, 0.84))}
    same = {f"{c}-seed{i}": (v, v) for c in ("same", "also") for i, v in enumerate((0.79, 0.83, 0.81))}
    _sweep(ctx, tmp_path, "qholm00", HOLM_QUEUE, base | edge | same)
    report = build_report(ctx, ["qholm00"], collect=False)
    cell = _cell(report, "edge")
    assert cell.p_value is not None and cell.p_adjusted is not None
    assert cell.p_value < 0.05 <= cell.p_adjusted and cell.verdict == "within noise"
    assert cell.p_adjusted == pytest.approx(min(1.0, 3 * cell.p_value))
    assert _cell(report, "baseline").p_adjusted is None
    assert any("Holm-corrected over 3 compared cells" in note for note in report.notes)
    assert "p (Holm)" in tables.markdown(report)


def test_cpu_hours_never_read_like_a_sum_and_the_heading_never_says_baseline_twice() -> None:
    from orchestrator.report import tables
    from orchestrator.report.model import CellRow, Report

    def hours(gpu: float, cpu: float) -> str:
        return tables.cells(CellRow.model_construct(cell="c", is_baseline=False, n_finished=1, n_total=1, mean=None,
                                                    std=None, ci_low=None, ci_high=None, best=None, steps=None,
                                                    gpu_hours=gpu, cpu_hours=cpu, cost_usd=None, delta=None,
                                                    delta_ci_low=None, delta_ci_high=None, p_value=None,
                                                    verdict="", flags=[]))[tables.COLUMNS.index("GPU-h")]

    assert hours(0.0, 0.12) == "0.12 CPU-h" and "+" not in hours(1.5, 0.12) and hours(1.5, 0.12) == "1.50 · 0.12 CPU-h"
    assert hours(1.5, 0.0) == "1.50"
    report = Report.model_construct(sweeps=[], metric="val_acc", mode="max", baseline="baseline", finished=2, total=2)
    assert "baseline baseline" not in tables.heading(report) and "against baseline" in tables.heading(report)
    report.baseline = None
    assert "no baseline" in tables.heading(report)


def test_an_accuracy_interval_past_one_is_said() -> None:
    from orchestrator.api.report import _past_bounds
    from orchestrator.report.model import CellRow

    def row(cell: str, low: float | None, high: float | None) -> CellRow:
        return CellRow.model_construct(cell=cell, ci_low=low, ci_high=high)

    rows = [row("wide", 0.91, 1.04), row("deep", 0.90, 0.95), row("lr_high", -0.2, 0.6), row("single", None, None)]
    (note,) = _past_bounds(rows, "val_acc")
    assert note.startswith("the 95% CI of wide, lr_high goes past [0, 1], where 'val_acc' lives"), note
    assert _past_bounds(rows, "val_loss") == []  # a loss has no upper bound
    assert _past_bounds([row("deep", 0.90, 0.95)], "val_acc") == []


def test_one_outlier_cell_does_not_squash_the_axis_of_the_others() -> None:
    from orchestrator.report.figures import axis_range

    late = {"baseline": [0.975, 0.978, 0.980], "wide": [0.978, 0.981, 0.982], "deep": [0.970, 0.974, 0.976],
            "no_aug": [0.968, 0.972, 0.975], "lr_high": [0.13, 0.17, 0.19]}
    ranged = axis_range(late)
    assert ranged is not None
    lo, hi, out = ranged
    assert out == ["lr_high"]
    assert 0.96 < lo < 0.968 and 0.982 < hi < 0.99  # the others fill the axis; lr_high runs off it
    del late["lr_high"]
    assert axis_range(late) is None  # no outlier: matplotlib's own range
    assert axis_range({"a": [1.0], "b": [100.0], "c": [2.0]}) is None  # too few cells to call one an outlier
