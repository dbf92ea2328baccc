"""What the host agent reads from a project's own trainer (gpuq_observe.py, gpuq_runmetrics.py):
progress in a log's tail, the run dir's globs, and a metrics summary from CSV / JSON lines / a log
regex.  Pure functions on strings and a tmp dir; hostile input included."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.support.agentmodule import load_agent_module

OB = load_agent_module("gpuq_records.gpuq_observe")
OWN = load_agent_module("gpuq_records.gpuq_own")
M = load_agent_module("gpuq_records.gpuq_runmetrics")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
RUN_OF = jobspec.parse_run  # the spec's "run" as the agent reads it


# --- progress ------------------------------------------------------------------------


def test_tqdm_bar_gives_step_total_and_percentage() -> None:
    log = ("loading data\n"
           "Epoch 1:  10%|#         | 10/100 [00:01<00:09, 10.0it/s, loss=0.91]\r"
           "Epoch 1:  12%|#2        | 12/100 [00:01<00:08, 10.1it/s, loss=0.87]\r")
    p = OB.parse_progress(log)
    assert (p["step"], p["total"], p["pct"], p["epoch"], p["source"]) == (12, 100, 12.0, 1, "tqdm")
    assert p["loss"] == pytest.approx(0.87)
    assert p["line"].startswith("Epoch 1:  12%") and "\r" not in p["line"]


@pytest.mark.parametrize("line, epoch, epochs, pct", [
    ("epoch 3 done", 3, None, None),
    ("Epoch 3/10 | train_loss 0.5", 3, 10, 30.0),
    ("[GPU0] Epoch 7 | Batchsize: 32 | Steps: 16", 7, None, None),
    ("epoch=4 of 8", 4, 8, 50.0),
])
def test_epoch_forms(line: str, epoch: int, epochs: int | None, pct: float | None) -> None:
    p = OB.parse_progress("start\n" + line + "\n")
    assert (p["epoch"], p["epochs"], p["pct"], p["source"]) == (epoch, epochs, pct, "pattern")


def test_step_form_and_loss() -> None:
    p = OB.parse_progress("step 1100 loss 0.40\nstep 1200 loss: 0.35\n")
    assert (p["step"], p["total"], p["loss"], p["source"]) == (1200, None, 0.35, "pattern")


def test_project_regex_wins_and_fills_groups_from_recent_lines() -> None:
    rx = r"it (?P<step>\d+)/(?P<total>\d+)|ep=(?P<epoch>\d+) L=(?P<loss>[\d.]+)"
    log = "ep=2 L=0.5\nit 40/200\nEpoch 9/10\n"
    p = OB.parse_progress(log, rx)
    assert (p["step"], p["total"], p["epoch"], p["loss"], p["pct"], p["source"]) == (40, 200, 2, 0.5, 20.0,
                                                                                       "regex")


def test_a_regex_that_matches_nothing_or_is_invalid_falls_back_to_common_forms() -> None:
    assert OB.parse_progress("step 5/10\n", r"never (?P<step>\d+)")["source"] == "pattern"
    p = OB.parse_progress("step 5/10\n", "(unclosed")
    assert (p["step"], p["total"], p["pct"]) == (5, 10, 50.0)


def test_a_log_without_progress_still_shows_its_last_line_clean() -> None:
    p = OB.parse_progress("hello\n\x1b[31mred\x1b[0m \x07bell\t[bold]x[/bold]\n\n  \n")
    assert p["source"] is None and p["step"] is None and p["pct"] is None
    assert p["line"] == "red bell [bold]x[/bold]"
    assert OB.parse_progress("") is None and OB.parse_progress("\n\r\n") is None


def test_hostile_logs_stay_bounded(tmp_path: Path) -> None:
    big = tmp_path / "job.log"
    with open(big, "wb") as f:
        f.write(b"step 1/4\n")
        f.write(os.urandom(300_000).replace(b"\n", b"x").replace(b"\r", b"x"))  # one huge binary line
        f.write(b"\nEpoch 2/4\n" + b"A" * 100_000)
    p = OB.job_progress(str(big))
    assert p is not None and len(p["line"]) <= 200
    assert all(c.isprintable() for c in p["line"])
    assert p["step"] is None  # "step 1/4" is beyond the 64 KiB tail
    assert OB.job_progress(str(tmp_path / "missing.log")) is None
    assert len(OB.read_tail(str(big))) <= OB.PROGRESS_TAIL_BYTES


def test_percentages_are_clamped() -> None:
    assert OB.parse_progress("step 150/100\n")["pct"] == 100.0


# --- globs in the run dir ---------------------------------------------------------------


def _tree(run: Path) -> None:
    (run / "outputs" / "a" / "b").mkdir(parents=True)
    (run / "outputs" / "top.txt").write_text("t")
    (run / "outputs" / "a" / "b" / "deep.txt").write_text("d")
    (run / "snapshot.pt").write_bytes(b"s1")
    (run / "ckpts").mkdir()
    (run / "ckpts" / "epoch=1.ckpt").write_bytes(b"e1")
    (run / "result.json").write_text("{}")
    (run / "configs").symlink_to(run / "outputs")  # the project's files are links: never matched
    (run / "link.json").symlink_to(run / "result.json")


def test_globs_match_the_jobs_own_files_with_recursive_double_star(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _tree(run)
    found, refused = OWN.scan(str(run), ["outputs/**", "*.json"])
    assert refused == []
    assert sorted((f.rel, f.kind) for f in found) == [
        ("link.json", "link"), ("outputs/a/b/deep.txt", "file"), ("outputs/top.txt", "file"), ("result.json", "file")]
    # a glob that names a directory takes it whole (for outputs: every file under it comes home)
    assert [(f.rel, f.kind) for f in OWN.scan(str(run), "outputs/*")[0]] == [("outputs/a", "dir"),
                                                                           ("outputs/top.txt", "file")]
    assert [f.rel for f in OWN.scan(str(run), ["**/*.ckpt"])[0]] == ["ckpts/epoch=1.ckpt"]
    assert OWN.scan(str(run), ["../*", "/etc/*", ""]) == ([], [])


def test_newest_checkpoint_by_mtime(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _tree(run)
    os.utime(run / "snapshot.pt", (1000, 1000))
    os.utime(run / "ckpts" / "epoch=1.ckpt", (2000, 2000))
    found = OWN.newest_checkpoint(str(run), ["snapshot.pt", "ckpts/*.ckpt"])
    assert (found.rel, found.kind, found.mtime) == ("ckpts/epoch=1.ckpt", "file", 2000)
    assert OWN.newest_checkpoint(str(run), ["nothing*.pt"]) is None
    assert OWN.newest_checkpoint(str(tmp_path / "absent"), ["*.pt"]) is None


def test_the_walk_is_capped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "d").mkdir(parents=True)
    for i in range(50):
        (run / "d" / f"f{i:03d}.txt").write_text("x")
    assert len(OWN.scan(str(run), "**", limit=10)[0]) < 10


# --- metrics ------------------------------------------------------------------------------

LIGHTNING_CSV = """epoch,step,train_loss,val_acc,val_loss
0,49,0.9,,
0,49,,0.61,0.8
1,99,0.7,,
1,99,,0.72,0.6
2,149,0.6,,
2,149,,nan,0.9
3,199,0.5,,
3,199,,0.70,0.7
"""


def test_lightning_csv_with_gaps_gives_final_and_best() -> None:
    head, _, body = LIGHTNING_CSV.partition("\n")
    s = M.summarize(M.csv_rows(head, body), "val_acc", "max")
    assert s["final"]["val_acc"] == 0.70 and s["final"]["step"] == 199
    assert s["best"]["val_acc"] == 0.72 and s["best"]["epoch"] == 1 and s["best"]["step"] == 99
    assert s["steps"] == 199 and (s["metric"], s["mode"]) == ("val_acc", "max")
    lo = M.summarize(M.csv_rows(head, body), "val_loss", "min")
    assert lo["best"]["val_loss"] == 0.6 and lo["final"]["val_loss"] == 0.7
    json.dumps(s, allow_nan=False)  # strict JSON: NaN travels as a string, never as a bare NaN


def test_nan_and_text_never_win_best_but_a_nan_final_is_reported() -> None:
    rows = M.csv_rows("val_acc,step", "0.5,1\nbroken,2\nnan,3\n")
    s = M.summarize(rows, "val_acc", "max")
    assert s["best"]["val_acc"] == 0.5
    assert s["final"]["step"] == 3 and s["final"]["val_acc"] == "nan"
    assert M.summarize(M.csv_rows("val_acc", "nan\n"), "val_acc", "max")["best"] is None
    assert M.summarize(rows, "absent", "max") is None


def test_jsonl_rows_skip_garbage() -> None:
    body = '{"step": 1, "val_acc": 0.5}\nnot json\n[1,2]\n{"step": 2, "val_acc": 0.9, "tag": {"x": 1}}\n{"step": 3'
    s = M.summarize(M.jsonl_rows("", body), "val_acc", "max")
    assert s["final"]["step"] == 2 and s["best"]["val_acc"] == 0.9 and "tag" not in s["final"]


def test_log_regex_named_groups() -> None:
    text = "epoch 1 val_acc=0.5\nnoise\nepoch 2 val_acc=0.8\nepoch 3 val_acc=0.6\n"
    rows = M.log_rows([text], r"epoch (?P<epoch>\d+) val_acc=(?P<val_acc>[\d.]+)")
    s = M.summarize(rows, "val_acc", "max")
    assert s["final"]["epoch"] == 3 and s["best"]["val_acc"] == 0.8 and s["best"]["step"] == 2
    assert M.log_rows([text], "(bad") == []


def _job(tmp_path: Path, run: dict[str, object], files: dict[str, bytes]) -> Path:
    jdir = tmp_path / "jobs" / "c1"
    for rel, data in files.items():
        (jdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (jdir / rel).write_bytes(data)
    return jdir


def test_run_summary_reads_the_file_in_the_run_dir(tmp_path: Path) -> None:
    jdir = _job(tmp_path, {}, {"run/logs/metrics.csv": LIGHTNING_CSV.encode()})
    s = M.run_summary(str(jdir), RUN_OF({"metrics": "logs/metrics.csv", "metric": "val_acc", "mode": "max"}), 1)
    assert s["best"]["val_acc"] == 0.72 and s["source"] == "run/logs/metrics.csv"
    assert M.run_summary(str(jdir), RUN_OF({"metrics": "../../etc/passwd", "metric": "x"}), 1) is None
    absent = M.run_summary(str(jdir), RUN_OF({"metrics": "absent.csv", "metric": "x"}), 1)
    assert (absent["files"], absent["rows"], absent["final"], absent["best"]) == (0, 0, None, None)  # said, not silent
    assert M.run_summary(str(jdir), RUN_OF({"metrics": ""}), 1) is None


def test_run_summary_from_the_logs_of_every_attempt(tmp_path: Path) -> None:
    jdir = _job(tmp_path, {}, {"attempts/1/job.log": b"acc 0.9 at 1\n", "attempts/2/job.log": b"acc 0.4 at 2\n"})
    run = {"metrics": "log", "metrics_regex": r"acc (?P<acc>[\d.]+) at (?P<step>\d+)", "metric": "acc",
           "mode": "min"}
    s = M.run_summary(str(jdir), RUN_OF(run), 2)
    assert s["final"]["step"] == 2 and s["best"]["acc"] == 0.4 and s["source"] == "log"


def test_metrics_symlink_is_refused(tmp_path: Path) -> None:
    jdir = _job(tmp_path, {}, {"elsewhere.csv": b"val_acc\n1\n"})
    (jdir / "run").mkdir()
    (jdir / "run" / "m.csv").symlink_to(jdir / "elsewhere.csv")
    s = M.run_summary(str(jdir), RUN_OF({"metrics": "m.csv", "metric": "val_acc"}), 1)
    assert s["files"] == 0 and s["final"] is None and s["rows"] == 0  # a link is never read


def test_a_big_metrics_file_is_read_as_header_plus_newest_bytes(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    with open(path, "w") as f:
        f.write("step,val_acc\n")
        for i in range(20000):
            f.write(f"{i},{i / 20000:.5f}\n")
    head, body = M._read_bounded(str(path), limit=4096)
    assert head == "step,val_acc" and len(body) <= 4096
    rows = M.csv_rows(head, body)
    assert rows[-1]["step"] == 19999 and all(set(r) == {"step", "val_acc"} for r in rows)


def test_binary_garbage_csv_does_not_raise() -> None:
    rows = M.csv_rows("a,b", "\x00\x01,\xff\n1,2\n")
    s = M.summarize(rows, "b", "max")
    assert s is None or math.isfinite(float(s["best"]["b"]))
