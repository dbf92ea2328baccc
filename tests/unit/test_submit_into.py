"""``submit --into``: which lines join a sweep (api/joinplan.py), the part recorded in one transaction
(ledger/sweep_parts.py), and the refusals that leave the ledger as it was (api/joining.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api import joinplan, resultcache
from orchestrator.core.errors import UsageError
from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Job, Ledger
from orchestrator.queue.queuefile import parse_queue

TOML = 'entry = "train.py"\nlauncher = "python"\nverify = []\n'
QUEUE = "configs/a.yaml cls 2 name=baseline seeds=2\nconfigs/b.yaml cls 2 name=wide seeds=2\n"


@pytest.fixture
def ctx(gpuq_home: Path, project: Path, monkeypatch: pytest.MonkeyPatch) -> api.Context:
    monkeypatch.setenv("GPUQ_LOCAL_CPU_SLOTS", "4")  # placement must not depend on this machine's cores
    return api.open_context(project_dir=project)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "configs").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (root / "configs" / f"{name}.yaml").write_text(f"{name}: 1\n")
    (root / "train.py").write_text("print('stub')\n")
    (root / "gpuq.toml").write_text(TOML)
    (root / "queue.txt").write_text(QUEUE)
    return root


def _specs(root: Path, text: str) -> list[JobSpec]:
    (root / "queue.txt").write_text(text)
    return list(parse_queue(root / "queue.txt").jobs)


def _sweep(ctx: api.Context, root: Path, sweep_id: str = "qold000") -> list[Job]:
    """The project's queue recorded as sweep ``sweep_id``, with the content keys submit gives its jobs."""
    planned = api.submit(ctx, root / "queue.txt", dry_run=True)
    keys = resultcache.content_keys(planned.specs, planned.bundle.digests, planned.run_json, "queue.txt")
    return ctx.ledger.add_sweep(sweep_id=sweep_id, queue_path=str(root / "queue.txt"), workdir=str(root),
                                queue_text=QUEUE, jobs=planned.specs, default_retries=1, keys=keys,
                                entry="train.py", launcher="python", verify=(), bundle_sha=planned.bundle.sha256)


def test_identical_lines_are_not_new_more_seeds_join_and_a_changed_line_is_a_new_cell(project: Path) -> None:
    ledger = Ledger(project / "l.db")
    old = ledger.add_sweep(sweep_id="s1", queue_path="queue.txt", workdir=str(project), queue_text="",
                           jobs=_specs(project, QUEUE), default_retries=1)
    grown = _specs(project, "configs/a.yaml cls 2 name=baseline seeds=3\n"  # one more seed of the baseline
                            "configs/b.yaml cls 4 name=wide seeds=2\n"  # changed: epochs 2 -> 4
                            "configs/c.yaml cls 2 name=deep\n")  # new
    plan = joinplan.classify("q.txt", grown, old, "s1", 2)
    assert plan.errors == []
    assert [(s.name, s.cell) for s in plan.new] == [("baseline-seed2", "baseline"), ("wide.p2-seed0", "wide.p2"),
                                                   ("wide.p2-seed1", "wide.p2"), ("deep", "deep")]
    assert plan.already == 2
    assert plan.notes == ["q.txt:1: baseline: 2 jobs already in sweep s1 (part 1); 1 more join",
                          "q.txt:2: wide differs from sweep s1's (epochs 4 (was 2)): joins as a new cell, wide.p2"]
    same = joinplan.classify("q.txt", _specs(project, QUEUE), old, "s1", 2)
    assert same.new == [] and same.already == 4 and len(same.notes) == 2 and same.notes[1].endswith(": not new")
    # the grown queue joined; submitted again with one more seed of the changed line, that cell grows: no wide.p3
    _, added = ledger.join_sweep(sweep_id="s1", queue_path="q.txt", queue_text="", bundle_sha="", jobs=plan.new,
                                 default_retries=1, keys={}, reuse={})
    regrown = _specs(project, "configs/a.yaml cls 2 name=baseline seeds=3\nconfigs/b.yaml cls 4 name=wide seeds=3\n")
    again = joinplan.classify("q.txt", regrown, old + added, "s1", 3)
    assert [s.name for s in again.new] == ["wide.p2-seed2"] and again.errors == []
    assert again.notes[1] == "q.txt:2: wide (as wide.p2): 2 jobs already in sweep s1 (part 2); 1 more join"


