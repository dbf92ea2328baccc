"""``gpuq results`` and ``gpuq report`` read through the read path without the ORM (``ledger/reader.py``,
``reader_results.py``) and answer what they answer on the ``Ledger``: each read of results, events, pulls and
redaction row for row, column for column, type for type, on a varied sweep (``test_results_scale.build``);
the verbs' rows and reports equal; and a sweep with a finished job whose metrics are still on its host is
read on a ``Context``, which collects them (``resultrows.HostsNeeded``, ``cli.ctx.read_through``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import resultrows
from orchestrator.api.report import build_report
from orchestrator.api.resultrows import HostsNeeded, results
from orchestrator.cli.ctx import read_through
from orchestrator.context import Context, ReadContext
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import JobState
from orchestrator.ledger import StopLook
from orchestrator.ledger.reader import LedgerReader, record_columns
from tests.unit.test_results_scale import SWEEP, T0, _view, build

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def built(ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[str], LedgerReader]]:
    ids = build(ctx, tmp_path)
    monkeypatch.setattr(time, "time", lambda: T0 + 50_000)  # a running attempt's hours run to "now": the same now
    reader = LedgerReader(ctx.settings.ledger_path)
    try:
        yield ids, reader
    finally:
        reader.close()


def _cols(row: Any) -> dict[str, Any]:
    names = type(row).model_fields if hasattr(type(row), "model_fields") else record_columns(row)
    return {name: (type(getattr(row, name)), getattr(row, name)) for name in names}


def _same(orm: Any, read: Any) -> None:
    """Equal answers, ORM rows compared with the reader's records column by column (with their types)."""
    if isinstance(orm, dict):
        assert list(orm) == list(read)
        for key in orm:
            _same(orm[key], read[key])
    elif isinstance(orm, list):
        assert len(orm) == len(read)
        for a, b in zip(orm, read, strict=True):
            _same(a, b)
    elif hasattr(type(orm), "model_fields"):
        assert set(record_columns(read)) == set(type(orm).model_fields), type(orm).__name__
        assert _cols(orm) == _cols(read)
    else:
        assert (type(orm), orm) == (type(read), read)


