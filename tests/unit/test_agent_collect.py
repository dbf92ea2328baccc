"""The host agent's `collect` in process (payload/agent/gpuq_records/gpuq_inbox.py): what a finished job sends
home, value for value. The summary (gpuq's payload's summary.json with curves from metrics.jsonl,
or a project's own metrics file summarized on the host), the attempt of the spec the agent holds,
the hashed result files and the checkpoint pointer.

tests/integration/test_own_project.py and the report tests drive the same answer through real agents;
these pin each rule on its own (scripts/mutation.py inbox).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

inbox = load_agent_module("gpuq_records.gpuq_inbox", qualified=True)
P = load_agent_module("gpuq_base.gpuq_protocol")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
summary = load_agent_module("gpuq_records.gpuq_summary", qualified=True)

JOB = "c000000000001"


def _job(root: Path) -> Path:
    job = root / P.JOBS_DIR / JOB
    job.mkdir(parents=True, exist_ok=True)
    return job


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _payload_metrics(job: Path) -> None:
    """gpuq's payload: train lines carry the loss, eval lines the metric."""
    lines = [{"step": 10, "loss": 2.0}, {"step": 10, "val_acc": 0.5, "val_loss": 1.5},
             {"step": 20, "loss": 1.0}, {"step": 20, "val_acc": 0.75, "val_loss": 1.25}]
    _write(job / P.RESULT_DIR / P.METRICS_FILE, "".join(json.dumps(line) + "\n" for line in lines))


def test_the_payloads_summary_gets_its_curves_from_metrics_jsonl(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, json.dumps({"metric": "val_acc", "final": {"val_acc": 0.75}}))
    _payload_metrics(job)
    _write(job / P.SPEC_FILE, json.dumps(spec_doc(job_id=JOB, attempt=2)))
    _write(job / P.CKPT_DIR / P.LATEST_POINTER, json.dumps({"file": "step_20.pt", "step": 20}))
    got = inbox.collect_one(str(tmp_path), JOB)
    assert got["attempt"] == 2
    assert got["ckpt"] == {"file": "step_20.pt", "step": 20}
    assert got["summary"] == {"metric": "val_acc", "final": {"val_acc": 0.75}, "curves": {
        "val_acc": [[10, 0.5], [20, 0.75]], "loss": [[10, 2.0], [20, 1.0]], "val_loss": [[10, 1.5], [20, 1.25]]}}
    # the summary's own metric picks the curve; without one it is val_acc
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, json.dumps({"metric": "val_loss"}))
    assert list(inbox.collect_one(str(tmp_path), JOB)["summary"]["curves"]) == ["val_loss", "loss"]
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, json.dumps({"final": {}}))
    assert list(inbox.collect_one(str(tmp_path), JOB)["summary"]["curves"]) == ["val_acc", "loss", "val_loss"]
    # curves the summary already has are kept as they are
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, json.dumps({"metric": "val_acc", "curves": {"val_acc": [[1, 1.0]]}}))
    assert inbox.collect_one(str(tmp_path), JOB)["summary"]["curves"] == {"val_acc": [[1, 1.0]]}
    # a summary that is not an object is no summary
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, "[1, 2]")
    assert inbox.collect_one(str(tmp_path), JOB)["summary"] is None


def test_nothing_finished_yet_is_an_empty_answer(tmp_path: Path) -> None:
    assert inbox.collect_one(str(tmp_path), JOB) == {"attempt": 0, "summary": None, "files": [], "ckpt": None}


