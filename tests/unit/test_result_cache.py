"""The result cache (api/resultcache.py): a job identical to a verified success is recorded reused, not run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api import resultcache
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Job
from orchestrator.transfer import verify

EXAMPLE = Path(__file__).resolve().parents[2] / "payload"


@pytest.fixture
def ctx(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> api.Context:
    monkeypatch.setenv("GPUQ_LOCAL_CPU_SLOTS", "4")  # placement must not depend on this machine's cores
    return api.open_context()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the example queue's project (payload/queue.txt, its configs and trainer), one seed a line."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("TASKS", "train.py"):
        shutil.copy(EXAMPLE / name, root / name)
    # one job per line (the example queue's seeds=2 stripped): the tests name the jobs by their cells
    queue = (EXAMPLE / "queue.txt").read_text(encoding="utf-8").replace(" seeds=2", "")
    (root / "queue.txt").write_text(queue, encoding="utf-8")
    shutil.copytree(EXAMPLE / "configs", root / "configs")
    return root


def _ran(ctx: api.Context, queue: Path, tmp_path: Path, *, pulled: bool = True) -> list[Job]:
    """The queue recorded as a sweep whose every job SUCCEEDED (and, with ``pulled``, was pulled verified),
    with the content keys submit would give it now."""
    planned = api.submit(ctx, queue, dry_run=True)
    keys = resultcache.content_keys(planned.specs, planned.bundle.digests, planned.run_json, "queue.txt")
    rows = ctx.ledger.add_sweep(
        sweep_id="qold000",
        queue_path=str(queue),
        workdir=str(queue.parent),
        queue_text="",
        jobs=planned.specs,
        default_retries=1,
        keys=keys,
    )
    for row in rows:
        ctx.ledger.start_attempt(row.id, host="local", bundle_sha=planned.bundle.sha256)
        ctx.ledger.transition(row.id, AttemptState.EXITED, attempt=1)
        ctx.ledger.transition(row.id, JobState.SUCCEEDED)
        if pulled:
            local = tmp_path / "pulled" / row.id
            local.mkdir(parents=True)
            (local / verify.PULL_VERIFIED).write_text("{}")
            ctx.ledger.record_pull(row.id, attempt=1, host="local", state="verified", local_dir=str(local))
    return rows


def test_resubmitting_the_example_queue_unchanged_starts_no_job_and_records_them_reused(
    ctx: api.Context, project: Path, tmp_path: Path
) -> None:
    old = _ran(ctx, project / "queue.txt", tmp_path)
    result = api.submit(ctx, project / "queue.txt")
    assert result.placements == {} and not result.launch_error
    assert result.reused == {row.name: row.id for row in old}
    jobs = ctx.ledger.jobs(sweep_id=result.sweep_id)
    assert [(j.state, j.reused_from) for j in jobs] == [(JobState.SUCCEEDED.value, row.id) for row in old]
    assert ctx.ledger.attempts_of(j.id for j in jobs) == []  # nothing started anywhere
    rows = api.results(ctx, sweep=result.sweep_id)
    assert all(r.pulled == "verified" and r.cost is not None and r.cost.gpu_hours == 0 for r in rows)
    assert [r.local_dir for r in rows] == [str(tmp_path / "pulled" / row.id) for row in old]
    said = [w for w in result.warnings if "reused, not run" in w]
    assert len(said) == len(old) and old[0].id in said[0]


def test_a_resubmit_reuses_the_job_that_ran_not_a_reused_one(ctx: api.Context, project: Path, tmp_path: Path) -> None:
    old = _ran(ctx, project / "queue.txt", tmp_path)
    api.submit(ctx, project / "queue.txt")
    again = api.submit(ctx, project / "queue.txt", dry_run=True)
    assert again.reused == {row.name: row.id for row in old}


def test_one_changed_config_reruns_exactly_the_cells_that_use_it(
    ctx: api.Context, project: Path, tmp_path: Path
) -> None:
    old = _ran(ctx, project / "queue.txt", tmp_path)
    wide = project / "configs" / "wide.yaml"
    wide.write_bytes(wide.read_bytes() + b"\n")
    result = api.submit(ctx, project / "queue.txt", dry_run=True)
    assert set(result.reused) == {row.name for row in old} - {"wide"}
    assert sum("reused, not run" in w for w in result.warnings) == 3
    assert not any("'wide'" in w and "reused" in w for w in result.warnings)


def test_changed_code_reruns_every_cell(ctx: api.Context, project: Path, tmp_path: Path) -> None:
    _ran(ctx, project / "queue.txt", tmp_path)
    with (project / "train.py").open("a") as handle:
        handle.write("# one more line\n")
    assert api.submit(ctx, project / "queue.txt", dry_run=True).reused == {}


def test_rerun_and_a_lines_rerun_true_force_a_run(ctx: api.Context, project: Path, tmp_path: Path) -> None:
    old = _ran(ctx, project / "queue.txt", tmp_path)
    assert api.submit(ctx, project / "queue.txt", dry_run=True, rerun=True).reused == {}
    queue = project / "queue.txt"
    queue.write_text(
        queue.read_text().replace(
            "configs/wide.yaml classify 5 gpus=2", "configs/wide.yaml classify 5 gpus=2 rerun=true"
        )
    )
    assert set(api.submit(ctx, queue, dry_run=True).reused) == {row.name for row in old} - {"wide"}


def test_a_success_without_a_verified_pull_is_not_reused(ctx: api.Context, project: Path, tmp_path: Path) -> None:
    _ran(ctx, project / "queue.txt", tmp_path, pulled=False)
    result = api.submit(ctx, project / "queue.txt", dry_run=True)
    assert result.reused == {}
    assert sum("a submit would run it again" in w for w in result.warnings) == 4  # a dry run submits nothing


def test_rerun_must_be_true_or_false(ctx: api.Context, project: Path) -> None:
    from orchestrator.core.errors import QueueParseError

    queue = project / "queue.txt"
    queue.write_text("configs/wide.yaml classify 5 rerun=yes\n")
    with pytest.raises(QueueParseError, match='rerun must be true or false, got "yes"'):
        api.submit(ctx, queue, dry_run=True)


def test_the_report_of_a_reused_sweep_counts_the_twins_values_at_no_cost(
    ctx: api.Context, project: Path, tmp_path: Path
) -> None:
    from orchestrator.api.report import build_report

    old = _ran(ctx, project / "queue.txt", tmp_path)
    finals = {row.name: 0.5 + i / 10 for i, row in enumerate(old)}
    for row in old:
        ctx.ledger.record_results(row.id, 1, metrics=[("final", "val_acc", finals[row.name], 300, 3)], artifacts=[])
    result = api.submit(ctx, project / "queue.txt")
    report = build_report(ctx, [result.sweep_id], metric="val_acc", mode="max", collect=False)
    assert {c.cell: c.mean for c in report.cells} == finals
    assert report.finished == len(old) and report.gpu_hours == 0
    assert any(note.startswith(f"{len(old)} of {len(old)} jobs reuse the verified results") for note in report.notes)


def test_status_says_a_reused_job_was_not_run(ctx: api.Context, project: Path, tmp_path: Path) -> None:
    from orchestrator.views.jobs import job_views

    old = _ran(ctx, project / "queue.txt", tmp_path)
    result = api.submit(ctx, project / "queue.txt")
    views = job_views(api.status(ctx, sweep=result.sweep_id, probe=False, all_jobs=True))
    assert [v.note for v in views] == [f"reused the verified results of {row.id} (not run)" for row in old]


def test_the_cli_says_each_reused_job_and_its_dry_run_places_none_of_them(
    ctx: api.Context, project: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    old = _ran(ctx, project / "queue.txt", tmp_path)
    dry = CliRunner().invoke(cli, ["submit", str(project / "queue.txt"), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert '"host": ""' in dry.output and "reused, not run" in dry.output
    done = CliRunner().invoke(cli, ["submit", str(project / "queue.txt")])
    assert done.exit_code == 0, done.output
    assert all(f"reused {row.id} (not run)" in done.output for row in old)
    assert f"nothing to start: {len(old)} of {len(old)} jobs reused" in done.output
