"""How long a job will take: ``est_min=`` from its queue line, else the run history of its config and
task (the mean seconds per epoch of successful runs from scratch), else a placeholder for the plan's
order that is never shown as an estimate (``estimate_source`` says which).  Pure: the ledger's
``run_history`` goes in, numbers come out."""

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
    epochs_by_config_task: Mapping[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)  # the runs' epochs


RunGroups = tuple[dict[tuple[str, str], list[float]], dict[str, list[float]], dict[tuple[str, str], list[float]]]


def run_groups(history: Iterable[RunRecord]) -> RunGroups:
    """The run history grouped as estimates read it: seconds per epoch by (config, task) and by task, and
    the seconds of whole runs without epochs (0: not given) by (config, task).  Runs with no positive
    duration say nothing; a whole run needs a config path (jobs without one are not alike)."""
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
    return pair, task, whole


def epoch_rates(history: Iterable[RunRecord]) -> EpochRates:
    """Index run history once (the mean of each run's seconds per epoch; ``run_groups``)."""
    history = list(history)
    pair, task, whole = run_groups(history)
    shapes: dict[tuple[str, str], set[int]] = {}
    for config, task_name, epochs, seconds in history:
        if seconds > 0 and epochs > 0:
            shapes.setdefault((config, task_name), set()).add(epochs)
    return EpochRates(
        epochs_by_config_task={k: tuple(sorted(v)) for k, v in shapes.items()},
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
    if not runs:
        return None
    scaled = scaled_from(config=config, task=task, epochs=epochs, est_min=est_min, rates=rates)
    return f"history of {runs} runs" + (f", {scaled}" if scaled else "")


def scaled_from(*, config: str, task: str, epochs: int | None, est_min: float | None, rates: EpochRates) -> str:
    """How an estimate from history was scaled from runs of another shape, in words ("from 2-epoch runs,
    scaled to 6 epochs", "from other configs' runs of classify, scaled to 6 epochs"); "" when the runs
    it comes from had this job's shape (or it comes from est_min=, or from nothing)."""
    if (est_min is not None and est_min > 0) or not epochs:
        return ""
    seen = rates.epochs_by_config_task.get((config, task))
    if seen:
        if seen == (epochs,):
            return ""
        shown = "/".join(str(e) for e in seen[:3]) + ("/..." if len(seen) > 3 else "")
        return f"from {shown}-epoch runs, scaled to {epochs} epochs"
    if rates.runs_by_task.get(task):
        return f"from other configs' runs of {task or 'this task'}, scaled to {epochs} epochs"
    return ""


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
