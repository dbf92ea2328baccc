"""tick.capacity.host_capacity: what the scheduler may assume about a host, from the ledger alone."""

from __future__ import annotations

from orchestrator.core.config import Settings
from orchestrator.ledger import Attempt, HostRow, Job
from orchestrator.scheduling.estimates import EpochRates
from orchestrator.scheduling.scheduler import plan
from orchestrator.tick.capacity import host_capacity, plan_job

NOW = 10_000.0


def _row(**kw: object) -> HostRow:
    base: dict[str, object] = {"name": "h", "kind": "ssh", "root": "/r", "slots_total": 2, "created_at": 0.0}
    base.update(kw)
    return HostRow(**base)


def _job(job_id: str, state: str, gpus: int = 1, est_min: float = 10.0) -> Job:
    return Job(id=job_id, sweep_id="q", name=job_id, line=1, raw="", config="c.yaml", config_sha256="0",
               task="classify", epochs=1, gpus=gpus, nodes=1, est_min=est_min, retries=1, spec_hash="x",
               state=state, host="h", created_at=0, updated_at=0)


def _attempt(job_id: str, started: float | None, created: float) -> Attempt:
    return Attempt(job_id=job_id, number=1, host="h", state="RUNNING", bundle_sha="s", created_at=created,
                   started_at=started)


def test_running_then_assigned_work_occupies_slots_in_order() -> None:
    jobs = [_job("run", "RUNNING"), _job("next", "ASSIGNED", gpus=2)]
    attempts = {"run": _attempt("run", NOW - 240, 1), "next": _attempt("next", None, 2)}
    cap = host_capacity(_row(), jobs, attempts, Settings(), EpochRates(), NOW)
    # "run" has 6 of its 10 minutes left; "next" needs both slots, so starts after it and runs 10 min
    assert sorted(cap.slot_free_at) == [960.0, 960.0]
    assert cap.usable and cap.disk_free_bytes is None


def test_unreachable_host_is_unusable_with_the_time_it_went_away() -> None:
    cap = host_capacity(_row(unreachable_since=0.0), [], {}, Settings(), EpochRates(), NOW)
    assert not cap.usable and cap.reason == "unreachable since 1970-01-01 00:00:00Z"


def test_disk_budget_is_free_bytes_minus_the_gate_and_checkpoints_count_twice() -> None:
    row = _row(disk_free_bytes=5_000_000_000, min_free_gb=2.0)
    cap = host_capacity(row, [], {}, Settings(min_free_gb=1.0), EpochRates(), NOW)
    assert cap.disk_free_bytes == 3_000_000_000
    big = plan_job("j", gpus=1, config="c.yaml", task="classify", epochs=1, est_min=1, host_pin=None,
                   rates=EpochRates(), ckpt_bytes={"c.yaml": 2_000_000_000})
    assert big.disk_bytes == 4_000_000_000
    result = plan([big], [cap])
    assert result.assignments == () and "disk" in result.unplaced[0][1]


def test_the_local_host_has_its_gpus_once_probed_and_its_cpu_slots_otherwise() -> None:
    """A workstation with one GPU and sixteen cores runs one job at a time, as its agent does (GPUs win
    over CPU slots there); a CPU machine runs GPUQ_LOCAL_CPU_SLOTS jobs (default: one per core)."""
    settings = Settings(local_cpu_slots=16)
    gpu = host_capacity(_row(name="local", kind="local", slots_kind="gpu", slots_total=1), [], {}, settings,
                        EpochRates(), NOW)
    assert gpu.total == 1 and len(gpu.slot_free_at) == 1
    for kind in ("cpu", ""):  # probed as a CPU machine, or not probed yet
        cpu = host_capacity(_row(name="local", kind="local", slots_kind=kind, slots_total=1), [], {}, settings,
                            EpochRates(), NOW)
        assert cpu.total == 16
