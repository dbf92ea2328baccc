"""`gpuq pull` as a user meets it: a real tiny sweep on the local host, pulled home and verified."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
from pathlib import Path

import jsonschema
import pytest

from orchestrator.cli import documents
from scripts.bench_project import TINY_CONFIG
from tests.conftest import run_gpuq

pytestmark = pytest.mark.integration

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1"}


def _queue(tmp_path: Path, lines: list[str]) -> Path:
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    (work / "configs" / "tiny.yaml").write_text(TINY_CONFIG)
    (work / "configs" / "bad.yaml").write_text(TINY_CONFIG.replace("model: {", "model: {colour: red, "))
    queue = work / "queue.txt"
    queue.write_text("\n".join(lines) + "\n")
    return queue


def _sweep_of(stdout: str) -> str:
    return stdout.split("sweep ", 1)[1].split(":", 1)[0]


def test_pull_brings_a_real_sweep_home_verified_once(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _queue(tmp_path, ["configs/tiny.yaml classify 1 name=a", "configs/tiny.yaml classify 1 name=b seed=3"])
    submitted = run_gpuq("submit", str(queue), "--wait", env=ENV, timeout=300)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    sweep = _sweep_of(submitted.stdout)

    pulled = run_gpuq("pull", env=ENV)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "2 of 2 jobs verified" in pulled.stdout and "Traceback" not in pulled.stderr
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    jobs = dict(conn.execute("select name, id from job").fetchall())
    marks = conn.execute("select job_id, state, manifest_sha256 from pull").fetchall()
    conn.close()
    assert {(j, s) for j, s, _ in marks} == {(jobs["a"], "verified"), (jobs["b"], "verified")}
    for job_id in jobs.values():
        local = gpuq_home / "results" / sweep / job_id
        remote = gpuq_home / "local" / "jobs" / job_id
        record = json.loads((local / "PULL_VERIFIED.json").read_text())
        manifest = json.loads((local / "MANIFEST.json").read_text())
        assert record["manifest_sha256"] == hashlib.sha256((local / "MANIFEST.json").read_bytes()).hexdigest()
        assert record["queue_id"] == sweep and record["files"] == len(manifest["files"])
        paths = {f["path"] for f in manifest["files"]}
        assert {"result/metrics.jsonl", "result/summary.json", "ckpt/best.pt", "attempts/1/exit.json",
                "attempts/1/job.log"} <= paths and not any(p.startswith("ckpt/latest") for p in paths)
        for rel in paths:
            assert (local / rel).read_bytes() == (remote / rel).read_bytes()
        assert json.loads((local / "result" / "summary.json").read_text())["final"]["val_acc"] >= 0

    table = run_gpuq("results", env=ENV)
    assert table.returncode == 0 and table.stdout.count("verified") == 2, table.stdout
    rows = list(csv.DictReader(io.StringIO(run_gpuq("results", "--csv", env=ENV).stdout)))
    assert {r["pulled"] for r in rows} == {"verified"}
    assert {r["local_dir"] for r in rows} == {str(gpuq_home / "results" / sweep / j) for j in jobs.values()}

    again = run_gpuq("pull", "--sweep", sweep, env=ENV)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("already verified") == 2 and "0 just now" in again.stdout
    as_json = run_gpuq("pull", "--json", env=ENV)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    jsonschema.validate(doc, documents.json_schema("pull"))
    assert doc["ok"] is True and doc["sweep"] == sweep
    assert {(j["name"], j["state"], j["verified"]) for j in doc["jobs"]} == {("a", "already verified", True),
                                                                           ("b", "already verified", True)}
    results = json.loads(run_gpuq("results", "--json", env=ENV).stdout)
    jsonschema.validate(results, documents.json_schema("results"))
    assert {j["pulled"] for j in results["jobs"]} == {"verified"}
    assert all(j["final"]["val_acc"] >= 0 for j in results["jobs"])


def test_pull_of_a_sweep_without_results_fails_and_names_why(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _queue(tmp_path, ["configs/bad.yaml classify 1"])
    submitted = run_gpuq("submit", str(queue), "--wait", env=ENV, timeout=300)
    assert submitted.returncode == 1  # the job failed (configuration error)
    pulled = run_gpuq("pull", env=ENV)
    assert pulled.returncode == 1 and "Traceback" not in pulled.stderr
    assert "nothing was pulled" in pulled.stdout and "FAILED: no results to pull" in pulled.stdout
    assert not list((gpuq_home / "results" / _sweep_of(submitted.stdout)).glob("c*"))
    as_json = run_gpuq("pull", "--json", env=ENV)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["ok"] is False
    unknown = run_gpuq("pull", "--sweep", "qnothere", env=ENV)
    assert unknown.returncode == 2 and "no sweep matches 'qnothere'" in unknown.stderr
