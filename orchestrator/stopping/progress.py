"""What the rules see of a sweep (pure): each cell's seeds at each rung, from the curves gpuq already
collected (``Ledger.curves``: job id -> metric -> [(step, value)]).  For the tick stage that will act
on the looks (docs/stopping.md, "Not built yet")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.stopping.policy import StopPolicy, rung_steps, value_at
from orchestrator.stopping.rules import AtRung


class Seed(BaseModel):
    """One job of a cell: its curve of the policy's metric, whether it may still report, its run's length."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(min_length=1, max_length=200)
    live: bool  # queued or running: it may yet reach a rung
    total_steps: int = Field(ge=1, le=10**12)
    curve: tuple[tuple[int, float], ...] = Field(default=(), max_length=1_000_000)


def at_rungs(policy: StopPolicy, cells: Mapping[str, Sequence[Seed]]) -> list[AtRung]:
    """Each cell at each rung: the values of the seeds that reached it, and how many live seeds have
    not yet (an ended seed that never reached a rung is neither: it will not come)."""
    out: list[AtRung] = []
    for cell, seeds in sorted(cells.items()):
        for rung in range(len(policy.rungs)):
            values: list[float] = []
            pending = 0
            for seed in seeds:
                value = value_at(seed.curve, rung_steps(policy, seed.total_steps)[rung])
                if value is not None:
                    values.append(value)
                elif seed.live:
                    pending += 1
            out.append(AtRung(cell=cell, rung=rung, values=tuple(values), pending=pending))
    return out