def test_the_attempt_is_the_claimed_specs_before_the_jobs_own(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _write(job / P.SPEC_FILE, json.dumps(spec_doc(job_id=JOB, attempt=2)))
    assert summary.job_spec(str(tmp_path), JOB).attempt == 2
    _write(tmp_path / P.CLAIMED_DIR / f"{JOB}.json", json.dumps(spec_doc(job_id=JOB, attempt=3)))
    assert summary.job_spec(str(tmp_path), JOB).attempt == 3
    assert inbox.collect_one(str(tmp_path), JOB)["attempt"] == 3
    _write(tmp_path / P.CLAIMED_DIR / f"{JOB}.json", "not json")  # a torn claimed copy: the job's own spec
    assert inbox.collect_one(str(tmp_path), JOB)["attempt"] == 2
    _write(job / P.SPEC_FILE, '"a string"')
    assert inbox.collect_one(str(tmp_path), JOB)["attempt"] == 0
    _write(job / P.SPEC_FILE, json.dumps(spec_doc(job_id=JOB, attempt="2")))  # refused: no spec to read
    assert summary.job_spec(str(tmp_path), JOB) is None and inbox.collect_one(str(tmp_path), JOB)["attempt"] == 0


CSV = "epoch,step,train_loss,val_acc\n0,100,2.5,0.25\n1,200,1.5,0.5\n2,300,1.0,0.4\n"


def _own_project(root: Path, **run: Any) -> Path:
    job = _job(root)
    _write(job / P.RUN_DIR / "logs" / "metrics.csv", CSV)
    spec = spec_doc(job_id=JOB, attempt=1, run={"metrics": "logs/metrics.csv", "metric": "val_acc", **run})
    _write(job / P.SPEC_FILE, json.dumps(spec))
    return job


def test_a_projects_metrics_are_summarized_on_the_host_and_written_once(tmp_path: Path) -> None:
    job = _own_project(tmp_path)
    expected = {
        "metric": "val_acc", "mode": "max", "rows": 3, "steps": 300, "source": f"{P.RUN_DIR}/logs/metrics.csv",
        "files": 1,
        "final": {"epoch": 2, "step": 300, "train_loss": 1.0, "val_acc": 0.4},
        "best": {"epoch": 1, "step": 200, "train_loss": 1.5, "val_acc": 0.5},
        "curves": {"val_acc": [[100, 0.25], [200, 0.5], [300, 0.4]],
                   "train_loss": [[100, 2.5], [200, 1.5], [300, 1.0]]},
    }
    written = job / P.RESULT_DIR / P.SUMMARY_FILE
    # the read-only status probe computes it and writes nothing
    assert inbox.collect_one(str(tmp_path), JOB, write=False)["summary"] == expected
    assert not (job / P.RESULT_DIR).exists()
    # collect writes result/summary.json, so that a pull brings it home with the rest
    assert inbox.collect_one(str(tmp_path), JOB)["summary"] == expected
    assert json.loads(written.read_text()) == expected
    assert [f["path"] for f in inbox.collect_one(str(tmp_path), JOB)["files"]] == [f"{P.RESULT_DIR}/summary.json"]
    # the project's metrics win over a summary.json that is already there, and mode min is honoured
    _own_project(tmp_path, mode="min", metric="train_loss")
    got = inbox.collect_one(str(tmp_path), JOB)["summary"]
    assert (got["mode"], got["best"]["step"], got["final"]["step"]) == ("min", 300, 300)
    assert json.loads(written.read_text())["metric"] == "train_loss"


def test_a_summary_that_cannot_be_written_still_travels(tmp_path: Path) -> None:
    job = _own_project(tmp_path)
    _write(job / P.RESULT_DIR, "a file where the result dir belongs")
    got = inbox.collect_one(str(tmp_path), JOB)
    assert got["summary"]["final"]["val_acc"] == 0.4
    assert (job / P.RESULT_DIR).read_text() == "a file where the result dir belongs"


def test_a_project_without_usable_metrics_falls_back_to_its_summary_file(tmp_path: Path) -> None:
    job = _own_project(tmp_path, metrics="logs/missing.csv")
    counted = summary.project_summary(str(tmp_path), JOB, summary.job_spec(str(tmp_path), JOB), True)
    assert (counted["files"], counted["final"]) == (0, None)  # it says what it found: nothing
    assert not (job / P.RESULT_DIR / P.SUMMARY_FILE).exists()  # and writes no summary without a value
    assert inbox.collect_one(str(tmp_path), JOB)["summary"] == counted
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, json.dumps({"metric": "val_acc", "curves": {}}))
    assert inbox.collect_one(str(tmp_path), JOB)["summary"] == {"metric": "val_acc", "curves": {}}
    for run in ({"metrics": ""}, {"metric": "val_acc"}, None):
        assert summary.project_summary(str(tmp_path), JOB, jobspec.parse_spec(spec_doc(run=run)), True) is None
    assert summary.project_summary(str(tmp_path), JOB, None, True) is None


def test_a_log_metrics_project_reads_the_newest_attempts_log(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _write(job / P.ATTEMPTS_DIR / "1" / P.JOB_LOG, "step=1 acc=0.1\nstep=2 acc=0.2\n")
    _write(job / P.ATTEMPTS_DIR / "2" / P.JOB_LOG, "step=3 acc=0.6\n")
    spec = spec_doc(job_id=JOB, attempt=2,
                    run={"metrics": "log", "metric": "acc", "metrics_regex": r"step=(?P<step>\d+) acc=(?P<acc>[\d.]+)"})
    _write(job / P.SPEC_FILE, json.dumps(spec))
    got = inbox.collect_one(str(tmp_path), JOB)["summary"]
    assert (got["rows"], got["final"], got["source"]) == (3, {"step": 3, "acc": 0.6}, "log")


def test_collect_answers_every_job_asked_in_one_sorted_document(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(tmp_path)
    _write(job / P.RESULT_DIR / P.SUMMARY_FILE, json.dumps({"z": 1, "metric": "m", "curves": {}}))
    assert inbox.cmd_collect(str(tmp_path), [JOB, "c2"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert out == json.dumps(doc, sort_keys=True) + "\n"  # sorted keys: the same answer byte for byte
    assert list(doc) == [JOB, "c2"] and doc["c2"] == {"attempt": 0, "summary": None, "files": [], "ckpt": None}


def test_result_files_skip_temporaries_and_links_and_hash_the_best_checkpoint(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _write(job / P.RESULT_DIR / "0.tmp", "half written")  # sorts first: the files after it still count
    _write(job / P.RESULT_DIR / "a.txt", "aa")
    (job / P.RESULT_DIR / "b-link").symlink_to(job / P.RESULT_DIR / "a.txt")
    _write(job / P.RESULT_DIR / "c.txt", "c")
    _write(job / P.CKPT_DIR / P.BEST_CKPT, "best")
    files = inbox.collect_one(str(tmp_path), JOB)["files"]
    assert files == [
        {"path": f"{P.RESULT_DIR}/a.txt", "bytes": 2, "sha256": hashlib.sha256(b"aa").hexdigest()},
        {"path": f"{P.RESULT_DIR}/c.txt", "bytes": 1, "sha256": hashlib.sha256(b"c").hexdigest()},
        {"path": f"{P.CKPT_DIR}/{P.BEST_CKPT}", "bytes": 4, "sha256": hashlib.sha256(b"best").hexdigest()},
    ]
    os.unlink(job / P.CKPT_DIR / P.BEST_CKPT)
    (job / P.CKPT_DIR / P.BEST_CKPT).symlink_to("/etc/passwd")  # never followed
    assert [f["path"] for f in inbox.collect_one(str(tmp_path), JOB)["files"]] == [
        f"{P.RESULT_DIR}/a.txt", f"{P.RESULT_DIR}/c.txt"]
