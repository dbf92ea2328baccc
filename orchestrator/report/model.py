"""The report's document: what ``gpuq report --format json`` prints (docs/schemas/report.schema.json)
and what the table, Markdown, CSV and HTML forms are drawn from."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["baseline", "better", "worse", "within noise", "n too small", "cannot compute", "no data",
                  "no baseline", "seeds identical", "stopped"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SeedRow(_Strict):
    """One job of a cell: its own values, so the reader sees the seeds behind a mean."""

    job: str
    name: str
    seed: int | None = Field(description="the job's seed= field; null when its seed comes from its name or args")
    state: str
    final: float | None = Field(description="the job's final value of the metric; null: none reported")
    best: float | None = Field(description="the best value it reached during training (by mode)")
    steps: int | None = Field(description="the step its final value was taken at")
    attempts: int
    wall_s: float = Field(description="seconds its attempts ran, summed (a running attempt up to now)")


class CellRow(_Strict):
    """One cell: the jobs of one ablation setting that differ only by seed (docs/report.md)."""

    cell: str = Field(description="the cell's name: the job name without its seed part")
    sweeps: list[str] = Field(description="sweep ids the cell's jobs come from")
    jobs: list[str] = Field(description="job ids of every seed, finished or not")
    names: list[str] = Field(description="job names, in the order of jobs")
    n_finished: int = Field(description="seeds that SUCCEEDED and reported the metric: the only ones that count")
    n_total: int
    mean: float | None = Field(description="mean over finished seeds of each job's final metric value")
    std: float | None = Field(description="sample standard deviation (n - 1); null below 2 seeds")
    ci_low: float | None = Field(description="95 % Student-t confidence interval of the mean; null below 2 seeds")
    ci_high: float | None
    best: float | None = Field(description="the best value any finished seed reached during training (by mode)")
    final: float | None = Field(description="the mean of the seeds' final values (the same number as mean)")
    steps: int | None = Field(description="the most steps a finished seed reached")
    gpu_hours: float = Field(description="GPU-hours of every attempt of every seed, unfinished ones included")
    cpu_hours: float = Field(default=0.0, description="the hours of those attempts that ran on CPU slots, times "
                                                      "their slots (never counted as GPU-hours)")
    cost_usd: float | None = Field(description="what those attempts cost on priced hosts; null when none was priced")
    is_baseline: bool
    delta: float | None = Field(description="mean minus the baseline's mean")
    delta_ci_low: float | None = Field(description="95 % Welch confidence interval of the delta")
    delta_ci_high: float | None
    p_value: float | None = Field(description="two-sided Welch t-test p-value of the delta")
    p_adjusted: float | None = Field(default=None, description="that p-value Holm-adjusted over every cell compared "
                                     "with the baseline; the verdict is better or worse only when it is under 0.05")
    verdict: Verdict
    flags: list[str] = Field(description="warnings in words: a diverged seed, seeds that disagree, seeds "
                                         "identical, seeds or a baseline on other machines")
    ran_with: list[str] = Field(default_factory=list, description="what the seeds' attempts ran with, one line "
                                "per distinct machine and software (GPUs, driver, CUDA, torch, NCCL, Python)")
    seeds: list[SeedRow] = Field(default_factory=list, description="every job of the cell, in the order of jobs")
    wall_s: float | None = Field(default=None, description="the mean over finished seeds of the seconds each ran; "
                                 "null when none finished")
    differs: list[str] = Field(default_factory=list, description="what this cell runs differently from the "
                               "baseline (config keys, trainer arguments, task, epochs, GPUs), one line each; "
                               "empty for the baseline and without one")
    stopped: str = Field(default="", description="early stopping stopped the cell: \"stopped: worse than baseline "
                         "at step N\" (docs/stopping.md); \"\" when it was not stopped")
    stopped_step: int | None = Field(default=None, description="the step of the rung it was stopped at")
    stopped_rung: int | None = Field(default=None, description="that rung, 1 for the first")
    stopped_mean: float | None = Field(default=None, description="the cell's mean at that rung (not a final value)")
    stopped_baseline_mean: float | None = Field(default=None, description="the baseline's mean at that rung")


class SweepInfo(_Strict):
    id: str
    queue: str = Field(description="the queue file the sweep was submitted from")
    queue_text: str = Field(description="the sweep's jobs as parsed from that file, one line each")
    bundle_sha: str
    created_at: float
    hosts: list[str] = Field(description="hosts its attempts ran on")
    git_commit: str | None = Field(default=None, description="the project's git commit at submit; null: unknown")
    git_dirty: bool | None = Field(default=None, description="uncommitted changes at submit; null: unknown")


class FailureRow(_Strict):
    job: str
    name: str
    cell: str
    state: str
    failure_class: str = Field(description="gpuq's failure class (docs/health.md), \"\" when not classified")
    message: str
    log_tail: list[str] = Field(description="the last lines of the job's log from a pulled copy, when there is one")


class Saved(_Strict):
    """What early stopping saved against running every stopped job to its end: an estimate with its basis."""

    gpu_hours: float
    cost_usd: float | None = Field(description="null when no stopped job ran on a priced host")
    counted: int = Field(description="stopped jobs whose progress rate is known (the others are left out)")
    basis: str = Field(description="how the estimate was made, in words")


class Report(_Strict):
    """`gpuq report --format json`: per-cell statistics of one or more sweeps against a baseline."""

    schema_: Literal["gpuq.cli.report/1"] = Field("gpuq.cli.report/1", alias="schema")
    generated_at: float
    sweeps: list[SweepInfo]
    metric: str
    mode: Literal["max", "min"]
    baseline: str | None = Field(description="the baseline cell's name; null when there is none")
    finished: int = Field(description="jobs that count: SUCCEEDED with the metric")
    total: int
    partial: bool = Field(description="some jobs have not finished: only finished ones count")
    cells: list[CellRow]
    failures: list[FailureRow]
    gpu_hours: float
    cpu_hours: float = 0.0
    cost_usd: float | None
    notes: list[str] = Field(description="what the reader must know: unfinished jobs, a missing baseline, ...")
    headline: str = Field(default="", description="one sentence: the best cell, its delta against the baseline "
                          "and its verdict (orchestrator/report/summary.py)")
    saved: Saved | None = Field(default=None, description="early stopping's saving (docs/stopping.md); null when "
                                "no job was stopped")
