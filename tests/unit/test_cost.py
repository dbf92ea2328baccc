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


def test_an_attempt_that_never_started_costs_nothing() -> None:
    never = Attempt(job_id="c1", number=1, host="h", state="LOST", bundle_sha="s", created_at=T0, started_at=None,
                    ended_at=T0 + 900, price_per_hour=2.0, gpu_share=1.0, heartbeat_at=T0 + 600)
    cost = job_cost(4, [never, _attempt(2, "RUNNING", T0 + 1000, None, share=1.0)], [], T0 + 1000 + 1800)
    assert cost.gpu_hours == pytest.approx(4 * 0.5) and cost.cost == pytest.approx(1.0)  # the second one alone
    assert cost.lost_gpu_hours == 0 and cost.cpu_hours == 0
    assert job_cost(1, [never], [], T0 + 5000).cost is None  # no attempt ran on a priced host


def test_the_money_of_every_attempt_adds_up_at_the_price_each_started_with() -> None:
    attempts = [_attempt(1, "PREEMPTED", T0, T0 + 3600, price=2.0, share=0.5),
                _attempt(2, "EXITED", T0 + 3600, T0 + 3 * 3600, price=3.0, share=0.25),
                _attempt(3, "EXITED", T0, T0 + 3600, price=None)]  # an unpriced host adds hours, not money
    cost = job_cost(2, attempts, [], T0 + 9 * 3600)
    assert cost.cost == pytest.approx(1 * 2.0 * 0.5 + 2 * 3.0 * 0.25)
    assert cost.gpu_hours == pytest.approx(2 * (1 + 2 + 1))


def test_hours_on_cpu_slots_are_cpu_hours_never_gpu_hours() -> None:
    on_cpu = _attempt(1, "PREEMPTED", T0, T0 + 1800, price=1.0, share=1.0)
    on_gpu = _attempt(2, "EXITED", T0 + 1800, T0 + 5400, price=1.0, share=1.0)
    cost = job_cost(3, [on_cpu, on_gpu], [], T0 + 9000, on_cpu=lambda a: a.number == 1)
    assert cost.cpu_hours == pytest.approx(3 * 0.5) and cost.gpu_hours == pytest.approx(3 * 1.0)
    assert cost.cost == pytest.approx(1.5)  # money is money on either


def test_work_lost_counts_only_checkpoints_the_lost_attempt_could_resume_from() -> None:
    """A checkpoint a later attempt wrote, or one written after the attempt's last sign of life, does not
    save the lost attempt's work; a lost attempt without a heartbeat was alive until it ended."""
    attempts = [_attempt(1, "LOST", T0, T0 + 3600), _attempt(2, "EXITED", T0 + 3600, T0 + 7200)]
    checkpoints = [_ckpt(1, T0 + 1800, 10), _ckpt(2, T0 + 3000, 20), _ckpt(1, T0 + 4000, 30)]
    cost = job_cost(2, attempts, checkpoints, T0 + 8000)
    assert cost.lost_gpu_hours == pytest.approx(2 * 1800 / 3600)  # from +1800 to its end at +3600, on 2 GPUs
    assert cost.preemptions == 0
    assert job_cost(2, attempts[:1], [_ckpt(1, T0 + 3600, 40)], T0 + 8000).lost_gpu_hours == 0  # saved at its end


def test_a_clock_that_went_backwards_costs_nothing_rather_than_less_than_nothing() -> None:
    cost = job_cost(1, [_attempt(1, "PREEMPTED", T0, T0 - 600, beat=T0 - 900)], [], T0 + 100)
    assert cost.gpu_hours == 0 and cost.cost == 0 and cost.lost_gpu_hours == 0 and cost.preemptions == 1


def test_every_attempt_on_cpu_slots_and_every_loss_adds_up() -> None:
    attempts = [_attempt(1, "PREEMPTED", T0, T0 + 1800, beat=T0 + 1800),
                _attempt(2, "LOST", T0 + 1800, T0 + 3600, beat=T0 + 3600),
                _attempt(3, "RUNNING", T0 + 3600, None)]
    cost = job_cost(2, attempts, [], T0 + 5400, on_cpu=lambda a: True)
    assert cost.cpu_hours == pytest.approx(2 * 1.5) and cost.gpu_hours == 0  # the running one until now
    assert cost.lost_gpu_hours == pytest.approx(2 * 1.0)  # both lost attempts, nothing saved
    assert cost.preemptions == 1


def test_an_attempt_lost_without_an_end_or_a_heartbeat_was_alive_until_now() -> None:
    cost = job_cost(2, [_attempt(1, "LOST", T0, None)], [_ckpt(1, T0 + 600, 5)], T0 + 1800)
    assert cost.lost_gpu_hours == pytest.approx(2 * 1200 / 3600) and cost.gpu_hours == pytest.approx(1.0)
