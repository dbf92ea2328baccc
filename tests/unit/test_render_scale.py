"""`gpuq results` and `gpuq report` draw a 10,000-job sweep fast (docs/performance.md, "Results and report")
and show what they showed before.

* ``--json``: ``jsontext.dumps`` writes what ``json.dumps(indent=2, sort_keys=True)`` writes, on varied
  documents; ``gpuq results --json`` (plain dicts validated once) prints the very text the per-row
  pydantic models printed (the old ``emit.results``, kept here as the oracle), schema-valid, and refuses
  what they refused.
* Tables: past ``plaintable.RICH_ROWS`` rows the cells are plain aligned text; the rich table and the
  plain one carry the same cells and the same lines below them, host text printable and never markup.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
from rich.cells import cell_len
from rich.console import Console

from orchestrator.api.jobs import ResultRow, results
from orchestrator.api.report import build_report
from orchestrator.cli import documents as d
from orchestrator.cli import emit, jsontext, plaintable, render, resulttables
from orchestrator.cli import report as report_cli
from orchestrator.context import Context
from orchestrator.core.specs import known_epochs
from orchestrator.ledger.tables import Job
from orchestrator.money.cost import JobCost
from orchestrator.report.model import FailureRow
from tests.unit.test_report_build import QUEUE, VALUES, _sweep
from tests.unit.test_results_scale import SWEEP, build

NASTY = "[bold]evil[/] \x1b]0;title\x07 :smile: 100%s \x1b[8m"  # markup, emoji code, escapes, a format
SHOWN = "[bold]evil[/] ]0;title :smile: 100%s [8m"  # ... as printable() shows it


# --- jsontext ------------------------------------------------------------------------------------------


class Size(enum.IntEnum):
    SMALL = 1


class Word(str, enum.Enum):
    HI = "hi"


def _scalar(rng: random.Random) -> Any:
    return rng.choice([
        None, True, False, 0, -7, 10**30, 0.1, -2.5e-8, 1e16, 123456.789, math.inf, -math.inf, math.nan, "",
        "plain", "quote \" back \\ slash", "tab\tnew\nline\x00nul\x1b", "é ü 名前 \u2028 😀", "%s %d %%", Size.SMALL,
        Word.HI, 3.0,
    ])


def _doc(rng: random.Random, depth: int) -> Any:
    pick = rng.random()
    if depth == 0 or pick < 0.4:
        return _scalar(rng)
    if pick < 0.55:
        return [_doc(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    if pick < 0.7:
        return {rng.choice(["a", "b", "%s", "%%", "é", "k\x00", "z"]) + str(rng.randint(0, 3)): _doc(rng, depth - 1)
                for _ in range(rng.randint(0, 4))}
    keys = rng.sample(["id", "final", "%s", "b", "a b", "名"], rng.randint(1, 5))
    rows: list[Any] = [{k: _doc(rng, depth - 1) for k in rng.sample(keys, len(keys))} for _ in range(rng.randint(2, 6))]
    if rng.random() < 0.5:  # a row of other keys, or not a dict, among them
        rows.insert(rng.randint(0, len(rows)), rng.choice([{"other": 1}, {}, None, [1, {"x": 2}], "text"]))
    return tuple(rows) if rng.random() < 0.2 else rows


def test_jsontext_writes_what_json_dumps_writes() -> None:
    rng = random.Random(5)
    docs = [_doc(rng, 5) for _ in range(400)]
    docs += [{}, [], {"a": {}}, [[]], [{}, {}], [{"a": 1}, {"a": 2}], {"jobs": [{"x": None}] * 3}, "s", 1.5, None]
    for doc in docs:
        assert jsontext.dumps(doc) == json.dumps(doc, indent=2, sort_keys=True), doc


def test_jsontext_refuses_what_json_cannot_write() -> None:
    with pytest.raises(TypeError):
        jsontext.dumps({"a": [{"b": object()}, {"b": 1}]})
    with pytest.raises(TypeError):
        jsontext.dumps({1: "a key that is not text"})


# --- gpuq results --json ---------------------------------------------------------------------------------


def _old_results_json(rows: list[ResultRow]) -> str:
    """What ``emit.results`` printed before: one pydantic model per row, ``Doc.dump``."""
    jobs = []
    for row in rows:
        j, c = row.job, row.cost
        ran = None
        if row.attempt is not None and row.provenance is not None:
            p = row.provenance
            ran = d.RanWith(host=row.attempt.host, slot_kind=p.slot_kind, gpu_model=p.gpu_model,
                            gpu_count=p.gpu_count, driver=p.driver, cuda=p.cuda, torch=p.torch, nccl=p.nccl,
                            python=p.python)
        jobs.append(d.ResultJob(
            id=j.id, sweep_id=j.sweep_id, name=j.name, task=j.task, epochs=known_epochs(j.epochs), state=j.state,
            attempts=j.attempt_count, final=row.final, best=row.best, best_row=row.best_row,
            gpu_hours=c.gpu_hours if c else None, cost=c.cost if c else None,
            lost_gpu_hours=c.lost_gpu_hours if c else None, preemptions=c.preemptions if c else None,
            pulled=row.pulled, local_dir=row.local_dir, error=row.error,
            restarts_from_scratch=row.restarts_from_scratch,
            cpu_hours=c.cpu_hours if c else None, ran_with=ran, git_commit=row.git[0] or None, git_dirty=row.git[1],
            reused_from=row.job.reused_from, part=row.job.part, joined_at=row.joined_at))
    return d.ResultsDocument(schema_="gpuq.cli.results/1", sweep=rows[0].job.sweep_id, metric=rows[0].metric,
                             mode=rows[0].mode, jobs=jobs).dump()


def _renamed(row: ResultRow, **job: Any) -> ResultRow:
    """``row`` with its job changed (a copy: the ledger's row is left alone)."""
    return dataclasses.replace(row, job=Job(**{**row.job.model_dump(), **job}))


def _varied_rows(ctx: Context, tmp_path: Path, *, ints: bool = True) -> list[ResultRow]:
    """The varied sweep of test_results_scale, and rows no ledger gives: host text with escapes and
    markup, non-ASCII names, a metric named like a format and (``ints``) ints where the document has
    floats."""
    build(ctx, tmp_path)
    rows = results(ctx, sweep=SWEEP)
    rows[1] = _renamed(rows[1], name=NASTY, task="名前")
    rows[2] = dataclasses.replace(rows[2], final={"loss": 1.5, "%s": 2.5}, best={"loss": 0.25})
    if ints:
        rows[2] = dataclasses.replace(rows[2], final={"loss": 1, "%s": 2.5}, best={"loss": 0},
                                      cost=JobCost(gpu_hours=1, cost=2, lost_gpu_hours=0, preemptions=3, cpu_hours=0))
    rows[3] = dataclasses.replace(rows[3], error=NASTY)
    rows[4] = _renamed(rows[4], name="日本語の名前-seed1")
    return rows


@pytest.mark.parametrize("ints", [False, True])
def test_results_json_is_the_text_the_per_row_models_printed(ctx: Context, tmp_path: Path, ints: bool,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Without ints the dicts pass strict validation and are written as they are; with them, the
    lax validation's dump is written: the same text as the models' either way."""
    import jsonschema

    rows = _varied_rows(ctx, tmp_path, ints=ints)
    jobs = emit._result_jobs(rows)
    strict = {"schema": "gpuq.cli.results/1", "sweep": SWEEP, "metric": "loss", "mode": "min", "jobs": jobs}
    d.ResultsDocument.model_validate(strict, strict=True)  # ints or not: strict takes an int for a float
    assert emit._floats_only(jobs) is not ints
    emit.results(rows)
    got = capsys.readouterr().out
    assert got == _old_results_json(rows)
    doc = json.loads(got)
    jsonschema.Draft202012Validator(d.json_schema("results")).validate(doc)
    assert '"loss": 1.0' in got if ints else '"loss": 1.5' in got  # floats, as the models wrote them
    assert len({j["id"] for j in doc["jobs"]}) == len(rows) > 20 and doc["jobs"][1]["name"] == NASTY


def test_every_float_field_of_a_result_is_checked() -> None:
    """``emit._floats_only`` looks at every field of ``ResultJob`` that holds floats."""
    floats = {name for name, field in d.ResultJob.model_fields.items() if field.annotation in (float, float | None)}
    maps = {name for name, field in d.ResultJob.model_fields.items() if field.annotation == dict[str, float]}
    assert floats == set(emit.FLOAT_FIELDS) and maps == set(emit.FLOAT_MAPS)
    assert not any("float" in str(f.annotation) for n, f in d.ResultJob.model_fields.items()
                   if n not in floats | maps)
    assert not any("float" in str(f.annotation) for f in d.RanWith.model_fields.values())


def test_results_json_refuses_a_row_the_models_refused(ctx: Context, tmp_path: Path) -> None:
    rows = _varied_rows(ctx, tmp_path)
    rows[5] = _renamed(rows[5], state="HALF-DONE")
    with pytest.raises(pydantic.ValidationError):
        _old_results_json(rows)
    with pytest.raises(pydantic.ValidationError):
        emit.results(rows)


# --- tables: rich and plain --------------------------------------------------------------------------------


def _rich_parts(text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """A rich table's header, its rows' cells and the lines after it (one line per row: none wraps)."""
    lines = text.splitlines()
    header = [c.strip() for c in next(line for line in lines if line.startswith("┃")).split("┃")[1:-1]]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return header, rows, lines[end + 1:]


def _plain_parts(text: str, rows: int) -> tuple[str, list[str], list[list[str]], list[str]]:
    """The plain table's title, header, rows' cells (cut where every line has two spaces or more,
    whatever each column's alignment) and the lines after it."""
    lines = text.splitlines()
    table = lines[1:2 + rows]
    width = max(map(len, table))
    blank = [all(len(line) <= p or line[p] == " " for line in table) for p in range(width)] + [True]
    cuts, p = [], 0
    while p < width:
        if blank[p] and blank[p + 1]:
            start = p
            while p < width and blank[p]:
                p += 1
            cuts.append((start, p))
        p += 1
    bounds = [0, *[x for cut in cuts for x in cut], width]
    cells = [[line[a:b].strip() for a, b in zip(bounds[::2], bounds[1::2], strict=True)] for line in table]
    return lines[0], cells[0], cells[1:], lines[2 + rows:]


def test_results_table_plain_and_rich_carry_the_same_cells(ctx: Context, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [r for i, r in enumerate(_varied_rows(ctx, tmp_path)) if i != 4]  # (wide characters: below)
    # a screen wide enough that rich wraps no cell (the long notes), so that its cells can be read back
    monkeypatch.setattr(render, "console", lambda: Console(highlight=False, soft_wrap=False, width=400))
    columns, cells, below = resulttables.result_cells(rows)
    resulttables.results_table(rows, plain=False)
    rich_header, rich_rows, rich_below = _rich_parts(capsys.readouterr().out)
    resulttables.results_table(rows, plain=True)
    title, plain_header, plain_rows, plain_below = _plain_parts(capsys.readouterr().out, len(rows))
    assert title == f"results of {SWEEP}"
    assert rich_header == plain_header == columns and "note" in columns and "preempted" in columns
    assert rich_rows == plain_rows == [[text for text, _ in row] for row in cells]
    assert rich_below == plain_below == ["".join(text for text, _ in line) for line in below]
    assert any("restarted from scratch" in line for line in plain_below) and plain_below[-1].startswith("total ")
    by_id = {row[0]: row for row in plain_rows}
    assert by_id[rows[1].job.id][1] == SHOWN and by_id[rows[3].job.id][-1] == SHOWN  # name and note


def test_report_table_plain_and_rich_carry_the_same_cells(ctx: Context, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _sweep(ctx, tmp_path, "qgggggg", QUEUE, VALUES, failed=("baseline-seed3",))
    doc = build_report(ctx, ["qgggggg"])
    doc.cells[1].flags.append(NASTY)
    doc.notes.append(NASTY)
    doc.failures.append(FailureRow(job="j", name="n", cell="c", state="FAILED", failure_class="oom",
                                   message=NASTY, log_tail=[]))
    for width, wide in (("400", True), ("120", False)):  # 400: rich wraps no flag, its cells can be read back
        monkeypatch.setenv("COLUMNS", width)
        columns, cells, below = report_cli.report_cells(doc, wide)
        report_cli._table(doc, plain=False)
        rich_header, rich_rows, rich_below = _rich_parts(capsys.readouterr().out)
        report_cli._table(doc, plain=True)
        title, plain_header, plain_rows, plain_below = _plain_parts(capsys.readouterr().out, len(doc.cells))
        assert title.startswith("sweep qgggggg: val_acc (higher is better)")
        assert rich_header == plain_header == columns and ("flags" in columns) == wide
        assert rich_rows == plain_rows == [[text for text, _ in row] for row in cells]
        assert rich_below == plain_below == ["".join(text for text, _ in line) for line in below]
        assert {"better", "within noise", "baseline"} <= {row[columns.index("verdict")] for row in plain_rows}
        assert f"note: {SHOWN}" in plain_below and f"failed n (oom): {SHOWN}" in plain_below
        assert (f"{doc.cells[1].cell}: {SHOWN}" in plain_below) != wide  # the flags: a column, or lines below
        assert "failed baseline-seed3 (config): " in "\n".join(plain_below)


def test_past_a_screenful_of_rows_the_table_is_plain(ctx: Context, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _varied_rows(ctx, tmp_path)
    monkeypatch.setattr(plaintable, "RICH_ROWS", len(rows))
    resulttables.results_table(rows)
    assert "┃" in capsys.readouterr().out
    monkeypatch.setattr(plaintable, "RICH_ROWS", len(rows) - 1)
    resulttables.results_table(rows)
    out = capsys.readouterr().out
    assert "┃" not in out and "│" not in out and out.startswith(f"results of {SWEEP}\njob ")
    assert "\x1b" not in out and SHOWN in out  # host text: printable, never markup


def test_plain_table_aligns_by_screen_width_and_colours_only_the_text() -> None:
    rows = [[("日本語", ""), ("SUCCEEDED", "green"), ("1.5", "")], [("ab", ""), ("FAILED", "red"), ("10.25", "")]]

    def drawn(terminal: bool) -> str:
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal, color_system="standard" if terminal else None,
                          width=100)
        plaintable.write(console, "title", ["name", "state", "value"], rows, right=["value"])
        plaintable.write_lines(console, [[("a", "red"), (": b", "")]])
        return out.getvalue()

    plain = drawn(False)
    assert plain.splitlines() == ["title", "name    state      value", "日本語  SUCCEEDED    1.5",
                                  "ab      FAILED     10.25", "a: b"]
    assert len({cell_len(line) for line in plain.splitlines()[1:4]}) == 1
    coloured = drawn(True)
    assert "\x1b[32mSUCCEEDED\x1b[0m  " in coloured and "\x1b[31mFAILED\x1b[0m     " in coloured
    assert re.sub("\x1b\\[[0-9;]*m", "", coloured) == plain
