"""gpuq report end to end: the example sweep with seeds=2 on the local host, then the table, the
JSON document, the learning-curve PNGs and the HTML page in a real browser."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import ROOT, run_gpuq
from tests.integration.test_report_html import _browser

pytestmark = pytest.mark.integration
EPOCHS = 2  # the example's 5-6 epochs take minutes with two seeds; the cells and curves are the same shape


def test_example_sweep_with_two_seeds_reports_cells_curves_and_a_page(gpuq_home: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "payload", project, ignore=shutil.ignore_patterns("__pycache__", "queue.txt"))
    lines = [line.split("#", 1)[0].split() for line in (ROOT / "payload" / "queue.txt").read_text().splitlines()]
    queue = project / "queue.txt"
    queue.write_text("".join(f"{words[0]} {words[1]} {EPOCHS} gpus=1 seeds=2\n" for words in lines if words))
    # one process per job, no torchrun around it (about 2 s of CPU each): the report is under test here
    (project / "gpuq.toml").write_text('launcher = "python"\n')
    submitted = run_gpuq("submit", str(queue), "--wait", timeout=900)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    doc = json.loads(run_gpuq("report", "--format", "json").stdout)
    cells = {c["cell"]: c for c in doc["cells"]}
    assert sorted(cells) == ["baseline", "lr_high", "no_aug", "wide"] and doc["baseline"] == "baseline"
    assert all((c["n_finished"], c["n_total"]) == (2, 2) for c in cells.values())
    assert (doc["finished"], doc["total"], doc["partial"]) == (8, 8, False)
    for name, cell in cells.items():
        assert cell["mean"] is not None and cell["ci_low"] <= cell["mean"] <= cell["ci_high"]
        if name != "baseline":  # two seeds each side: a Welch interval exists and decides the verdict
            assert cell["delta_ci_low"] is not None and cell["p_value"] is not None
            expect = ("better" if cell["delta_ci_low"] > 0 else "worse" if cell["delta_ci_high"] < 0
                      else "within noise")
            expect = expect if cell["p_adjusted"] < 0.05 else "within noise"  # Holm over the 3 compared cells
            assert cell["verdict"] == expect, cell

    ledger = Ledger(gpuq_home / "ledger.db")
    curves = ledger.curves(j for c in cells.values() for j in c["jobs"])
    assert len(curves) == 8 and all({"val_acc", "loss"} <= set(c) for c in curves.values()), curves.keys()

    table = run_gpuq("report", env={"COLUMNS": "250"})
    assert table.returncode == 0 and "lr_high" in table.stdout and "2/2" in table.stdout, table.stdout

    out = tmp_path / "report"
    html = run_gpuq("report", "--format", "html", "-o", str(out))
    assert html.returncode == 0, html.stderr
    assert {p.name for p in out.iterdir()} == {"report.html", "curve-val_acc.png", "curve-loss.png"}
    dom = _browser("--window-size=1400,1000", "--dump-dom", (out / "report.html").as_uri())
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body and 'data-figures-loaded="2"' in body.group(0), dom.stdout[:300]
    assert dom.stdout.count("<tr") == 5  # the header and the four cells
