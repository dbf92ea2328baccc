"""Metrics that follow the trainer (issue 29 item 1, issue 26 item 4): a ``metrics`` glob over
Lightning's ``version_N`` dirs and Hydra's dated output dirs, read in the order the trainer wrote them
and merged into one series where a resumed run's rows replace the steps it trains again; the same
for ``metrics = "log"``; one curve point per job and step in the report, bands across seeds only;
a setting that matched nothing is a warning naming it, and the report does not blame the metric.

The files are written the way the frameworks write them (Lightning's CSVLogger header and its
gapped rows, a Hydra run dir per start); the agent's modules read them in process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator import host_documents as hd
from orchestrator.api.report import build_report
from orchestrator.core.errors import UsageError
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health import observed
from orchestrator.queue.runconfig import RunConfig
from orchestrator.report import figures
from orchestrator.tick.collect import record_collected
from tests.support.agentmodule import load_agent_module

pytestmark = pytest.mark.honest  # no silent wrong answer (docs/testing.md)

M = load_agent_module("gpuq_records.gpuq_runmetrics")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
RUN_OF = jobspec.parse_run  # the spec's "run" as the agent reads it

HEADER = "epoch,step,train_loss,val_loss"


def _lightning_rows(epochs: range, val: dict[int, float], steps_per_epoch: int = 10) -> str:
    """CSVLogger's rows: a train row and a validation row per epoch, each leaving the other's cells empty."""
    rows = [HEADER]
    for e in epochs:
        step = (e + 1) * steps_per_epoch - 1
        rows.append(f"{e},{step},{1.0 / (e + 1):.4f},")
        rows.append(f"{e},{step},,{val[e]}")
    return "\n".join(rows) + "\n"


def _job(tmp_path: Path, launches: list[float]) -> Path:
    jdir = tmp_path / "jobs" / "c0ffee"
    for n, t in enumerate(launches, 1):
        adir = jdir / "attempts" / str(n)
        adir.mkdir(parents=True)
        (adir / "launch.json").write_text(json.dumps({"time": t}))
    (jdir / "run").mkdir(parents=True)
    return jdir


def _write(path: Path, text: str, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_lightning_version_dirs_give_the_resumed_runs_final_value(tmp_path: Path) -> None:
    # attempt 1 logs epochs 0..5 to version_0 and dies; attempt 2 resumes from epoch 3's checkpoint
    # into version_1 and trains 3..7 with other numbers: the job's series is 0..2 of v0, then v1
    jdir = _job(tmp_path, [1000.0, 2000.0])
    v0 = {e: round(0.9 - 0.05 * e, 3) for e in range(6)}
    v1 = {e: round(0.8 - 0.01 * e, 3) for e in range(3, 8)}
    _write(jdir / "run/lightning_logs/version_0/metrics.csv", _lightning_rows(range(6), v0), 1500.0)
    _write(jdir / "run/lightning_logs/version_1/metrics.csv", _lightning_rows(range(3, 8), v1), 2500.0)
    run = {"metrics": "lightning_logs/version_*/metrics.csv", "metric": "val_loss", "mode": "min"}
    s = M.run_summary(str(jdir), RUN_OF(run), 2)
    assert s["files"] == 2 and s["final"]["val_loss"] == v1[7] and s["final"]["step"] == 79
    assert s["best"]["val_loss"] == min(list(v0.values())[:3] + list(v1.values()))
    points = s["curves"]["val_loss"]
    steps = [p[0] for p in points]
    assert steps == sorted(set(steps)), points  # one point per step: no step twice
    assert dict(points) == {**{(e + 1) * 10 - 1: v0[e] for e in range(3)},
                            **{(e + 1) * 10 - 1: v1[e] for e in range(3, 8)}}


def test_files_are_ordered_by_the_attempt_that_wrote_them_not_by_name(tmp_path: Path) -> None:
    # Hydra's dated dirs: attempt 2 started after a clock step back, so its dir sorts first by name
    jdir = _job(tmp_path, [1000.0, 2000.0])
    first = {e: 0.5 for e in range(4)}
    second = {e: 0.25 for e in range(2, 5)}
    _write(jdir / "run/outputs/2026-11-26/10-00-00/metrics.csv", _lightning_rows(range(4), first), 1500.0)
    _write(jdir / "run/outputs/2026-11-25/09-00-00/metrics.csv", _lightning_rows(range(2, 5), second), 2100.0)
    s = M.run_summary(str(jdir), RUN_OF({"metrics": "outputs/*/*/metrics.csv", "metric": "val_loss", "mode": "min"}), 2)
    assert s["final"]["val_loss"] == 0.25 and dict(s["curves"]["val_loss"]) == {9: 0.5, 19: 0.5, 29: 0.25,
                                                                                 39: 0.25, 49: 0.25}


def test_tensorboard_style_run_dirs_of_json_lines(tmp_path: Path) -> None:
    jdir = _job(tmp_path, [1000.0, 2000.0])
    first = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 6))
    again = "".join(json.dumps({"step": s, "loss": 0.5 / s}) + "\n" for s in range(4, 8))
    _write(jdir / "run/runs/Nov26_10-00-00_gpu1/metrics.jsonl", first, 1500.0)
    _write(jdir / "run/runs/Nov26_10-09-30_gpu1/metrics.jsonl", again, 2500.0)
    s = M.run_summary(str(jdir), RUN_OF({"metrics": "runs/**/metrics.jsonl", "metric": "loss", "mode": "min"}), 2)
    assert s["files"] == 2 and [p[0] for p in s["curves"]["loss"]] == list(range(1, 8))
    assert s["final"]["loss"] == 0.5 / 7 and dict(s["curves"]["loss"])[4] == 0.5 / 4


def test_one_file_appended_after_a_resume_keeps_the_retrained_rows_only(tmp_path: Path) -> None:
    # examples/hydra_csv style: the same metrics.csv, epochs 1..5, then a resume from epoch 3 appends 3..6
    jdir = _job(tmp_path, [1000.0, 2000.0])
    rows = ["epoch,train_loss,val_acc"] + [f"{e},0.5,0.{e}" for e in range(1, 6)]
    rows += [f"{e},0.4,0.{e}5" for e in range(3, 7)]
    _write(jdir / "run/metrics.csv", "\n".join(rows) + "\n", 2500.0)
    s = M.run_summary(str(jdir), RUN_OF({"metrics": "metrics.csv", "metric": "val_acc", "mode": "max"}), 2)
    assert dict(s["curves"]["val_acc"]) == {1: 0.1, 2: 0.2, 3: 0.35, 4: 0.45, 5: 0.55, 6: 0.65}
    assert s["best"]["val_acc"] == 0.65 and s["rows"] == 6


def test_metrics_from_the_log_one_row_per_step_across_attempts(tmp_path: Path) -> None:
    jdir = _job(tmp_path, [1000.0, 2000.0])
    (jdir / "attempts/1/job.log").write_text("".join(f"step {s} loss {1.0 / s:.3f}\n" for s in range(1, 7)))
    (jdir / "attempts/2/job.log").write_text("".join(f"step {s} loss {0.5 / s:.3f}\n" for s in range(4, 9)))
    run = {"metrics": "log", "metrics_regex": r"step (?P<step>\d+) loss (?P<loss>[\d.]+)", "metric": "loss",
           "mode": "min"}
    s = M.run_summary(str(jdir), RUN_OF(run), 2)
    points = s["curves"]["loss"]
    assert [p[0] for p in points] == list(range(1, 9)), points
    assert dict(points)[5] == round(0.5 / 5, 3) and s["final"]["loss"] == round(0.5 / 8, 3)


def test_rows_that_step_within_an_epoch_are_not_a_restart() -> None:
    rows = [{"epoch": e, "step": s, "loss": e + s / 10} for e in range(3) for s in range(3)]
    assert M.merge_runs([rows]) == rows  # (epoch, step) goes forward even when step resets each epoch


def test_a_setting_that_matches_nothing_says_so(tmp_path: Path) -> None:
    jdir = _job(tmp_path, [1000.0])
    _write(jdir / "run/logs/elsewhere/metrics.csv", _lightning_rows(range(2), {0: 0.5, 1: 0.4}), 1500.0)
    s = M.run_summary(str(jdir), RUN_OF({"metrics": "lightning_logs/version_*/metrics.csv", "metric": "val_loss"}), 1)
    assert (s["files"], s["rows"], s["final"], s["best"]) == (0, 0, None, None)


# --- the controller ---------------------------------------------------------------------------


@pytest.fixture
def ctx(gpuq_home: Path) -> api.Context:
    return api.open_context()


def _sweep(ctx: api.Context, tmp_path: Path, run: RunConfig, names: list[str]) -> list[str]:
    jobs = [JobSpec(name=n, config="", config_sha256="0" * 64, task="", epochs=1, line=i + 1, raw=n, seed=None)
            for i, n in enumerate(names)]
    rows = ctx.ledger.add_sweep(sweep_id="qmetric", queue_path=str(tmp_path / "q.txt"), workdir=str(tmp_path),
                                queue_text="", jobs=jobs, default_retries=0, run=json.dumps(run.wire()))
    for row in rows:
        ctx.ledger.start_attempt(row.id, host="local", bundle_sha="s")
        ctx.ledger.transition(row.id, AttemptState.EXITED, attempt=1)
        ctx.ledger.transition(row.id, JobState.SUCCEEDED)
    return [r.id for r in rows]


def test_a_glob_that_matched_nothing_is_a_warning_naming_it_and_the_report_does_not_blame_the_metric(
        ctx: api.Context, tmp_path: Path) -> None:
    run = RunConfig(metrics="lightning_logs/version_*/metrics.csv", metric="val_loss", mode="min")
    (job,) = _sweep(ctx, tmp_path, run, ["lr"])
    nothing = {"metric": "val_loss", "mode": "min", "final": None, "best": None, "files": 0, "rows": 0,
               "steps": 0, "source": "run/lightning_logs/version_*/metrics.csv", "curves": {}}
    doc = hd.read_collect("local", json.dumps({job: {"attempt": 1, "summary": nothing}}))
    record_collected(ctx.ledger, doc.root)
    record_collected(ctx.ledger, doc.root)  # collected again (gpuq results): still one warning
    found = [e for e in ctx.ledger.events(subject=job) if e.rule == observed.METRICS_RULE]
    assert len(found) == 1 and found[0].severity == "warn", found
    assert "lightning_logs/version_*/metrics.csv" in found[0].message and "matched no file" in found[0].message
    with pytest.raises(UsageError) as err:
        build_report(ctx, ["qmetric"], collect=False)
    assert "matched no file" in str(err.value) and "--metric" not in str(err.value), str(err.value)


def test_a_metric_name_in_no_row_is_the_metric_blamed(ctx: api.Context, tmp_path: Path) -> None:
    run = RunConfig(metrics="metrics.csv", metric="val_los", mode="min")
    (job,) = _sweep(ctx, tmp_path, run, ["lr"])
    rows = {"metric": "val_los", "mode": "min", "final": None, "best": None, "files": 1, "rows": 12, "curves": {}}
    record_collected(ctx.ledger, hd.read_collect("local", json.dumps({job: {"attempt": 1, "summary": rows}})).root)
    (found,) = [e for e in ctx.ledger.events(subject=job) if e.rule == observed.METRICS_RULE]
    assert "'val_los'" in found.message and "none of the 12 rows" in found.message
    assert found.reason.startswith("the metric 'val_los' ([run] metric) is in none of the 12 rows")
    assert found.message.endswith(found.reason)
    assert [r.error for r in api.results(ctx, sweep="qmetric")] == [found.reason]  # the field, not the words


def test_a_job_with_its_metric_gets_no_warning(ctx: api.Context, tmp_path: Path) -> None:
    (job,) = _sweep(ctx, tmp_path, RunConfig(metrics="m.csv", metric="acc"), ["ok"])
    good = {"metric": "acc", "final": {"acc": 0.5, "step": 3}, "best": {"acc": 0.6}, "files": 1, "rows": 3}
    record_collected(ctx.ledger, hd.read_collect("local", json.dumps({job: {"attempt": 1, "summary": good}})).root)
    assert not [e for e in ctx.ledger.events(subject=job) if e.rule == observed.METRICS_RULE]


def test_a_band_spans_seeds_never_two_attempts_of_one_job() -> None:
    # one job whose two attempts both reported steps 20 and 30 (as a ledger before the merge holds them)
    curves = {"j1": {"val_loss": [(10, 0.9), (20, 0.8), (20, 0.7), (30, 0.6), (30, 0.5)]}}
    band = figures.cell_band(["j1"], curves, "val_loss")
    assert [b[0] for b in band] == [10, 20, 30]
    assert all(low == high == mean for _, mean, low, high in band), band  # no spread from one job
    two = figures.cell_band(["j1", "j2"], {**curves, "j2": {"val_loss": [(20, 0.5)]}}, "val_loss")
    # across seeds: the later attempt's 0.7 and the other seed's 0.5
    assert two[1] == (20, pytest.approx(0.6), 0.5, 0.7)
