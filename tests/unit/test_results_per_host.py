"""One bad host never breaks `gpuq results` / `gpuq report` for the whole sweep (issue 23 item 10):
an unreachable host and a host reporting a NaN metric each leave only their own jobs without metrics,
said on their rows; the other jobs' results are read and shown.  Real ledger, real agent, FakeHosts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.api.jobs import results
from orchestrator.api.report import build_report
from orchestrator.context import Context, open_context
from orchestrator.core import protocol
from orchestrator.core.errors import LedgerError
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import HostRow
from tests.support.fakehost import FakeHost
from tests.support.jobtree import SHA, finished_job, install_agent

SWEEP = "qhosts1"


@pytest.fixture
def ctx(gpuq_home: Path, tmp_path: Path) -> Iterator[Context]:
    ctx = open_context()
    specs = [JobSpec(name=n, config="c.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i, n in enumerate(["good", "dead", "nan"])]
    jobs = ctx.ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                                default_retries=1)
    for job in jobs:
        host = FakeHost(tmp_path / job.name, name=f"h-{job.name}")
        install_agent(Path(host.root))
        ctx.ledger.add_host(HostRow(name=host.name, kind="ssh", target="x", root=host.root, agent_bundle=SHA))
        ctx.fleet._hosts[host.name] = host  # the command's Host objects: FakeHosts instead of SSH
        ctx.ledger.start_attempt(job.id, host=host.name, bundle_sha=SHA)
        ctx.ledger.transition(job.id, AttemptState.RUNNING, attempt=1)
        ctx.ledger.transition(job.id, JobState.RUNNING)
        ctx.ledger.transition(job.id, AttemptState.EXITED, attempt=1)
        ctx.ledger.transition(job.id, JobState.SUCCEEDED)
        jdir = finished_job(Path(host.root), job.id, queue_id=SWEEP)
        if job.name == "nan":
            (jdir / protocol.RESULT_DIR / protocol.SUMMARY_FILE).write_text(
                '{"final": {"val_acc": NaN}, "best": {"val_acc": 0.8}}')
        if job.name == "dead":
            host.down = True
    try:
        yield ctx
    finally:
        ctx.close()


def test_results_show_every_row_and_say_which_host_failed(ctx: Context) -> None:
    rows = {r.job.name: r for r in results(ctx, sweep=SWEEP)}
    assert rows["good"].final == {"val_acc": 0.75} and rows["good"].error == ""
    assert rows["dead"].final == {} and "h-dead" in rows["dead"].error
    # a NaN final metric is no metric (dropped at the edge: host_documents.results); the host's other
    # numbers stand, and nothing breaks the sweep's other rows
    assert rows["nan"].final == {} and rows["nan"].best["val_acc"] == 0.8 and rows["nan"].error == ""
    again = {r.job.name: r for r in results(ctx, sweep=SWEEP)}  # every call, not only the first
    assert again["good"].final == {"val_acc": 0.75} and "h-dead" in again["dead"].error


def test_report_counts_the_good_jobs_and_notes_the_bad_hosts(ctx: Context) -> None:
    report = build_report(ctx, [SWEEP], metric="val_acc", mode="max")
    assert report.finished == 1
    assert any("h-dead" in n for n in report.notes), report.notes


def test_the_ledger_refuses_a_non_finite_metric_whole(ctx: Context) -> None:
    job = ctx.ledger.jobs(sweep_id=SWEEP)[0]
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(LedgerError, match="finite"):
            ctx.ledger.record_results(job.id, 1, metrics=[("final", "a", 1.0, None, None),
                                                          ("final", "b", bad, None, None)], artifacts=[])
    assert ctx.ledger.metrics([job.id]) == []
    assert json.dumps([m.value for m in ctx.ledger.metrics([job.id])]) == "[]"


def test_the_table_and_csv_say_on_each_row_why_its_results_are_missing(ctx: Context,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    from orchestrator.cli.resulttables import results_csv, results_table

    rows = results(ctx, sweep=SWEEP)
    results_csv(rows)
    by_name = {r["name"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert by_name["good"]["error"] == "" and by_name["good"]["final_val_acc"] == "0.75"
    assert "h-dead" in by_name["dead"]["error"] and by_name["dead"]["final_val_acc"] == ""
    results_table(rows)
    table = capsys.readouterr().out
    assert "note" in table and "h-dead" in table
