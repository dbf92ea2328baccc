"""``seeds=auto:MIN..MAX`` in a queue line (orchestrator/queue/queueline.py): strict, one line per error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.core.errors import QueueParseError
from orchestrator.queue import queueline
from orchestrator.queue.queuefile import parse_bytes
from orchestrator.stopping.seeds import AutoSeeds
from tests.conftest import run_gpuq


def _parse(text: str) -> list[tuple[str, int | None, int]]:
    parsed = parse_bytes(text.encode(), label="q.txt", workdir=None, needs_config=False)
    return [(j.name, j.seed, j.seeds_max) for j in parsed.jobs]


def _error(text: str) -> str:
    with pytest.raises(QueueParseError) as caught:
        _parse(text)
    return str(caught.value).splitlines()[0]


def test_min_seeds_now_and_the_max_on_every_job_of_the_line() -> None:
    jobs = _parse("name=baseline seeds=auto:2..5 -- a\nname=wide seeds=auto -- b {x,y}\nname=fixed seeds=2 -- c\n")
    assert jobs[:2] == [("baseline-seed0", 0, 5), ("baseline-seed1", 1, 5)]
    assert [j for j in jobs if j[0].startswith("wide-x")] == [("wide-x-seed0", 0, 8), ("wide-x-seed1", 1, 8),
                                                                ("wide-x-seed2", 2, 8)]
    assert jobs[-2:] == [("fixed-seed0", 0, 0), ("fixed-seed1", 1, 0)]


@pytest.mark.parametrize(("field", "message"), [
    ("seeds=auto:1..3", "q.txt:2:8: seeds=auto's MIN must be an integer from 2 to 64, got \"1\""),
    ("seeds=auto:5..3", 'q.txt:2:8: seeds=auto:MIN..MAX needs MIN <= MAX, got "auto:5..3"'),
    ("seeds=auto:3..65", "q.txt:2:8: seeds=auto's MAX must be an integer from 2 to 64, got \"65\""),
    ("seeds=auto:3", 'q.txt:2:8: seeds=auto takes its bounds as auto:MIN..MAX'),
    ("seeds=auto:03..5", "q.txt:2:8: seeds=auto's MIN must not have leading zeros"),
    ("seeds=autox", 'q.txt:2:8: seeds=auto takes its bounds as auto:MIN..MAX'),
    ("seeds=auto:3..5 seed=1", "q.txt:2: seed= and seeds= cannot both be set"),
])
def test_bad_bounds_are_one_line_at_the_field(field: str, message: str) -> None:
    assert _error(f"name=baseline seeds=3 -- a\nname=x {field} -- b\n").startswith(message)


def test_seeds_auto_needs_a_baseline_cell() -> None:
    assert _error("name=base seeds=3 -- a\nname=x seeds=auto -- b\n") == (
        "q.txt:2: seeds=auto compares each cell with the baseline, and no cell is named baseline; "
        "add a line with name=baseline")


def test_the_queue_bounds_are_the_rules_own() -> None:
    fields = AutoSeeds.model_fields
    assert (fields["min_seeds"].default, fields["max_seeds"].default) == queueline.AUTO_DEFAULT
    AutoSeeds(min_seeds=queueline.AUTO_BOUNDS[0], max_seeds=queueline.AUTO_BOUNDS[1])
    with pytest.raises(ValueError):
        AutoSeeds(min_seeds=queueline.AUTO_BOUNDS[0] - 1)
    with pytest.raises(ValueError):
        AutoSeeds(max_seeds=queueline.AUTO_BOUNDS[1] + 1)


ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_LOCAL_PYTHON": "/usr/bin/python3"}


def _project(tmp_path: Path, queue: str, toml: str = "") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\n' + toml)
    path = tmp_path / "queue.txt"
    path.write_text(queue)
    return path


def test_the_dry_run_says_what_seeds_auto_will_do(gpuq_home: Path, tmp_path: Path) -> None:
    queue = _project(tmp_path, "name=baseline seeds=auto:3..6 --\nname=wide seeds=auto -- --wide\nname=x seeds=2 --\n",
                     '[stop]\nrule = "baseline"\nalpha = 0.1\nmargin = 0.02\n')
    done = run_gpuq("submit", "--dry-run", "--budget", "40", str(queue), env=ENV)
    assert done.returncode == 0, done.stderr
    (said,) = [line for line in done.stdout.splitlines() if line.startswith("seeds=auto: ")]
    assert said.startswith("seeds=auto: baseline 3..6, wide 3..8 seeds; once every job has ended")
    assert "Holm-adjusted Welch p <= 0.1, or its 90% interval within +-0.02" in said
    assert said.endswith("it has its most seeds, or the sweep's budget of $40.00 is spent")
    done = run_gpuq("submit", "--dry-run", str(_project(tmp_path, "name=baseline seeds=3 --\n")), env=ENV)
    assert done.returncode == 0 and not any(line.startswith("seeds=auto") for line in done.stdout.splitlines())


def test_seeds_auto_without_a_baseline_exits_2_with_nothing_written(gpuq_home: Path, tmp_path: Path) -> None:
    done = run_gpuq("submit", str(_project(tmp_path, "name=base seeds=3 --\nname=x seeds=auto:2..4 --\n")), env=ENV)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "queue.txt:2: seeds=auto compares each cell with the baseline" in done.stderr
    db = gpuq_home / "ledger.db"
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM sweep").fetchone()[0] == 0
