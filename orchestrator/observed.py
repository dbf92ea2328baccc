"""What gpuq knows of a trainer that does not follow the payload contract (no heartbeat): the agent's
"progress" (parsed from the log's tail) and "run_ckpt_mtime" (status document, protocol.py), turned
into attempt fields, a dashboard cell, and the headline metric of ``gpuq results``
(docs/your-project.md).  Pure functions: no ledger, no host.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

DEFAULT_METRIC = ("val_acc", "max")  # gpuq's own payload
LINE_CHARS = 80  # the last log line as a dashboard cell


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _int(value: Any) -> int | None:
    f = _num(value)
    return int(f) if f is not None else None


def attempt_progress(seen: Mapping[str, Any]) -> dict[str, Any]:
    """Attempt fields (step, total_steps, epoch, loss) from the agent's "progress" of a job that
    writes no heartbeat; {} when it has a heartbeat (the heartbeat is the better source) or no
    progress.  A total that counts epochs (no step) is not a step total."""
    if seen.get("heartbeat"):
        return {}
    progress = seen.get("progress")
    if not isinstance(progress, Mapping):
        return {}
    fields: dict[str, Any] = {}
    step, total, epoch = _int(progress.get("step")), _int(progress.get("total")), _int(progress.get("epoch"))
    if step is not None:
        fields["step"] = step
        if total:
            fields["total_steps"] = total
    if epoch is not None:
        fields["epoch"] = epoch
    loss = _num(progress.get("loss"))
    if loss is not None:
        fields["loss"] = loss
    return fields


def progress_fraction(entry: Mapping[str, Any]) -> float | None:
    """0..1 from the agent's "pct", when a regex or tqdm gave a total."""
    progress = entry.get("progress")
    pct = _num(progress.get("pct")) if isinstance(progress, Mapping) else None
    return None if pct is None else min(1.0, max(0.0, pct / 100.0))


def last_line(entry: Mapping[str, Any], width: int = LINE_CHARS) -> str:
    """The trainer's last log line, plain text (the caller escapes it for rich markup)."""
    progress = entry.get("progress")
    line = progress.get("line") if isinstance(progress, Mapping) else None
    if not isinstance(line, str):
        return ""
    line = "".join(c for c in line if c.isprintable())
    return line if len(line) <= width else line[: width - 1] + "…"


def elapsed_s(entry: Mapping[str, Any], started_at: float | None, now: float | None = None) -> float | None:
    if started_at is None or entry.get("state") != "running":
        return None
    return max(0.0, (time.time() if now is None else now) - started_at)


def liveness_ages(entry: Mapping[str, Any], now: float) -> list[float]:
    """Ages (s) of what a trainer without a heartbeat last wrote: its checkpoint-glob matches."""
    mtime = _num(entry.get("run_ckpt_mtime"))
    return [] if mtime is None else [max(0.0, now - mtime)]


def headline(run_json: Any) -> tuple[str, str]:
    """(metric, mode) from a sweep's run config (the ledger's JSON text or a dict); the payload's
    val_acc/max when the sweep has none, or it cannot be read."""
    run = run_json
    if isinstance(run_json, str):
        try:
            run = json.loads(run_json) if run_json.strip() else None
        except ValueError:
            run = None
    if not isinstance(run, Mapping):
        return DEFAULT_METRIC
    metric = run.get("metric")
    mode = run.get("mode")
    return (metric if isinstance(metric, str) and metric else DEFAULT_METRIC[0],
            mode if mode in ("max", "min") else DEFAULT_METRIC[1])


def slurm_wait(entry: Mapping[str, Any]) -> str:
    """``Slurm PENDING (Priority)`` for a job a Slurm host holds in its queue; "" otherwise."""
    slurm = entry.get("slurm")
    if not isinstance(slurm, Mapping) or not slurm.get("state") or slurm.get("state") == "RUNNING":
        return ""
    reason = str(slurm.get("reason") or "")
    job = f" job {slurm['id']}" if slurm.get("id") else ""
    text = f"Slurm{job} {slurm['state']}" + (f" ({reason})" if reason and reason != "None" else "")
    return "".join(c for c in text if c.isprintable())[:LINE_CHARS]
