"""`gpuq down --sweep`: which rented hosts it terminates (docs/providers.md), on a real ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.cloud import down_plan
from orchestrator.core.states import AttemptState, HoldKind, JobState
from orchestrator.ledger.tables import HostRow
from orchestrator.queue.queuefile import parse_queue
from tests.support.rented import add_rented

QUEUE = "configs/a.yaml classify 1 name=one\nconfigs/a.yaml classify 1 name=two\n"


@pytest.fixture
def ctx(gpuq_home: Path) -> api.Context:
    return api.open_context()


def _rented(ctx: api.Context, name: str, *, replaces: str = "", lease: str = "running",
            hold: HoldKind = HoldKind.NONE) -> None:
    add_rented(ctx.ledger, HostRow(name=name, kind="ssh", target=f"root@{name}", root="/srv/gpuq", provider="lambda",
                                   instance_id=f"i-{name}", lease_state=lease, hold_kind=hold.value,
                                   replaces=replaces))


def _sweep(ctx: api.Context, tmp_path: Path, sweep_id: str) -> dict[str, str]:
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "a.yaml").write_text("seed: 1\n")
    queue = tmp_path / f"{sweep_id}.txt"
    queue.write_text(QUEUE)
    rows = ctx.ledger.add_sweep(sweep_id=sweep_id, queue_path=str(queue), workdir=str(tmp_path), queue_text=QUEUE,
                                jobs=parse_queue(queue).jobs, default_retries=0, bundle_sha="b" * 64)
    return {job.name: job.id for job in rows}


def _finish(ctx: api.Context, job_id: str, host: str, attempt: int) -> None:
    ctx.ledger.start_attempt(job_id, host=host, bundle_sha="s")
    ctx.ledger.transition(job_id, AttemptState.EXITED, attempt=attempt)
    ctx.ledger.transition(job_id, JobState.SUCCEEDED)


def test_down_sweep_covers_the_lost_host_and_an_unused_replacement(ctx: api.Context, tmp_path: Path) -> None:
    """`gpuq resume` rented `lam-c` for the lost `lam-a`, but the job resumed on `lam-b`, which had
    become free: the replacement never ran a job of the sweep and still bills."""
    _rented(ctx, "lam-a", lease="failed", hold=HoldKind.REPLACED)
    _rented(ctx, "lam-b")
    _rented(ctx, "lam-c", replaces="lam-a")
    _rented(ctx, "lam-d", replaces="lam-c")  # the replacement's own replacement
    _rented(ctx, "lam-x")  # another sweep's host
    _rented(ctx, "lam-y", replaces="lam-x")  # and its replacement
    jobs = _sweep(ctx, tmp_path, "s1")
    ctx.ledger.start_attempt(jobs["one"], host="lam-a", bundle_sha="s")
    ctx.ledger.transition(jobs["one"], AttemptState.LOST, attempt=1)
    ctx.ledger.transition(jobs["one"], JobState.LOST)
    ctx.ledger.transition(jobs["one"], JobState.QUEUED)
    _finish(ctx, jobs["one"], "lam-b", 2)
    _finish(ctx, jobs["two"], "lam-b", 1)

    plan = down_plan(ctx, sweep="s1", force=True)
    assert sorted(r.name for r in plan.hosts) == ["lam-a", "lam-b", "lam-c", "lam-d"]
    assert plan.refused == {}


def test_down_sweep_without_replacements_is_the_hosts_the_sweep_used(ctx: api.Context, tmp_path: Path) -> None:
    _rented(ctx, "lam-a")
    _rented(ctx, "lam-b")
    jobs = _sweep(ctx, tmp_path, "s1")
    _finish(ctx, jobs["one"], "lam-a", 1)
    plan = down_plan(ctx, sweep="s1")
    assert [r.name for r in plan.hosts] == []  # its result is not pulled and verified: the gate refuses
    assert plan.refused == {"lam-a": "1 job(s) with results not pulled and verified (one); `gpuq pull` first, or "
                                     "--force to lose them"}
    assert [r.name for r in down_plan(ctx, sweep="s1", force=True).hosts] == ["lam-a"]
