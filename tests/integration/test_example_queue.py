"""The README's first command, as a newcomer runs it: the example sweep on the embedded local host, then
its report as the README shows it: the table, the JSON document, the learning-curve PNGs and the HTML page
in a real browser (the one run of the example here: eight torchrun jobs are minutes of CPU on 2 cores)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq
from tests.integration.test_report_html import _browser

pytestmark = pytest.mark.integration


def test_example_queue_runs_to_success_on_the_local_host(gpuq_home: Path, tmp_path: Path) -> None:
    submitted = run_gpuq("submit", "payload/queue.txt", "--wait", timeout=900)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "warning" not in submitted.stdout + submitted.stderr  # the example configs agree with the queue

    status = run_gpuq("status", "--once")
    assert status.returncode == 0, status.stderr
    assert "SUCCEEDED=8" in status.stdout  # 4 lines, seeds=2 each

    doc = json.loads(run_gpuq("status", "--json").stdout)
    jobs = doc["jobs"]
    assert len(jobs) == 8 and {j["state"] for j in jobs} == {"SUCCEEDED"}
    assert all(j["gpus"] == 2 and j["step"] == j["total_steps"] for j in jobs)

    # two torchrun processes per job: the payload records its world size
    for job in jobs:
        summary = gpuq_home / "local" / "jobs" / job["id"] / "result" / "summary.json"
        assert json.loads(summary.read_text())["world_size"] == 2

    results = run_gpuq("results")
    assert results.returncode == 0 and "final val_acc" in results.stdout
    rows = list(csv.DictReader(io.StringIO(run_gpuq("results", "--csv").stdout)))
    assert len(rows) == len(jobs)
    assert all(0.0 <= float(r["final_val_acc"]) <= 1.0 for r in rows)

    # the README's first command ends here: two seeds per cell, so every cell has an interval
    doc = json.loads(run_gpuq("report", "--format", "json").stdout)
    cells = {c["cell"]: c for c in doc["cells"]}
    assert sorted(cells) == ["baseline", "lr_high", "no_aug", "wide"] and doc["baseline"] == "baseline"
    assert all((c["n_finished"], c["n_total"]) == (2, 2) and c["ci_low"] is not None for c in cells.values())
    assert (doc["finished"], doc["total"], doc["partial"]) == (8, 8, False)
    _check_verdicts(cells)
    curves = Ledger(gpuq_home / "ledger.db").curves(j for c in cells.values() for j in c["jobs"])
    assert len(curves) == 8 and all({"val_acc", "loss"} <= set(c) for c in curves.values()), curves.keys()

    table = run_gpuq("report", env={"COLUMNS": "250"})
    assert table.returncode == 0 and "lr_high" in table.stdout and "2/2" in table.stdout, table.stdout
    _check_html_page(tmp_path / "report")


def _check_verdicts(cells: dict[str, dict[str, object]]) -> None:
    """Two seeds each side: a Welch interval exists for every compared cell and decides its verdict,
    after Holm's correction over the three compared cells."""
    for name, cell in cells.items():
        assert cell["mean"] is not None and cell["ci_low"] <= cell["mean"] <= cell["ci_high"]  # type: ignore[operator]
        if name == "baseline":
            continue
        assert cell["delta_ci_low"] is not None and cell["p_value"] is not None
        expect = ("better" if cell["delta_ci_low"] > 0 else "worse" if cell["delta_ci_high"] < 0  # type: ignore[operator]
                  else "within noise")
        expect = expect if cell["p_adjusted"] < 0.05 else "within noise"  # type: ignore[operator]
        assert cell["verdict"] == expect, cell


def _check_html_page(out: Path) -> None:
    html = run_gpuq("report", "--format", "html", "-o", str(out))
    assert html.returncode == 0, html.stderr
    assert {p.name for p in out.iterdir()} == {"report.html", "curve-val_acc.png", "curve-loss.png"}
    dom = _browser("--window-size=1400,1000", "--dump-dom", (out / "report.html").as_uri())
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body and 'data-figures-loaded="2"' in body.group(0), dom.stdout[:300]
    cells_table = re.search(r'<table id="cells".*?</table>', dom.stdout, re.S)
    assert cells_table and cells_table.group(0).count("<tr") == 5  # the header and the four cells
