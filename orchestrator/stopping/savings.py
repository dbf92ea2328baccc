"""What early stopping saved (pure): the GPU-hours and the cost a stopped job would still have spent had it
run to its end, from its own progress rate (its hours and cost so far per step done, times the steps it
did not run).  An estimate, and said to be one: a run's later steps may be faster or slower than its
first ones (docs/stopping.md)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class Spent(BaseModel):
    """One stopped job: what it spent, how far it got, how far it would have gone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_hours: float = Field(ge=0.0, allow_inf_nan=False)
    cost_usd: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    step: int | None = Field(default=None, ge=0)  # the last step it reached (None: unknown)
    total_steps: int | None = Field(default=None, ge=0)


class Savings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_hours: float
    cost_usd: float | None  # None: none of the counted jobs ran on a priced host
    counted: int  # stopped jobs whose progress rate is known
    uncounted: int  # stopped jobs without a known step and total (left out of the estimate)
    basis: str


def saved(stopped: Sequence[Spent]) -> Savings | None:
    """The estimate over the stopped jobs (None: none was stopped)."""
    if not stopped:
        return None
    hours, cost, counted, priced = 0.0, 0.0, 0, False
    for job in stopped:
        if not job.step or not job.total_steps or job.total_steps <= job.step:
            continue
        left = (job.total_steps - job.step) / job.step
        hours += job.gpu_hours * left
        if job.cost_usd is not None:
            cost += job.cost_usd * left
            priced = True
        counted += 1
    whose = "jobs'" if counted != 1 else "job's"
    basis = (f"estimate: each of {counted} stopped {whose} own GPU-hours and cost per step so far, times the steps "
             "it did not run")
    if counted < len(stopped):
        basis += f"; {len(stopped) - counted} without a known step and total left out"
    return Savings(gpu_hours=hours, cost_usd=cost if priced else None, counted=counted,
                   uncounted=len(stopped) - counted, basis=basis)