def test_a_changed_baseline_or_a_changed_config_byte_is_seen(project: Path) -> None:
    ledger = Ledger(project / "l.db")
    old = ledger.add_sweep(sweep_id="s1", queue_path="queue.txt", workdir=str(project), queue_text="",
                           jobs=_specs(project, QUEUE), default_retries=1)
    plan = joinplan.classify("q.txt", _specs(project, QUEUE.replace("cls 2 name=baseline", "cls 3 name=baseline")),
                             old, "s1", 2)
    assert plan.errors == ["q.txt:1: the baseline differs from sweep s1's (epochs 3 (was 2)); a grown sweep keeps its "
                           "baseline: restore the line, or submit without --into for a new sweep"]
    (project / "configs" / "b.yaml").write_text("b: 2\n")
    plan = joinplan.classify("q.txt", _specs(project, QUEUE), old, "s1", 3)
    assert [s.name for s in plan.new] == ["wide.p3-seed0", "wide.p3-seed1"] and "config bytes" in plan.notes[1]


def test_a_join_records_its_part_and_leaves_out_names_the_sweep_has(project: Path) -> None:
    ledger = Ledger(project / "l.db")
    ledger.add_sweep(sweep_id="s1", queue_path="queue.txt", workdir=str(project), queue_text="", bundle_sha="b1",
                     jobs=_specs(project, QUEUE), default_retries=1)
    specs = _specs(project, "configs/a.yaml cls 2 name=baseline seeds=3\nconfigs/c.yaml cls 2 name=deep\n")
    part, rows = ledger.join_sweep(sweep_id="s1", queue_path="q2.txt", queue_text="x", bundle_sha="b2", jobs=specs,
                                   default_retries=1, keys={}, reuse={})
    assert part is not None and part.number == 2 and part.job_count == 2
    assert [(r.name, r.part) for r in rows] == [("baseline-seed2", 2), ("deep", 2)]  # seed0, seed1: already there
    again, none = ledger.join_sweep(sweep_id="s1", queue_path="q2.txt", queue_text="x", bundle_sha="b3", jobs=specs,
                                    default_retries=1, keys={}, reuse={})
    assert (again, none) == (None, [])  # a racing join of the same lines adds nothing, records no part
    assert [(p.number, p.job_count, p.bundle_sha) for p in ledger.parts_of("s1")] == [(1, 4, "b1"), (2, 2, "b2")]
    assert ledger.part_bundles("s1") == {1: "b1", 2: "b2"}
    sweep = ledger.sweep("s1")
    assert sweep is not None and sweep.job_count == 6
    assert ledger.parts_of("s1")[1].joined.startswith("joined: part 2, ")


def test_the_migration_makes_every_sweep_its_part_one(tmp_path: Path) -> None:
    from orchestrator.ledger import migrate

    path = tmp_path / "old.db"
    conn = sqlite3.connect(str(path), isolation_level=None)
    for number, step in enumerate(migrate.MIGRATIONS[:20], start=1):  # a ledger of gpuq before parts (v20)
        step(conn)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.execute("INSERT INTO sweep (id, queue_path, workdir, queue_text, bundle_sha, job_count, created_at) "
                 "VALUES ('s0', 'q.txt', '/w', 'text', 'sha', 3, 12.5)")
    conn.close()
    ledger = Ledger(path)
    assert [(p.sweep_id, p.number, p.queue_path, p.queue_text, p.bundle_sha, p.job_count, p.created_at)
            for p in ledger.sweep_parts()] == [("s0", 1, "q.txt", "text", "sha", 3, 12.5)]


def _ledger_rows(ctx: api.Context) -> tuple[int, int, list[tuple[str, int]]]:
    return len(ctx.ledger.jobs()), len(ctx.ledger.sweep_parts()), [(s.id, s.job_count) for s in ctx.ledger.sweeps()]


def test_a_dry_run_into_plans_only_the_new_jobs_and_writes_nothing(ctx: api.Context, project: Path) -> None:
    _sweep(ctx, project)
    before = _ledger_rows(ctx)
    (project / "queue.txt").write_text(QUEUE + "configs/c.yaml cls 2 name=deep seeds=2\n")
    result = api.submit_into(ctx, project / "queue.txt", "qold", dry_run=True)
    assert [s.name for s in result.specs] == ["deep-seed0", "deep-seed1"] and result.part == 2
    assert sorted(result.placements) == sorted(j for j in result.placements if j.startswith("c"))
    assert len(result.placements) == 2 and result.sweep_id == "qold000"
    assert len(result.joined) == 2 and all("already in sweep qold000 (part 1): not new" in n for n in result.joined)
    assert _ledger_rows(ctx) == before
    # a config written since, in a queue file of its own: the baseline's code is the same
    (project / "configs" / "d.yaml").write_text("d: 1\n")
    (project / "more.txt").write_text("configs/a.yaml cls 2 name=baseline seeds=2\nconfigs/d.yaml cls 2 name=deeper\n")
    more = api.submit_into(ctx, project / "more.txt", "qold000", dry_run=True)
    assert [s.name for s in more.specs] == ["deeper"] and _ledger_rows(ctx) == before


