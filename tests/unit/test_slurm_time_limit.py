"""A Slurm job stopped near its time limit (the wrapper's ``slurm_time_limit``) is one chunk of a
longer run: when it trained past where its attempt began, the attempt is PREEMPTED and the job goes
back to QUEUED without spending retries=; a chunk that made no progress is an ordinary stop
(orchestrator/tick/attempts.py ``apply``; the ledger is real)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import HostRow
from orchestrator.tick import attempts
from tests.support.wire import entry


@pytest.fixture
def ctx(gpuq_home: Path) -> Iterator[Context]:
    c = open_context()
    c.ledger.add_host(HostRow(name="hpc", kind="slurm", target="login", root="/scratch/gpuq"))
    try:
        yield c
    finally:
        c.close()


def _running_job(ctx: Context) -> str:
    spec = JobSpec(name="long", config="c.yaml", task="classify", config_sha256="0" * 64, line=1)
    (job,) = (r.id for r in ctx.ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w",
                                                  queue_text="...", jobs=[spec], default_retries=0))
    ctx.ledger.start_attempt(job, host="hpc", bundle_sha="s")
    ctx.ledger.transition(job, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job, JobState.RUNNING)
    return job


def _seen(last_step: int | None, **exit_fields: Any) -> dict[str, Any]:
    ex = {"wrapper_code": 143, "trainer_code": 143, "wrapper_signal": 15, "last_step": last_step,
          "slurm_time_limit": True, "message": "Slurm time limit near (SIGUSR1): checkpointed and stopped"}
    ex.update(exit_fields)
    return {"state": "exited", "exit": ex, "heartbeat": None}


def test_a_chunk_that_trained_is_preempted_and_queued_again_without_spending_retries(ctx: Context) -> None:
    job = _running_job(ctx)
    assert attempts.apply(ctx.ledger, ctx.ledger.job(job), entry(_seen(40))) == ""
    assert ctx.ledger.job(job).state == JobState.QUEUED.value
    (attempt,) = ctx.ledger.attempts(job)
    assert attempt.state == AttemptState.PREEMPTED.value
    assert any("stopped at step 40 with a checkpoint; continues in a new Slurm job" in e.message
               for e in ctx.ledger.events(subject=job))
    assert ctx.ledger.failed_attempts(job) == 0
    ctx.ledger.start_attempt(job, host="hpc", bundle_sha="s")  # the next chunk: it must get past step 40
    ctx.ledger.update_attempt(job, 1, step=40)
    ctx.ledger.transition(job, AttemptState.RUNNING, attempt=2)
    ctx.ledger.transition(job, JobState.RUNNING)
    assert attempts.apply(ctx.ledger, ctx.ledger.job(job), entry(_seen(40))) == "failed"  # no progress: a stop
    assert ctx.ledger.attempts(job)[-1].state == AttemptState.EXITED.value


@pytest.mark.parametrize("seen", [
    _seen(None),  # signalled before the first step
    _seen(0),
    _seen(12, slurm_time_limit=False),  # a SIGTERM from elsewhere
    _seen(12, wrapper_code=0, trainer_code=0),  # it finished anyway
])
def test_anything_else_takes_the_usual_path(ctx: Context, seen: dict[str, Any]) -> None:
    job = _running_job(ctx)
    outcome = attempts.apply(ctx.ledger, ctx.ledger.job(job), entry(seen))
    assert outcome in ("failed", "succeeded")
    assert ctx.ledger.attempts(job)[0].state == AttemptState.EXITED.value


def test_a_cancelled_job_is_cancelled_not_continued(ctx: Context) -> None:
    job = _running_job(ctx)
    seen = dict(_seen(40), cancel_requested=True)
    attempts.apply(ctx.ledger, ctx.ledger.job(job), entry(seen))
    assert ctx.ledger.job(job).state == JobState.CANCELLED.value
