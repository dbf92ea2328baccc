"""The HTML report's pieces on report models (docs/report.md, "Curves and the HTML page"): the headline
sentence, durations, what differs from the baseline, each seed's own values, the config as submitted,
the figure's recorded axis, and the cells table that stays one line a row."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.report import build_report
from orchestrator.api.report_detail import _submitted_text, mean_wall, seed_rows
from orchestrator.ledger import Attempt, Job, Sweep
from orchestrator.report import summary, tables
from orchestrator.report.differs import Setup, differences, options
from orchestrator.report.model import CellRow, Report
from tests.unit.test_report_build import QUEUE, VALUES, _sweep

_EMPTY_CELL: dict[str, object] = {
    "sweeps": ["q"], "jobs": [], "names": [], "n_finished": 0, "n_total": 0, "std": None, "ci_low": None,
    "ci_high": None, "best": None, "final": None, "steps": None, "gpu_hours": 0.0, "cost_usd": None,
    "delta_ci_low": None, "delta_ci_high": None, "p_value": None, "flags": []}


def _row(cell: str, mean: float | None, delta: float | None = None, verdict: str = "within noise",
         p: float | None = None, baseline: bool = False, **more: object) -> CellRow:
    return CellRow.model_validate({**_EMPTY_CELL, "cell": cell, "mean": mean, "delta": delta, "p_adjusted": p,
                                   "verdict": "baseline" if baseline else verdict, "is_baseline": baseline, **more})


def _report(cells: list[CellRow], baseline: str | None = "baseline", mode: str = "max",
            metric: str = "val_acc") -> Report:
    return Report.model_validate({"generated_at": 0.0, "sweeps": [], "metric": metric, "mode": mode,
                                  "baseline": baseline, "finished": 0, "total": 0, "partial": False, "cells": cells,
                                  "failures": [], "gpu_hours": 0.0, "cost_usd": None, "notes": []})


def test_the_headline_names_the_best_cell_its_delta_and_verdict() -> None:
    base = _row("baseline", 0.9781, baseline=True)
    wide = _row("wide", 0.9805, delta=0.0024, p=0.61)
    deep = _row("deep", 0.9790, delta=0.0009, p=0.9)
    assert summary.headline(_report([base, deep, wide])) == "best: wide, +0.0024 vs baseline, within noise"
    wide.verdict = "better"
    assert summary.headline(_report([base, deep, wide])) == "best: wide, +0.0024 vs baseline, better (p Holm 0.61)"
    # min mode: the lowest mean is best; here the baseline, so the runner-up is said against it
    loss = summary.headline(_report([base, deep, wide], mode="min", metric="val_loss"))
    assert loss == "best: baseline (the baseline), val_loss 0.9781; next deep, +0.0009 vs baseline, within noise"
    # a noisy cell with the higher mean does not hide one that is reliably better
    noisy = _row("noisy", 0.99, delta=0.012, verdict="within noise", p=0.2)
    sure = _row("sure", 0.985, delta=0.007, verdict="better", p=0.01)
    assert summary.headline(_report([base, noisy, sure])) == ("best: noisy, +0.012 vs baseline, within noise; "
                                                              "reliably better: sure (+0.007)")
    assert summary.headline(_report([_row("a", 0.5), _row("b", 0.7)], baseline=None)) == \
        "best: b, val_acc 0.7 (no baseline to compare with)"
    assert summary.headline(_report([base])) == \
        "best: baseline (the baseline), val_acc 0.9781; no other cell has finished"
    assert summary.headline(_report([_row("baseline", None, baseline=True)])) == "no cell has finished with val_acc yet"


def test_durations_and_labels_read_plainly() -> None:
    assert [summary.duration(s) for s in (None, 0.4, 42, 185, 3720, 2 * 86400 + 3 * 3600)] == \
        ["", "0s", "42s", "3m05s", "1h02m", "2d03h"]
    assert tables.cell_label(_row("baseline", 1.0, baseline=True)) == "baseline"  # never "baseline (baseline)"
    assert tables.cell_label(_row("base", 1.0, baseline=True)) == "base (baseline)"
    assert summary.bounded("val_acc") and summary.bounded("test/F1") and not summary.bounded("val_loss")


def _setup(text: str | None, config: str = "configs/b.yaml", args: tuple[str, ...] = (), **more: object) -> Setup:
    sha = hashlib.sha256((text or config).encode()).hexdigest()
    fields: dict[str, object] = {"task": "classify", "epochs": 3, "gpus": 1, "nodes": 1, **more}
    return Setup(config=config, config_sha256=sha, config_text=text, args=args, **fields)  # type: ignore[arg-type]


def test_what_differs_names_config_keys_arguments_and_fields() -> None:
    base = _setup("optim:\n  lr: 0.001\n  wd: 0.0\nmodel: {width: 128}\naug: true\n", config="configs/a.yaml",
                  args=("--lr", "0.1", "--seed", "1"))
    mine = _setup("optim:\n  lr: 0.003\n  wd: 0.0\nmodel: {width: 256}\ndropout: 0.1\n",
                  args=("--lr=0.3", "--seed", "2", "--fast"), epochs=5)
    assert differences(mine, base) == [
        "config configs/b.yaml (baseline configs/a.yaml)",
        "config aug: unset (baseline true)", "config dropout: 0.1 (baseline unset)",
        "config model.width: 256 (baseline 128)", "config optim.lr: 0.003 (baseline 0.001)",
        "epochs 5 (baseline 3)",
        "argument --fast: set (baseline unset)", "argument --lr: 0.3 (baseline 0.1)"]  # the seed is not a difference
    assert differences(base, base) == []
    same_keys = _setup("optim: {lr: 0.001, wd: 0.0}\nmodel: {width: 128}\naug: true\n", config="configs/a.yaml")
    assert differences(same_keys, _setup(base.config_text, config="configs/a.yaml")) == \
        ["config configs/a.yaml: same keys and values, other bytes (comments or layout)"]
    assert differences(_setup(None), base) == [
        "config configs/b.yaml (baseline configs/a.yaml): other bytes; their contents are not at hand to compare",
        "argument --lr: unset (baseline 0.1)"]
    many = _setup("".join(f"k{i}: {i}\n" for i in range(12)), config="configs/a.yaml")
    lines = differences(many, _setup("{}\n", config="configs/a.yaml"))
    assert len(lines) == 8 and lines[-1] == "and 5 more differences"
    assert options(["-v", "--lr", "-1e-3", "data/x", "--random_seed=3"]) == {"-v": True, "--lr": "-1e-3",
                                                                              "#0": "data/x"}


def _job(job_id: str = "j0", name: str = "wide-seed0", seed: int | None = 0, state: str = "SUCCEEDED",
         config: str = "configs/a.yaml", sha: str = "") -> Job:
    return Job(id=job_id, sweep_id="q", name=name, line=1, raw="", config=config, config_sha256=sha, task="classify",
               epochs=3, gpus=1, nodes=1, seed=seed, retries=0, spec_hash="", state=state, created_at=0.0,
               updated_at=0.0)


def _attempt(started: float | None, ended: float | None) -> Attempt:
    return Attempt(job_id="j", number=1, host="local", state="EXITED", bundle_sha="", created_at=0.0,
                   started_at=started, ended_at=ended)


def test_the_config_is_read_as_submitted(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    submitted = b"x: 1\n"
    (tmp_path / "configs" / "a.yaml").write_bytes(submitted)
    sweep = Sweep(id="q", queue_path=str(tmp_path / "q.txt"), workdir=str(tmp_path), queue_text="",
                  bundle_sha="f" * 64, job_count=1, created_at=0.0)
    job = _job(sha=hashlib.sha256(submitted).hexdigest())
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    assert _submitted_text(sweep, job, bundles) == "x: 1\n"
    (tmp_path / "configs" / "a.yaml").write_bytes(b"x: 2\n")  # edited since the submit: not those bytes
    assert _submitted_text(sweep, job, bundles) is None
    with tarfile.open(bundles / f"{'f' * 64}.tar", "w") as tar:  # the bundle kept the submitted bytes
        info = tarfile.TarInfo("workdir/configs/a.yaml")
        info.size = len(submitted)
        tar.addfile(info, io.BytesIO(submitted))
    assert _submitted_text(sweep, job, bundles) == "x: 1\n"


def test_each_seed_keeps_its_own_values_and_wall_time() -> None:
    from orchestrator.api.report import Value

    jobs = [_job(f"j{k}", f"wide-seed{k}", k, state) for k, state in enumerate(("SUCCEEDED", "SUCCEEDED", "FAILED"))]
    values = {"j0": {"final": Value(0.9, 300), "best": Value(0.91, 200)}, "j1": {"final": Value(0.94, 280)}}
    attempts = {"j0": [_attempt(100.0, 160.0), _attempt(200.0, 290.0)],  # preempted, then resumed
                "j1": [_attempt(100.0, None)],  # still running at now
                "j2": [_attempt(None, None)]}
    rows = seed_rows(jobs, values, attempts, now=400.0)
    assert [(r.final, r.best, r.steps, r.attempts, r.wall_s) for r in rows] == [
        (0.9, 0.91, 300, 2, 150.0), (0.94, None, 280, 1, 300.0), (None, None, None, 1, 0.0)]
    assert mean_wall(rows) == 225.0  # the failed seed does not count
    assert mean_wall(rows[2:]) is None


@pytest.fixture
def ctx(gpuq_home: Path) -> api.Context:
    return api.open_context()


def test_the_report_carries_seeds_wall_times_differences_and_headline(ctx: api.Context, tmp_path: Path) -> None:
    _sweep(ctx, tmp_path, "qpage00", QUEUE, VALUES, failed=("baseline-seed3",))
    for job in ctx.ledger.jobs(sweep_id="qpage00"):
        ctx.ledger.update_attempt(job.id, 1, started_at=1000.0, ended_at=1000.0 + (60 if "wide" in job.name else 30))
    report = build_report(ctx, ["qpage00"], collect=False)
    cells = {c.cell: c for c in report.cells}
    assert [s.name for s in cells["baseline"].seeds] == [f"baseline-seed{k}" for k in range(4)]
    assert [s.final for s in cells["baseline"].seeds] == [0.80, 0.82, 0.84, None]
    assert cells["wide"].wall_s == 60.0 and cells["baseline"].wall_s == 30.0
    assert cells["wide"].differs == ["config configs/b.yaml (baseline configs/a.yaml)", "config x: b (baseline a)"]
    assert cells["baseline"].differs == []
    best = cells["wide"]
    assert report.headline == f"best: wide, {best.delta:+.4g} vs baseline, {best.verdict}" + (
        f" (p Holm {best.p_adjusted:.3g})" if best.verdict != "within noise" else "")
    assert report.headline in tables.markdown(report)
    assert "wall_s" in tables.csv_text(report).splitlines()[0]


def test_the_figure_records_the_axis_it_drew_and_marks_the_outlier(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from orchestrator.report.figures import write_figures

    finals = {"baseline": 0.978, "wide": 0.981, "deep": 0.974, "no_aug": 0.972, "lr_high": 0.19}
    cells = [_row(name, v, baseline=name == "baseline", jobs=[name]) for name, v in finals.items()]
    curves = {name: {"val_acc": [(s, v * (1 - 0.5 ** (s / 20))) for s in range(0, 201, 10)]}
              for name, v in finals.items()}
    report = _report(cells)
    (figure,) = write_figures(report, curves, tmp_path)
    axis = figure.axis
    assert axis.off_scale == ("lr_high",) and axis.scale == "linear"
    assert 0.19 < axis.low < 0.972 * (1 - 0.5 ** 5) and 0.981 <= axis.high < 1.0
    ticks = [float(t.replace("\u2212", "-")) for t in axis.ticks]
    assert len(ticks) >= 3 and all(axis.low <= t <= axis.high for t in ticks)
    del curves["lr_high"]
    (plain,) = write_figures(_report(cells[:-1]), curves, tmp_path)
    assert plain.axis.off_scale == () and plain.axis.low < 0.1  # no outlier: the whole curves, from 0


def test_the_cells_table_is_one_line_a_row() -> None:
    from orchestrator.report.html import TIME_COLUMN, _table

    base = _row("baseline", 0.82, baseline=True, n_finished=3, n_total=3, std=0.02, best=0.85, steps=300,
                gpu_hours=0.0, cpu_hours=0.01, cost_usd=None, delta_ci_low=None, delta_ci_high=None, p_value=None,
                wall_s=121.0)
    near = _row("near_one", 0.98, delta=0.16, verdict="better", n_finished=2, n_total=2, std=0.014, best=0.99,
                steps=300, gpu_hours=0.0, cpu_hours=0.01, cost_usd=None, delta_ci_low=0.11, delta_ci_high=0.21,
                p_value=0.002, p=0.007, wall_s=130.0)
    near.ci_low, near.ci_high = 0.853, 1.107
    near.flags = ["diverged: near_one-seed0 ended at 0.5 vs its best 0.9", "diverged: near_one-seed1 ...",
                  "seeds disagree: std 0.3 is over 10% of the mean 0.7"]
    html = _table(_report([base, near]))
    assert f"<th>{TIME_COLUMN}</th>" in html and ">2m01s<" in html and ">2m10s<" in html
    assert ">0.01 CPU-h<" in html and "+0.01" not in html  # never "0.00 +0.01 CPU-h"
    assert "[0.853, 1.107] <span" in html and "[0.82" not in html  # the interval past 1 is marked
    assert '<a class="flags" href="#flags-1" title="diverged; seeds disagree">diverged +1</a>' in html
    assert '<li id="flags-1"><b>near_one</b>: diverged: near_one-seed0 ended at 0.5' in html
    assert ">baseline<" in html and "baseline (baseline)" not in html
