"""Early stopping against the baseline on a real OpenSSH host (tests/support/testhosts/ farm), driven
through the api (docs/stopping.md).

Stub trainers of known curves (stdlib Python, no torch): ``val_loss(t) = 2 + 1.5 exp(-t / 0.3) + effect
+ 0.01 seed`` at the fraction ``t`` of the run, one metrics row a step.  The baseline and a slightly
better cell run to their end; a clearly worse cell (effect +1) is stopped at its rung (0.2 of the run)
and ends STOPPED, and the job queued behind the six seeds takes the freed slot while the others still
run.  gpuq "dies" between recording the look and stopping the jobs (the stop stage's host call raises
out of the tick, as a kill -9 there would leave it): the next tick carries the recorded stop out once,
records no second look, and the report shows the cell as stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api import explaining, stopreport
from orchestrator.api.report import build_report
from orchestrator.core.states import JobState
from orchestrator.report.cells import group
from orchestrator.tick import stopping
from tests.conftest import kill_recorded_groups, wait_for
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

STEPS, STEP_S = 50, 0.2  # 10 s a run; the rung (0.2) at step 10, about 2 s in

STUB = '''\
import json, math, os, sys, time
effect = float(sys.argv[1])
steps, step_s = int(sys.argv[2]), float(sys.argv[3])
seed = int(os.environ.get("GPUQ_SEED") or 0)
for step in range(1, steps + 1):
    t = step / steps
    loss = 2 + 1.5 * math.exp(-t / 0.3) + effect + 0.01 * seed
    with open("metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "val_loss": loss}) + "\\n")
    tmp = os.environ["GPUQ_HEARTBEAT"] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"time": time.time(), "step": step, "total_steps": steps, "loss": loss}, fh)
    os.replace(tmp, os.environ["GPUQ_HEARTBEAT"])
    time.sleep(step_s)
'''
TOML = '''\
[run]
command = "stub.py {args}"
launcher = "python"
metrics = "metrics.jsonl"
metric = "val_loss"
mode = "min"

[stop]
rule = "baseline"
rungs = [0.2]
min_seeds = 2
direction = "min"
'''


class Crash(BaseException):
    """What a kill -9 of gpuq at this point leaves: nothing after it runs (not an Exception: no handler)."""


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=1, gpus=6)


@pytest.fixture
def setup(farm: HostFarm, gpuq_home: Path, request: pytest.FixtureRequest) -> Iterator[tuple[api.Context, Path]]:
    """A context with the farm's host s0 (six GPUs) under a root of this test's own (returned with it)."""
    rel = f"gpuq-{request.node.name[:40]}"
    context = api.open_context(overrides={"heartbeat_s": 1})
    api.hosts_add(context, "s0", f"root@{farm.hosts[0].address}", key=str(farm.client_key), profile="rehearsal",
                  root=f"/root/{rel}", trust_new_host_key=True)
    yield context, farm.hosts[0].root_dir / "root" / rel
    kill_recorded_groups(farm.hosts[0].root_dir / "root" / rel)
    context.close()


def _project(base: Path, name: str, toml: str, lines: list[str]) -> Path:
    work = base / name
    work.mkdir()
    (work / "stub.py").write_text(STUB)
    (work / "gpuq.toml").write_text(toml)
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def test_the_worse_cell_is_stopped_once_at_its_rung_and_its_slot_taken(
        setup: tuple[api.Context, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, root = setup
    run = f"{STEPS} {STEP_S}"
    result = api.submit(ctx, _project(tmp_path, "ablation", TOML, [
        f"name=baseline seeds=2 -- 0 {run}", f"name=good seeds=2 -- -0.05 {run}", f"name=worse seeds=2 -- 1.0 {run}"]))
    # a job submitted behind the six seeds, which fill the host's six GPUs: it waits for a free slot
    later = api.submit(ctx, _project(tmp_path, "later", TOML.split("[stop]")[0], ["name=after -- 0 4 0.2"]))
    cells = group(ctx.ledger.jobs(sweep_id=result.sweep_id))
    worse = {j.id for j in cells["worse"]}
    real_stop = stopping._stop_on_host

    def crash(*_args: object) -> None:
        raise Crash

    monkeypatch.setattr(stopping, "_stop_on_host", crash)
    crashed = False

    def looked() -> bool:
        nonlocal crashed
        try:
            api.status(ctx, sweep=result.sweep_id)
        except Crash:
            crashed = True
        return crashed

    assert wait_for(looked, timeout=30, interval=0.3), "no stop was decided"
    # gpuq died after the record, before the kill: the look is there, every worse seed still runs
    looks = ctx.ledger.stop_looks([result.sweep_id])
    assert [(lk.cell, lk.rung, lk.stop) for lk in looks if lk.stop] == [("worse", 0, True)]
    stop = next(lk for lk in looks if lk.stop)
    assert stop.step == 10 and stop.n_cell == stop.n_baseline == 2 and stop.p_value is not None
    assert stop.p_value <= stop.threshold and stop.cell_mean > stop.baseline_mean + 0.9
    assert {ctx.ledger.job(j).state for j in worse} == {JobState.RUNNING.value}
    monkeypatch.setattr(stopping, "_stop_on_host", real_stop)
    snap = api.wait(ctx, sweep=result.sweep_id, interval_s=0.3, timeout_s=60)
    states = {j.name: j.state for j in snap.jobs}
    assert {n: s for n, s in states.items() if n.startswith("worse")} == {
        "worse-seed0": "STOPPED", "worse-seed1": "STOPPED"}, states
    assert all(s == "SUCCEEDED" for n, s in states.items() if not n.startswith("worse")), states
    # exactly once: one look per (cell, rung), one STOPPED event per stopped job, its attempt KILLED
    after = ctx.ledger.stop_looks([result.sweep_id])
    assert len(after) == len({(lk.cell, lk.rung) for lk in after}) == len(looks)
    for job_id in worse:
        said = [e for e in ctx.ledger.events(subject=job_id) if e.new == "STOPPED"]
        assert len(said) == 1 and "stopped: worse than baseline at step 10" in said[0].message, said
        assert [a.state for a in ctx.ledger.attempts(job_id)] == ["KILLED"]
        # the partial curve is kept: up to about the rung, never the full run
        steps = [s for s, _ in ctx.ledger.curves([job_id])[job_id]["val_loss"]]
        assert 10 <= max(steps) < STEPS
    # the freed slot went to the job queued behind the six seeds while the others still ran (the host's
    # own records: when its agent launched the job, when the other seeds' wrappers wrote their exits)
    after_job = ctx.ledger.jobs(sweep_id=later.sweep_id)[0]
    assert {j.state for j in api.wait(ctx, sweep=later.sweep_id, interval_s=0.3, timeout_s=30).jobs} == {"SUCCEEDED"}
    launched = (root / "jobs" / after_job.id / "attempts" / "1" / "launch.json").stat().st_mtime
    ends = [(root / "jobs" / j.id / "attempts" / "1" / "exit.json").stat().st_mtime
            for n in ("baseline", "good") for j in cells[n]]
    stopped_at = [(root / "jobs" / j / "attempts" / "1" / "exit.json").stat().st_mtime for j in worse]
    assert all(launched < end for end in ends), (launched, ends, stopped_at)
    explained = explaining.stopped(ctx, ctx.ledger.job(next(iter(worse))))
    assert explained.startswith("stopped: worse than baseline at step 10 (rung 1): mean "), explained
    doc = build_report(ctx, [result.sweep_id], collect=False)
    row = next(c for c in doc.cells if c.cell == "worse")
    assert row.stopped == "stopped: worse than baseline at step 10" and row.mean is None, row
    assert doc.saved is not None and doc.saved.gpu_hours > 0 and doc.saved.basis.startswith("estimate: ")
    assert any(note.startswith("early stopping saved about ") for note in doc.notes), doc.notes
    found = stopreport.result_saving(api.results(ctx, sweep=result.sweep_id))  # the line under `gpuq results`
    assert found is not None and found.gpu_hours == pytest.approx(doc.saved.gpu_hours, rel=0.2)
    # a stopped job's files are kept and pullable: its partial metrics come home verified
    pulled = {o.job_id: o for o in api.pull(ctx, sweep=result.sweep_id).outcomes}
    assert all(pulled[j].verified for j in worse), [pulled[j] for j in worse]
