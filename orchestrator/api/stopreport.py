"""Early stopping in ``gpuq report`` and ``gpuq results`` (docs/stopping.md): a stopped cell's row says
where and why it stopped, with its values at the rung and never a final value, and what the stops saved
against running every stopped job to its end (an estimate from the jobs' own progress rates)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from orchestrator.core.states import JobState
from orchestrator.money.cost import job_cost
from orchestrator.report.model import CellRow, Saved
from orchestrator.stopping.rules import stop_words
from orchestrator.stopping.savings import Spent, saved

if TYPE_CHECKING:  # the ORM's models only as types: the report reads through ledger/reader.py too
    from orchestrator.api.resultrows import ResultRow
    from orchestrator.ledger import Attempt, Job, Ledger, StopLook
    from orchestrator.ledger.reader import LedgerReader


def cell_stops(ledger: Ledger | LedgerReader, sweep_ids: Sequence[str]) -> dict[str, StopLook]:
    """Cell name -> the look that stopped it, over the sweeps (the first of each cell)."""
    out: dict[str, StopLook] = {}
    for look in ledger.stop_looks(sweep_ids):
        if look.stop:
            out.setdefault(look.cell, look)
    return out


def mark_stopped(rows: Sequence[CellRow], stops: Mapping[str, StopLook]) -> None:
    """A stopped cell's row: the rung, both means there and the words; its verdict is "stopped" unless some
    of its seeds finished before the stop (those count as ever)."""
    for row in rows:
        look = stops.get(row.cell)
        if look is None or row.is_baseline:
            continue
        row.stopped = stop_words(look.rule, look.step)
        row.stopped_step, row.stopped_rung = look.step, look.rung + 1
        row.stopped_mean, row.stopped_baseline_mean = look.cell_mean, look.baseline_mean
        if row.n_finished == 0:
            row.verdict = "stopped"


def savings(jobs: Sequence[Job], attempts: Mapping[str, Sequence[Attempt]], now: float,
            on_cpu: Callable[[Attempt], bool]) -> Saved | None:
    """What the STOPPED jobs would still have spent, from each one's own hours and cost per step so far."""
    spent = []
    for job in jobs:
        if job.state != JobState.STOPPED.value:
            continue
        tried = list(attempts.get(job.id, ()))
        cost = job_cost(job.gpus * job.nodes, tried, [], now, on_cpu)
        last = tried[-1] if tried else None
        spent.append(Spent(gpu_hours=cost.gpu_hours, cost_usd=cost.cost, step=last.step if last else None,
                           total_steps=last.total_steps if last else None))
    return _as_saved(spent)


def result_saving(rows: Sequence[ResultRow]) -> Saved | None:
    """``savings`` over ``gpuq results``' rows (their costs and newest attempts are read already)."""
    spent = [Spent(gpu_hours=row.cost.gpu_hours if row.cost else 0.0, cost_usd=row.cost.cost if row.cost else None,
                   step=row.attempt.step if row.attempt else None,
                   total_steps=row.attempt.total_steps if row.attempt else None)
             for row in rows if row.job.state == JobState.STOPPED.value]
    return _as_saved(spent)


def _as_saved(spent: Sequence[Spent]) -> Saved | None:
    found = saved(spent)
    if found is None:
        return None
    return Saved(gpu_hours=found.gpu_hours, cost_usd=found.cost_usd, counted=found.counted, basis=found.basis)


def saved_line(found: Saved) -> str:
    """One line for the report's notes and ``gpuq results``."""
    money = f" and ${found.cost_usd:.2f}" if found.cost_usd is not None else ""
    return f"early stopping saved about {found.gpu_hours:.3g} GPU-hours{money} ({found.basis})"
