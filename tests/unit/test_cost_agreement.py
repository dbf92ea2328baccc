"""One cost policy (orchestrator/money/cost.py): ``gpuq status --json``, ``gpuq results --json`` and
``gpuq report --format json`` agree to the cent, at the price each attempt fixed when it started,
even after the host's price changed; and what a sweep's budget counts as spent (``status --json``'s
``budget.spent``, ``gpuq budget``) is the sum of its jobs' costs (orchestrator/money/budget.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.core.states import AttemptState, JobState
from orchestrator.queue.queuefile import parse_queue
from tests.conftest import run_gpuq

T0 = 1_700_000_000.0
QUEUE = "configs/a.yaml classify 3 name=baseline\nconfigs/b.yaml classify 3 name=wide\n"


@pytest.fixture
def sweep(gpuq_home: Path, tmp_path: Path) -> str:
    (tmp_path / "configs").mkdir()
    for name in "ab":
        (tmp_path / "configs" / f"{name}.yaml").write_text(f"seed: 1\nx: {name}\n")
    queue = tmp_path / "q.txt"
    queue.write_text(QUEUE)
    ctx = api.open_context()
    try:
        ledger = ctx.ledger
        ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        ledger.update_host("local", price_per_hour=2.0, gpu_count=4)  # each 1-GPU job pays a quarter
        jobs = {j.name: j for j in ledger.add_sweep(sweep_id="qcost001", queue_path=str(queue), workdir=str(tmp_path),
                                                     queue_text=QUEUE, jobs=parse_queue(queue).jobs,
                                                     default_retries=0, bundle_sha="b" * 64)}
        base = jobs["baseline"].id
        ledger.start_attempt(base, host="local", bundle_sha="s")  # the price is fixed now: $2/h
        ledger.update_host("local", price_per_hour=10.0)  # ... and the host's price changes afterwards
        ledger.transition(base, AttemptState.EXITED, attempt=1)
        ledger.transition(base, JobState.SUCCEEDED)
        ledger.update_attempt(base, 1, started_at=T0, ended_at=T0 + 5400)  # 1.5 h x $2 x 1/4 = $0.75
        ledger.record_results(base, 1, metrics=[("final", "val_acc", 0.8, 300, 3)], artifacts=[])
        wide = jobs["wide"].id
        ledger.start_attempt(wide, host="local", bundle_sha="s")  # started at the new price: $10/h
        ledger.transition(wide, AttemptState.EXITED, attempt=1, message="exit 1")
        ledger.transition(wide, JobState.FAILED, message="exit 1")
        ledger.update_attempt(wide, 1, started_at=T0, ended_at=T0 + 1800)  # 0.5 h x $10 x 1/4 = $1.25
    finally:
        ctx.close()
    return "qcost001"


def _json(*args: str) -> dict[str, object]:
    done = run_gpuq(*args)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def test_status_results_and_report_agree_to_the_cent(sweep: str) -> None:
    status = _json("status", "--json", "--no-probe", "--sweep", sweep)
    results = _json("results", "--json", "--sweep", sweep)
    report = _json("report", sweep, "--format", "json")
    by_status = {j["name"]: j["cost"] for j in status["jobs"]}  # type: ignore[attr-defined]
    by_results = {j["name"]: j["cost"] for j in results["jobs"]}  # type: ignore[attr-defined]
    by_report = {c["cell"]: c["cost_usd"] for c in report["cells"]}  # type: ignore[attr-defined]
    expected = {"baseline": 0.75, "wide": 1.25}
    for name, dollars in expected.items():
        cents = {round(100 * by_status[name]), round(100 * by_results[name]), round(100 * by_report[name])}
        assert cents == {round(100 * dollars)}, (name, by_status[name], by_results[name], by_report[name])
    (budget,) = [s["budget"] for s in status["sweeps"] if s["id"] == sweep]  # type: ignore[attr-defined]
    shown = run_gpuq("budget", sweep)
    assert shown.returncode == 0, shown.stderr
    spent = re.search(r"spent\s+\$([0-9.]+)", shown.stdout)
    assert spent is not None, shown.stdout
    assert budget == {"cap": None, "spent": pytest.approx(2.0), "committed": 0.0}
    assert {round(100 * budget["spent"]), round(100 * float(spent.group(1))),
            round(100 * sum(by_results.values()))} == {round(100 * sum(expected.values()))}
