"""A non-finite loss in a project's own metrics, for the status probe of a running job (docs/health.md).

gpuq_scan.py reads the payload's ``result/metrics.jsonl`` incrementally; a project's own trainer logs
its losses where its ``[run] metrics`` setting says (CSV or JSON-lines files in the run dir, or "log":
``metrics_regex`` over its job.log).  Each loss whose newest value there is NaN or infinite is reported
in gpuq_scan's "nonfinite" shape, and the controller ends the attempt as a divergence.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import math
import os
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout
from gpuq_base.gpuq_jobspec import RunSection, read_spec
from gpuq_records.gpuq_observe import safe_globs
from gpuq_records.gpuq_runmetrics import MAX_CELL_CHARS, _file_rows, _read_bounded, log_rows, metrics_files, number

LOSS_KEYS = ("loss", "train_loss", "train/loss", "train_loss_step", "train_loss_epoch", "val_loss", "val/loss")
STEP_KEYS = ("step", "global_step", "trainer/global_step")
TAIL_BYTES = 64 * 1024


def _whole(value: Any) -> int | None:
    f = number(value)
    return int(f) if f is not None and math.isfinite(f) else None


def nonfinite_losses(job_dir: str, run: RunSection, attempt: int, since: Any,
                     tail: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """Each loss (LOSS_KEYS) whose newest value is NaN or infinite, as {"step", "epoch", "kind" (the
    source), "field", "value"}; [] when none.  Read: the newest file the ``metrics`` setting matches,
    only when written since ``since`` (the attempt's launch: an earlier attempt's rows are not this
    one's), or for "log" the attempt's own job.log; bounded to the header and the last ``tail`` bytes.
    Only a loss's newest value counts: a trainer that logged one NaN and recovered is not ended for it."""
    metrics = run.metrics
    if not metrics:
        return []
    if metrics == "log":
        try:
            head, body = _read_bounded(os.path.join(job_dir, P.ATTEMPTS_DIR, str(attempt), P.JOB_LOG), tail)
        except OSError:
            return []
        rows, source = log_rows([head + "\n" + body], run.metrics_regex), "log"
    else:
        globs = safe_globs([metrics])
        files = metrics_files(job_dir, globs[0], attempt) if globs else []
        start = number(since)
        if not files or (start is not None and math.isfinite(start) and files[-1][1] < start):
            return []
        rel = files[-1][0]
        try:
            rows, _ = _file_rows(os.path.join(job_dir, P.RUN_DIR, rel), rel, tail)
        except OSError:
            return []
        source = P.RUN_DIR + "/" + rel
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        for key in LOSS_KEYS:
            if number(row.get(key)) is not None:
                newest[key] = row
    out = []
    for key, row in newest.items():
        value = number(row[key])
        if value is not None and not math.isfinite(value):
            step = next((s for s in (_whole(row.get(k)) for k in STEP_KEYS) if s is not None), None)
            out.append({"step": step, "epoch": _whole(row.get("epoch")), "kind": source[:MAX_CELL_CHARS],
                        "field": key, "value": str(row[key])[:MAX_CELL_CHARS]})
    return out


def of_running_job(lay: Layout, job_id: str, attempt: int, since: Any) -> list[dict[str, Any]]:
    """``nonfinite_losses`` of a claimed job, by its spec's ``run`` ([] for gpuq's own payload: gpuq_scan.py)."""
    spec = read_spec(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    return nonfinite_losses(lay.job(job_id), spec.run, attempt, since) if spec is not None and spec.run else []
