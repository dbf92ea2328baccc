"""Placeholders in a queue line's own arguments (`-- --seed_everything {seed}`): parsed by the controller
(orchestrator/queue/queuegrid.py), rendered on the host by the same code the dry run uses (gpuq_argv.render_args),
unknown ones a submit error at their column (docs/queue.md, issue 29 item 6)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator.core.agent_modules import argv_module
from orchestrator.core.errors import QueueIssue, QueueParseError
from orchestrator.core.specs import JobSpec
from orchestrator.queue.queuefile import parse_bytes
from orchestrator.queue.queuegrid import LINE_PLACEHOLDERS
from tests.conftest import run_gpuq

pytestmark = pytest.mark.honest  # no silent wrong answer (docs/testing.md)


def jobs(text: str) -> list[JobSpec]:
    return list(parse_bytes(text.encode(), label="q.txt", workdir=None, needs_config=False).jobs)


def issues(text: str) -> list[QueueIssue]:
    with pytest.raises(QueueParseError) as info:
        jobs(text)
    return info.value.issues


def rendered(job: JobSpec, **values: str) -> list[str]:
    base = {"seed": "" if job.seed is None else str(job.seed), "name": job.name, "run_dir": "/r/run"}
    result: list[str] = argv_module().render_args(list(job.args), {**base, **values})
    return result


def test_the_lists_of_line_placeholders_agree_on_both_sides() -> None:
    module = argv_module()
    assert LINE_PLACEHOLDERS == module.LINE_PLACEHOLDERS
    assert set(LINE_PLACEHOLDERS) == set(module.PLACEHOLDERS) - {"checkpoint", "args"}


def test_seed_in_a_lines_arguments_is_each_jobs_seed() -> None:
    got = jobs("a.yaml t seeds=2 -- --seed_everything {seed} --out={run_dir}/x --tag {name}\n")
    assert [rendered(j) for j in got] == [
        ["--seed_everything", str(j.seed), "--out=/r/run/x", "--tag", j.name] for j in got]
    assert [j.seed for j in got] == [0, 1]
    assert got[0].args == got[1].args  # the seeds of a cell share their arguments: one cell in the report


def test_quoted_or_escaped_placeholders_and_other_braces_stay_literal() -> None:
    line = ("a.yaml t seed=3 -- '{seed}' \\{seed} \"{{seed}}\" '{epoch}-{step}' ${seed} "
            "'{\"a\": {\"b\": 1}}' {1} x{seed}} \\{{seed}x\n")
    (job,) = jobs(line)
    assert rendered(job) == ["{seed}", "{seed}", "{{seed}}", "{epoch}-{step}", "${seed}", '{"a": {"b": 1}}', "{1}",
                             "x3}", "{3x"]


@pytest.mark.parametrize(("line", "column", "message"), [
    ("a.yaml t -- --x {epoch}\n", 17, "unknown placeholder {epoch} (known here: "
     + ", ".join(f"{{{p}}}" for p in LINE_PLACEHOLDERS) + "); quote it ('{epoch}') to pass it literally"),
    ("a.yaml t -- --ckpt_path={checkpoint}\n", 25, "{checkpoint} is not available in a line's arguments "
     "(it is empty on a first attempt; put it in [run] resume_args)"),
    ("a.yaml t -- a {args}\n", 15, "{args} is not available in a line's arguments (it stands for these "
     "arguments; it belongs in [run] command)"),
    ("a.yaml t 3 -- --seed_everything {seed}\n", 33, "{seed} needs seed= or seeds= on the line"),
    ("name=x -- --c {config}\n", 15, "{config} needs a config path and task at the start of the line"),
    ("a.yaml t seed=1 -- \\{{seed}\\}\n", 22, "{seed} between literal braces is ambiguous; quote the whole "
     "argument to pass it literally, or drop the braces"),
])
def test_a_placeholder_that_cannot_work_is_an_error_at_its_column(line: str, column: int, message: str) -> None:
    assert issues(line) == [QueueIssue(1, column, message)]


def test_the_dry_run_shows_the_seed_and_a_bad_placeholder_exits_2(gpuq_home: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\n')
    queue = tmp_path / "queue.txt"
    queue.write_text("name=m seeds=2 -- fit --seed_everything {seed} --model.lr={0.01,0.1}\n")
    env = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_LOCAL_PYTHON": "/usr/bin/python3"}
    done = run_gpuq("submit", "--dry-run", "--json", str(queue), env=env)
    assert done.returncode == 0, done.stderr
    argv = {j["name"]: j["argv"] for j in json.loads(done.stdout)["jobs"]}
    assert argv["m-lr0.1-seed1"][-3:] == ["--seed_everything", "1", "--model.lr=0.1"]
    assert argv["m-lr0.01-seed0"][-3:] == ["--seed_everything", "0", "--model.lr=0.01"]
    assert "{seed}" not in done.stdout

    queue.write_text("name=m seeds=2 -- fit --seed_everything {seed}\nname=n -- --x {sed}\n")
    done = run_gpuq("submit", str(queue), env=env)
    assert done.returncode == 2
    assert done.stderr.startswith(f"{queue}:2:15: unknown placeholder {{sed}}")
    ledger = gpuq_home / "ledger.db"
    assert not ledger.exists() or sqlite3.connect(ledger).execute("SELECT COUNT(*) FROM sweep").fetchone()[0] == 0