def test_every_read_and_the_verbs_answer_as_on_the_ledger(ctx: Context, built: tuple[list[str], LedgerReader],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ids, reader = built
    led = ctx.ledger
    subjects = [*ids, *(f"{j}/a1" for j in ids), ids[0][:3], "gpu1", "nobody"]
    for name in ("gpu1", "cpu1", "gone"):
        _same(led.host(name), reader.host(name))
    _same(led.sweep(SWEEP), reader.sweep(SWEEP))
    assert reader.sweep("nope") is None
    for scopes, names in ((("final", "best"), None), (("final", "best", "best_row"), None), (("curve",), ["loss"]),
                          (("final",), ["acc", "loss"])):
        _same(led.metric_values(ids, scopes, names), reader.metric_values(ids, scopes, names))
    assert reader.metric_values(ids) != []
    _same(led.with_metrics(ids), reader.with_metrics(ids))
    _same(led.curves(ids), reader.curves(ids))
    _same(led.checkpoints_of(ids), reader.checkpoints_of(ids))
    _same(led.pulls(ids), reader.pulls(ids))
    _same(led.verified_pulls(ids), reader.verified_pulls(ids))
    assert reader.verified_pulls(ids) != {}
    _same(led.open_findings(subjects), reader.open_findings(subjects))
    assert reader.open_findings(subjects) != {}
    for limit in (1, 50, 200):
        _same(led.events_of(subjects, limit), reader.events_of(subjects, limit))
        _same(led.rule_counts(subjects, "from_scratch", limit), reader.rule_counts(subjects, "from_scratch", limit))
    for subject in (ids[6], ids[0][:3], "", "gpu1"):
        _same(led.events(subject, 50), reader.events(subject, 50))
        _same(led.events(subject, 50, exact=True), reader.events(subject, 50, exact=True))
    monkeypatch.setenv("GPUQ_SECRET_VALUE", "hunter2-hunter2")
    led.add_sweep(sweep_id="qfwd", queue_path="q", workdir="/w", queue_text="", jobs=[], default_retries=0,
                  run='{"forward_env": ["GPUQ_SECRET_VALUE"]}')
    with LedgerReader(ctx.settings.ledger_path) as fresh:
        texts = [["a hunter2-hunter2 b", "plain"], "x hunter2-hunter2"]
        assert fresh.redact(texts) == led.redact(texts) != texts
    # the verbs on either: the same rows, the same report
    light = ReadContext(ctx.settings, reader)
    assert [_view(r) for r in results(light, sweep=SWEEP)] == [_view(r) for r in results(ctx, sweep=SWEEP)]
    want = build_report(ctx, [SWEEP], metric="loss", collect=False).model_dump()
    assert build_report(light, [SWEEP], metric="loss").model_dump() == want


def test_a_job_whose_metrics_are_still_on_its_host_is_read_on_a_context(ctx: Context, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    ids = build(ctx, tmp_path, jobs=8)
    reader = LedgerReader(ctx.settings.ledger_path)
    try:
        assert resultrows.missing_metrics(reader, reader.jobs(sweep_id=SWEEP)) == {}
        ctx.ledger.ensure_host("gpu9", kind="ssh", root="/r", target="nowhere.invalid")
        job = ctx.ledger.jobs(sweep_id=SWEEP, states=[JobState.QUEUED])[0]
        ctx.ledger.start_attempt(job.id, host="gpu9", bundle_sha="s")
        ctx.ledger.transition(job.id, JobState.RUNNING)
        ctx.ledger.transition(job.id, JobState.SUCCEEDED)
    finally:
        reader.close()
    with LedgerReader(ctx.settings.ledger_path) as reader:
        assert resultrows.missing_metrics(reader, reader.jobs(sweep_id=SWEEP)) == {"gpu9": [job.id]}
        with pytest.raises(HostsNeeded):
            results(ReadContext(ctx.settings, reader), sweep=SWEEP)
    seen: list[type] = []

    def verb(context: Context | ReadContext) -> list[resultrows.ResultRow]:
        seen.append(type(context))
        return results(context, sweep=SWEEP)

    rows = {r.job.id: r for r in read_through(verb)}
    assert seen == [ReadContext, Context]  # the light path first, then the one that collects
    said = capsys.readouterr()
    assert said.err == "gpuq: 1 finished job without metrics in the ledger: reading it from host gpu9\n"
    assert said.out == ""
    assert rows[job.id].error.startswith("results not collected: host gpu9")  # it tried that host
    assert set(rows) == set(ids)


def test_a_grown_and_stopped_sweep_reads_the_same_and_light(ctx: Context, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A part that joined later (``submit --into``) and early stopping's looks and STOPPED job: the reader's
    ``parts_of``/``stop_looks`` answer as the ``Ledger``'s, results and report equal on either, and the
    commands still load no ORM."""
    build(ctx, tmp_path, jobs=12)
    led = ctx.ledger
    led.join_sweep(sweep_id=SWEEP, queue_path="q2.txt", queue_text="", bundle_sha="b2", default_retries=0,
                   jobs=[JobSpec(name=f"cell9-seed{i}", config="c.yaml", task="classify", config_sha256="0" * 64,
                                 line=i + 1, cell="cell9", seed=i) for i in range(2)], keys={}, reuse={})
    looks = [StopLook(sweep_id=SWEEP, cell=cell, rung=0, step=10, rule=rule, fraction=0.2, cell_mean=3.0,
                      baseline_mean=2.0, n_cell=2, n_baseline=2, statistic=4.0, threshold=0.025, p_value=1e-5,
                      stop=stop, decided_at=1.0)
             for cell, rule, stop in (("cell9", "baseline", True), ("cell2", "halving", False))]
    assert led.record_looks(looks) == 2
    stopped = next(j for j in led.jobs(sweep_id=SWEEP, states=[JobState.QUEUED]) if j.name == "cell9-seed0")
    led.start_attempt(stopped.id, host="gpu1", bundle_sha="s")
    led.transition(stopped.id, JobState.RUNNING)
    led.update_attempt(stopped.id, 1, step=10, total_steps=40)
    led.transition(stopped.id, JobState.STOPPED)
    monkeypatch.setattr(time, "time", lambda: T0 + 50_000)
    with LedgerReader(ctx.settings.ledger_path) as reader:
        _same(led.parts_of(SWEEP), reader.parts_of(SWEEP))
        _same(led.stop_looks([SWEEP, "nope"]), reader.stop_looks([SWEEP, "nope"]))
        assert [p.line for p in reader.parts_of(SWEEP)] == [p.line for p in led.parts_of(SWEEP)]
        light = ReadContext(ctx.settings, reader)
        rows = results(light, sweep=SWEEP)
        assert [(_view(r), r.joined, r.joined_at) for r in rows] == [
            (_view(r), r.joined, r.joined_at) for r in results(ctx, sweep=SWEEP)]
        assert sum(1 for r in rows if r.joined.startswith("joined: part 2")) == 2
        got = build_report(light, [SWEEP], metric="loss")
        assert got.model_dump() == build_report(ctx, [SWEEP], metric="loss", collect=False).model_dump()
    assert [c.verdict for c in got.cells if c.stopped] == ["stopped"] and any("part 2" in note for note in got.notes)
    assert got.saved is not None
    code = ("import sys\nfrom orchestrator.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint(' '.join(sorted(m for m in sys.modules if m.startswith(('sqlalchemy', 'sqlmodel', "
            "'orchestrator.ledger.store')))) or 'light', file=sys.stderr)\n")
    for argv in (["results", "--sweep", SWEEP], ["report", SWEEP, "--format", "json"]):
        ran = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                             check=False, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
        assert ran.returncode == 0 and ran.stderr.strip().splitlines()[-1] == "light", (argv, ran.stderr[-500:])
        assert "cell9" in ran.stdout
