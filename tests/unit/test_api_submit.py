"""api.submit decisions that need no host: validation order, warnings, dry runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.core.states import AttemptState, JobState


@pytest.fixture
def ctx(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> api.Context:
    monkeypatch.setenv("GPUQ_LOCAL_CPU_SLOTS", "4")  # placement must not depend on this machine's cores
    return api.open_context()


def _queue(tmp_path: Path, text: str) -> Path:
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "a.yaml").write_text("seed: 1\n")
    queue = tmp_path / "queue.txt"
    queue.write_text(text)
    return queue


def test_resubmitting_a_succeeded_cell_warns(ctx: api.Context, tmp_path: Path) -> None:
    queue = _queue(tmp_path, "configs/a.yaml classify 3\nconfigs/a.yaml classify 4 name=other\n")
    from orchestrator.queue.queuefile import parse_queue

    parsed = parse_queue(queue)
    rows = ctx.ledger.add_sweep(sweep_id="qold000", queue_path=str(queue), workdir=str(tmp_path), queue_text="",
                                jobs=parsed.jobs, default_retries=1)
    done = rows[0]
    ctx.ledger.start_attempt(done.id, host="local", bundle_sha="s")
    ctx.ledger.transition(done.id, AttemptState.EXITED, attempt=1)
    ctx.ledger.transition(done.id, JobState.SUCCEEDED)
    result = api.submit(ctx, queue, dry_run=True)
    twins = [w for w in result.warnings if "already succeeded" in w]
    # a dry run (and --smoke, which plans with one) submits nothing: it never says "it will run again"
    assert twins == [f"{queue}:1: job 'a' is identical to {done.id} of sweep qold000, which already succeeded; "
                     "a submit would run it again (--rerun or rerun=true, its code or [run]/[data] changed, or its "
                     "results are not pulled verified)"]
    assert result.dry_run and ctx.ledger.sweep_ids() == {"qold000"}


def test_dry_run_plans_every_job_and_writes_nothing(ctx: api.Context, tmp_path: Path) -> None:
    queue = _queue(tmp_path, "configs/a.yaml classify\nconfigs/a.yaml classify name=b gpus=2\n")
    result = api.submit(ctx, queue, dry_run=True)
    assert set(result.placements.values()) == {"local"} and len(result.placements) == 2
    assert ctx.ledger.sweeps() == []


def test_a_project_root_outside_the_repository_is_refused_and_another_one_is_named(ctx: api.Context,
                                                                                   tmp_path: Path) -> None:
    from orchestrator.core.errors import ConfigError

    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "train.py").write_text("print(1)\n")
    (tmp_path / "private.txt").write_text("another project\n")
    exp = repo / "exp"
    exp.mkdir()
    queue = exp / "queue.txt"
    queue.write_text("name=a -- x\n")
    (exp / "gpuq.toml").write_text('[run]\nproject = "../.."\ncommand = "src/train.py {args}"\n')
    with pytest.raises(ConfigError) as info:
        api.submit(ctx, queue, dry_run=True)
    assert f"{exp}/gpuq.toml: [run] project: '../..' is {tmp_path.resolve()}, outside the repository" in str(info.value)
    (exp / "gpuq.toml").write_text('[run]\nproject = ".."\ncommand = "src/train.py {args}"\n')
    result = api.submit(ctx, queue, dry_run=True)
    assert (f"bundling the project root {repo.resolve()} ([run] project in {exp}/gpuq.toml), not the queue's "
            f"directory {exp.resolve()}") in result.warnings
    (exp / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\n')
    (exp / "train.py").write_text("print(1)\n")
    assert not [w for w in api.submit(ctx, queue, dry_run=True).warnings if "bundling" in w]


def test_gpu_2_for_gpus_2_is_named_with_a_did_you_mean(ctx: api.Context, tmp_path: Path) -> None:
    from orchestrator.core.errors import UsageError

    queue = _queue(tmp_path, "configs/a.yaml classify 2 gpu=2\n")
    with pytest.raises(UsageError) as err:
        api.submit(ctx, queue, dry_run=True)
    (line, last) = str(err.value).splitlines()
    assert line.startswith(f"{queue}:1: job 'a' cannot be placed: ")
    assert last == f"1 error in {queue}; nothing was submitted"
    assert line.endswith("; did you mean gpus=2? (gpu= names a GPU model, e.g. gpu=A100; gpus= is how many)"), line
    assert ctx.ledger.sweeps() == []


def test_placement_errors_come_in_the_same_pass_as_syntax_errors(gpuq_home: Path, tmp_path: Path) -> None:
    """Issue 39 item 13: ``gpu=2`` on one line and a typo on another are both reported at once, one line
    each, exit 2, nothing written (before, the placement error came only once every typo was fixed)."""
    from tests.conftest import run_gpuq

    queue = _queue(tmp_path, "configs/a.yaml classify 2 gpu=2\nconfigs/a.yaml classify 2O name=b\n"
                             "configs/a.yaml classify 2 name=c\n")
    done = run_gpuq("submit", str(queue), env={"GPUQ_HOME": str(gpuq_home), "GPUQ_LOCAL_CPU_SLOTS": "4"})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"{queue}:1: job 'a' cannot be placed: ") and "did you mean gpus=2?" in lines[0]
    assert lines[1] == f'{queue}:2:25: epochs must be a positive integer, got "2O"'
    assert lines[2:] == [f"2 errors in {queue}; nothing was submitted"], lines
    assert "Traceback" not in done.stderr and not (gpuq_home / "local").exists()