def test_the_cli_dry_run_into_says_what_the_sweep_has_and_what_would_join(
        ctx: api.Context, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.main import main

    _sweep(ctx, project)
    (project / "queue.txt").write_text(QUEUE + "configs/c.yaml cls 2 name=deep\n")
    main(["submit", str(project / "queue.txt"), "--into", "qold", "--dry-run"])
    out = capsys.readouterr().out
    assert f"{project / 'queue.txt'}:2: wide: 2 jobs already in sweep qold000 (part 1): not new" in out
    assert "dry run: 1 jobs valid would join sweep qold000;" in out and "\ndeep " in out
    assert len(ctx.ledger.jobs()) == 4


@pytest.mark.parametrize("change, said", [
    ("code", "code (a project file other than the queues and their configs changed)"),
    ("run", "entry, launcher or verify setting"),
    ("baseline", "the baseline differs from sweep qold000's"),
])
def test_a_queue_whose_baseline_differs_is_one_line_and_the_ledger_is_unchanged(
        ctx: api.Context, project: Path, change: str, said: str) -> None:
    _sweep(ctx, project)
    before = _ledger_rows(ctx)
    text = QUEUE + "configs/c.yaml cls 2 name=deep\n"
    if change == "code":
        (project / "train.py").write_text("print('changed')\n")
    elif change == "run":
        (project / "gpuq.toml").write_text(TOML.replace('"python"', '"torchrun"'))
        ctx = api.open_context(project_dir=project)
    else:
        text = text.replace("configs/a.yaml", "configs/c.yaml")
    (project / "queue.txt").write_text(text)
    with pytest.raises(UsageError) as info:
        api.submit_into(ctx, project / "queue.txt", "qold000")
    assert said in str(info.value) and str(info.value).endswith("nothing was submitted")
    assert _ledger_rows(ctx) == before


def test_an_unknown_or_ambiguous_sweep_and_budget_or_stop_flags_are_refused(ctx: api.Context, project: Path) -> None:
    _sweep(ctx, project, "qa10000")
    _sweep(ctx, project, "qa20000")
    before = _ledger_rows(ctx)
    for ref, said in (("zz", "--into zz: no sweep matches 'zz'"),
                      ("qa", "--into qa: sweep prefix 'qa' is ambiguous: qa10000, qa20000")):
        with pytest.raises(UsageError, match=said):
            api.submit_into(ctx, project / "queue.txt", ref)
    with pytest.raises(UsageError, match="leave out --budget"):
        api.submit_into(ctx, project / "queue.txt", "qa1", budget_usd=3.0)
    assert _ledger_rows(ctx) == before


def test_the_cli_refuses_an_unknown_sweep_in_one_line_with_exit_2(ctx: api.Context, project: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["submit", str(project / "queue.txt"), "--into", "nosuch"])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.splitlines() == ["gpuq: --into nosuch: no sweep matches 'nosuch'; `gpuq status` lists the sweeps; "
                                "nothing was submitted"]
    assert ctx.ledger.sweeps() == []


def test_the_tick_dispatches_each_parts_queued_jobs_with_its_bundle(project: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.scheduling.estimates import epoch_rates
    from orchestrator.tick import dispatch

    ledger = Ledger(project / "l.db")
    ledger.add_sweep(sweep_id="s1", queue_path="queue.txt", workdir=str(project), queue_text="", bundle_sha="b1",
                     jobs=_specs(project, QUEUE), default_retries=1)
    ledger.join_sweep(sweep_id="s1", queue_path="q2.txt", queue_text="", bundle_sha="b2", default_retries=1,
                      jobs=_specs(project, "configs/c.yaml cls 2 name=deep\n"), keys={}, reuse={})
    seen: list[tuple[str, str, list[str]]] = []
    monkeypatch.setattr(dispatch, "_dispatch_part",
                        lambda _ctx, _rates, sweep, sha, jobs, *_: seen.append((sweep.id, sha, sorted(
                            j.name for j in jobs.values()))))

    class Ctx:  # what dispatch_queued reads before a part's dispatch: the ledger and the monthly cap
        settings = type("S", (), {"budget_usd_month": None})()

    Ctx.ledger = ledger  # type: ignore[attr-defined]
    dispatch.dispatch_queued(Ctx(), epoch_rates([]), ledger.jobs())  # type: ignore[arg-type]
    assert seen == [("s1", "b1", ["baseline-seed0", "baseline-seed1", "wide-seed0", "wide-seed1"]),
                    ("s1", "b2", ["deep"])]
