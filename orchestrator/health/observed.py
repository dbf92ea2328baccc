"""What gpuq knows of a trainer that does not follow the payload contract (no heartbeat): the agent's
"progress" (parsed from the log's tail) and "run_ckpt_mtime" (status document, protocol.py), turned
into attempt fields, a dashboard cell, and the headline metric of ``gpuq results``
(docs/your-project.md).  Pure functions: no ledger, no host.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only read here, never built: the models load where a host document is parsed
    from orchestrator.host_documents import JobEntry, Summary
    from orchestrator.ledger.sweeprun import SweepRun

DEFAULT_METRIC = ("val_acc", "max")  # gpuq's own payload
LINE_CHARS = 80  # the last log line as a dashboard cell


def attempt_progress(seen: JobEntry) -> dict[str, Any]:
    """Attempt fields (step, total_steps, epoch, loss) from the agent's "progress" of a job that
    writes no heartbeat; {} when it has a heartbeat (the heartbeat is the better source) or no
    progress.  A total that counts epochs (no step) is not a step total."""
    progress = seen.progress
    if seen.beat is not None or progress is None:
        return {}
    fields: dict[str, Any] = {}
    if progress.step is not None:
        fields["step"] = progress.step
        if progress.total:
            fields["total_steps"] = progress.total
    if progress.epoch is not None:
        fields["epoch"] = progress.epoch
    if progress.loss is not None:
        fields["loss"] = progress.loss
    return fields


def progress_fraction(entry: JobEntry) -> float | None:
    """0..1 from the agent's "pct", when a regex or tqdm gave a total."""
    pct = entry.progress.pct if entry.progress is not None else None
    return None if pct is None else min(1.0, max(0.0, pct / 100.0))


def last_line(entry: JobEntry, width: int = LINE_CHARS) -> str:
    """The trainer's last log line, plain text (the caller escapes it for rich markup)."""
    line = entry.progress.line if entry.progress is not None else None
    if not line:
        return ""
    line = "".join(c for c in line if c.isprintable())
    return line if len(line) <= width else line[: width - 1] + "…"


def elapsed_s(entry: JobEntry, started_at: float | None, now: float | None = None) -> float | None:
    if started_at is None or entry.state != "running":
        return None
    return max(0.0, (time.time() if now is None else now) - started_at)


def liveness_ages(entry: JobEntry, now: float) -> list[float]:
    """Ages (s) of what a trainer without a heartbeat last wrote: its checkpoint-glob matches and
    its metrics files (a Rich progress bar writes nothing to the log while the metrics grow)."""
    return [max(0.0, now - m) for m in (entry.run_ckpt_mtime, entry.run_metrics_mtime) if m is not None]


def headline(run: SweepRun | None) -> tuple[str, str]:
    """(metric, mode) from a sweep's run config (``Sweep.run_config()``); the payload's val_acc/max when
    the sweep has none, names no metric, or its stored table cannot be read."""
    if run is None or run.unreadable:
        return DEFAULT_METRIC
    return run.metric or DEFAULT_METRIC[0], run.mode


METRICS_RULE = "metrics_missing"  # a finding on a job: its [run] metrics gave no value (docs/health.md)
FROM_SCRATCH = "from_scratch"  # the rule of a retry that restarted from scratch (counted by `gpuq results`)


def metrics_problem(run: SweepRun | None, summary: Summary | None) -> str:
    """Why a succeeded job of a sweep with ``[run] metrics`` has no value of its headline metric, in
    words that name the setting ("" when it has one, or the sweep has no such setting).  Only what
    the agent counted (files matched, rows read) is believed; a summary without counts says nothing."""
    setting = run.metrics if run is not None else ""
    if not setting or summary is None or summary.files is None:
        return ""
    metric, _ = headline(run)
    if summary.final is not None and metric in summary.final.metrics():
        return ""
    if setting == "log":
        if not summary.rows:
            return "no line of its logs matched [run] metrics_regex: no metric was recorded"
    elif summary.files == 0:
        return (f"[run] metrics = {setting!r} matched no file in its run dir: no metric was recorded "
                "(a path or glob relative to the job's run dir)")
    elif not summary.rows:
        return f"[run] metrics = {setting!r} matched {summary.files} file(s) without a row: no metric was recorded"
    return (f"the metric {metric!r} ([run] metric) is in none of the {summary.rows} rows that "
            f"[run] metrics = {setting!r} gave")


def slurm_wait(entry: JobEntry) -> str:
    """``Slurm PENDING (Priority)`` for a job a Slurm host holds in its queue; "" otherwise."""
    slurm = entry.slurm
    if slurm is None or not slurm.state or slurm.state == "RUNNING":
        return ""
    reason = slurm.reason
    job = f" job {slurm.id}" if slurm.id else ""
    text = f"Slurm{job} {slurm.state}" + (f" ({reason})" if reason and reason != "None" else "")
    return "".join(c for c in text if c.isprintable())[:LINE_CHARS]


LOWER_BETTER = ("loss", "err", "perplexity", "ppl", "mse", "mae", "rmse", "wer", "cer")
HIGHER_BETTER = ("acc", "f1", "auc", "precision", "recall", "map", "bleu", "rouge", "iou", "dice", "r2", "score")


def direction(name: str, summary: Summary) -> str:
    """"min" or "max" for a metric: the headline's own mode ([run] mode), else by its name (loss-like
    lower, accuracy-like higher); "" when the name says neither (its best is not guessed)."""
    if name == (summary.metric or DEFAULT_METRIC[0]):
        return "min" if summary.mode == "min" else "max"
    low = name.lower()
    if any(word in low for word in LOWER_BETTER):
        return "min"
    return "max" if any(word in low for word in HIGHER_BETTER) else ""
