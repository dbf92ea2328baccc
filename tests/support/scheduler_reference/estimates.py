"""The oracle's estimates section (see the package docstring): a queue line's seconds from est_min or history."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.core.specs import DEFAULT_EPOCHS

DEFAULT_EST_S_PER_EPOCH = 60.0
"""Seconds per epoch assumed when neither ``est_min`` nor any history is known."""

RunRecord = tuple[str, str, int, float]
"""(config path, task, epochs, seconds) of one successful run (``Ledger.run_history``)."""


@dataclass(frozen=True)
class EpochRates:
    """Mean seconds per epoch from history, by (config, task) and by task."""

    by_config_task: Mapping[tuple[str, str], float] = field(default_factory=dict)
    by_task: Mapping[str, float] = field(default_factory=dict)
    runs_by_config_task: Mapping[tuple[str, str], int] = field(default_factory=dict)
    runs_by_task: Mapping[str, int] = field(default_factory=dict)
    whole_runs: Mapping[tuple[str, str], list[float]] = field(default_factory=dict)  # jobs without epochs


def epoch_rates(history: Iterable[RunRecord]) -> EpochRates:
    """Index run history once (the mean of each run's seconds per epoch).

    Runs with no positive duration say nothing; runs without epochs (0: not given) count as whole
    runs of their config and task (a config path must name them: jobs without one are not alike).
    """
    pair: dict[tuple[str, str], list[float]] = {}
    task: dict[str, list[float]] = {}
    whole: dict[tuple[str, str], list[float]] = {}
    for config, task_name, epochs, seconds in history:
        if seconds <= 0:
            continue
        if epochs <= 0:
            if config:
                whole.setdefault((config, task_name), []).append(seconds)
            continue
        rate = seconds / epochs
        pair.setdefault((config, task_name), []).append(rate)
        task.setdefault(task_name, []).append(rate)
    return EpochRates(
        by_config_task={k: sum(v) / len(v) for k, v in pair.items()},
        by_task={k: sum(v) / len(v) for k, v in task.items()},
        runs_by_config_task={k: len(v) for k, v in pair.items()},
        runs_by_task={k: len(v) for k, v in task.items()},
        whole_runs=whole,
    )


def estimate_source(*, config: str, task: str, epochs: int | None, est_min: float | None,
                    rates: EpochRates) -> str | None:
    """Where an honest estimate of this job comes from ("est_min=", "history of N runs"); None when
    there is none (``estimate_s`` then only guesses for the plan's order: never show that number)."""
    if est_min is not None and est_min > 0:
        return "est_min="
    if not epochs:
        runs = len(rates.whole_runs.get((config, task), ()))
    else:
        runs = rates.runs_by_config_task.get((config, task)) or rates.runs_by_task.get(task, 0)
    return f"history of {runs} runs" if runs else None


def estimate_s(
    *,
    config: str,
    task: str,
    epochs: int | None,
    est_min: float | None = None,
    history: Iterable[RunRecord] | EpochRates = (),
) -> float:
    """Estimated seconds for one job on a speed-1.0 host.

    ``est_min`` from the queue wins; else the mean seconds per epoch of
    successful runs with the same config path and task, × ``epochs``; else
    the same for the task alone; else ``DEFAULT_EST_S_PER_EPOCH`` × ``epochs``.
    Pass an :class:`EpochRates` (from :func:`epoch_rates`) when estimating many
    jobs against the same history.
    """
    if est_min is not None and est_min > 0:
        return est_min * 60.0
    rates = history if isinstance(history, EpochRates) else epoch_rates(history)
    if not epochs:  # nothing gave epochs: whole runs of this config, else the plan's guess (never shown)
        runs = rates.whole_runs.get((config, task))
        return sum(runs) / len(runs) if runs else DEFAULT_EST_S_PER_EPOCH * DEFAULT_EPOCHS
    per_epoch = rates.by_config_task.get((config, task))
    if per_epoch is None:
        per_epoch = rates.by_task.get(task, DEFAULT_EST_S_PER_EPOCH)
    return max(0, epochs) * per_epoch
