"""GPU-hours, money and the GPU-hours lost to preemptions (orchestrator/money/cost.py)."""

from __future__ import annotations

import pytest

from orchestrator.ledger import Attempt, Checkpoint
from orchestrator.money.cost import job_cost

T0 = 1_800_000_000.0


def _attempt(number: int, state: str, start: float, end: float | None, *, price: float | None = 2.0,
             share: float = 0.5, beat: float | None = None) -> Attempt:
    return Attempt(job_id="c1", number=number, host="h", state=state, bundle_sha="s", created_at=start,
                   started_at=start, ended_at=end, price_per_hour=price, gpu_share=share, heartbeat_at=beat)


def _ckpt(attempt: int, written: float, step: int) -> Checkpoint:
    return Checkpoint(job_id="c1", attempt=attempt, file=f"latest-{step}.pt", step=step, sha256=str(step), bytes=1,
                      written_at=written)


def test_an_uninterrupted_job() -> None:
    cost = job_cost(2, [_attempt(1, "EXITED", T0, T0 + 3600)], [], T0 + 7200)
    assert cost.gpu_hours == pytest.approx(2.0) and cost.cost == pytest.approx(1.0)  # half of a $2/h machine
    assert cost.lost_gpu_hours == 0 and cost.preemptions == 0


def test_a_preemption_loses_the_work_since_the_last_checkpoint() -> None:
    attempts = [_attempt(1, "PREEMPTED", T0, T0 + 1900, beat=T0 + 1800),
                _attempt(2, "EXITED", T0 + 2000, T0 + 4000)]
    checkpoints = [_ckpt(1, T0 + 600, 100), _ckpt(1, T0 + 1200, 200), _ckpt(2, T0 + 3000, 300)]
    cost = job_cost(1, attempts, checkpoints, T0 + 5000)
    assert cost.preemptions == 1
    assert cost.lost_gpu_hours == pytest.approx(600 / 3600)  # heartbeat at +1800, newest checkpoint at +1200
    assert cost.gpu_hours == pytest.approx((1900 + 2000) / 3600)


def test_unpriced_hosts_have_no_cost_and_running_attempts_count_until_now() -> None:
    cost = job_cost(1, [_attempt(1, "RUNNING", T0, None, price=None)], [], T0 + 1800)
    assert cost.cost is None and cost.gpu_hours == pytest.approx(0.5)


def test_a_loss_without_any_checkpoint_loses_everything_since_the_start() -> None:
    cost = job_cost(1, [_attempt(1, "LOST", T0, T0 + 900, beat=T0 + 720)], [], T0 + 1000)
    assert cost.lost_gpu_hours == pytest.approx(720 / 3600) and cost.preemptions == 0
