"""A summary of a project's own metrics, in the shape of the payload's ``result/summary.json``:
{"metric", "mode", "final": {..row.., "step"}, "best": {..row..}, "steps", "source"}.

Sources (spec ``run.metrics``): a CSV file with a header in the run dir (as Lightning's CSVLogger
writes it: rows may leave cells empty; a step and/or epoch column), a JSON-lines file, or "log":
the named groups of ``run.metrics_regex`` over the attempts' job.log files.  At most
MAX_METRICS_BYTES are read (a bigger file: its header and its newest bytes).  ``final`` is the last
row that has the metric; ``best`` the best finite value by ``mode``; non-numeric and NaN values never
win.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
from typing import Any

import gpuq_protocol as P
from gpuq_observe import safe_globs

MAX_METRICS_BYTES = 64 * 1024 * 1024
MAX_CELL_CHARS = 256
CURVE_POINTS = 200  # per metric, first and last kept (docs/report.md)
CURVE_NAMES = 8  # the headline metric and the loss-like ones


def _read_bounded(path: str, limit: int = MAX_METRICS_BYTES) -> tuple[str, str]:
    """(first line, text of the rest) with at most ``limit`` bytes in all; the newest bytes win."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file: %s" % path)
        size = st.st_size
        if size <= limit:
            data = f.read(limit)
            head, _, rest = data.partition(b"\n")
        else:
            head = f.readline(MAX_CELL_CHARS * 256).rstrip(b"\n")
            f.seek(size - (limit - len(head)))
            rest = f.read(limit)
            rest = rest[rest.find(b"\n") + 1:]  # a cut first row is not a row
    return head.decode("utf-8", "replace"), rest.decode("utf-8", "replace")


def number(value: Any) -> float | None:
    """A cell as a float (NaN/inf included), or None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip()[:MAX_CELL_CHARS])
        except ValueError:
            return None
    return None


def _cell(value: Any) -> Any:
    """A value fit for strict JSON: finite numbers stay numbers, the rest becomes a short string."""
    f = number(value)
    if f is None:
        return str(value)[:MAX_CELL_CHARS] if value is not None else None
    if not math.isfinite(f):
        return str(f)
    return int(f) if f.is_integer() and abs(f) < 2 ** 53 and "." not in str(value) else f


def csv_rows(head: str, body: str) -> list[dict[str, Any]]:
    header = next(csv.reader([head]), [])
    header = [h.strip()[:MAX_CELL_CHARS] for h in header]
    rows = []
    try:
        for rec in csv.reader(io.StringIO(body)):
            if rec == header or not rec:
                continue  # a header written again (Lightning rewrites the file when keys appear)
            row = {k: _cell(v) for k, v in zip(header, rec) if k and v.strip() != ""}
            if row:
                rows.append(row)
    except csv.Error:
        pass  # a NUL byte or a broken quote: keep the rows read so far
    return rows


def jsonl_rows(head: str, body: str) -> list[dict[str, Any]]:
    rows = []
    for line in [head] + body.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            rows.append({str(k)[:MAX_CELL_CHARS]: _cell(v) for k, v in rec.items()
                         if isinstance(v, (int, float, str)) or v is None})
    return rows


def log_rows(texts: list[str], regex: str) -> list[dict[str, Any]]:
    try:
        rx = re.compile(regex)
    except (re.error, TypeError):
        return []
    rows = []
    for text in texts:
        for line in text.splitlines():
            m = rx.search(line[-4096:])
            if m is None:
                continue
            row = {k: _cell(v) for k, v in m.groupdict().items() if v is not None}
            if row:
                rows.append(row)
    return rows


def _step_of(row: dict[str, Any], index: int) -> Any:
    for key in ("step", "global_step", "trainer/global_step", "epoch"):
        v = number(row.get(key))
        if v is not None and math.isfinite(v):
            return int(v)
    return index


def summarize(rows: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any] | None:
    """final/best of ``metric`` over ``rows``; None when no row has it."""
    final = best = None
    best_v = None
    for i, row in enumerate(rows):
        if metric not in row:
            continue
        row = dict(row)
        row.setdefault("step", _step_of(row, i))
        final = row
        v = number(row[metric])
        if v is None or not math.isfinite(v):
            continue
        if best_v is None or (v > best_v if mode == "max" else v < best_v):
            best, best_v = row, v
    if final is None:
        return None
    steps = [_step_of(r, i) for i, r in enumerate(rows)]
    return {"metric": metric, "mode": mode, "final": final, "best": best,
            "steps": max(steps) if steps else 0, "rows": len(rows)}


def downsample(points: list, limit: int = CURVE_POINTS) -> list:
    """At most ``limit`` points spread evenly over the list, the first and the last always kept."""
    if len(points) <= limit:
        return points
    last = len(points) - 1
    picks = sorted({round(i * last / (limit - 1)) for i in range(limit)})
    return [points[i] for i in picks]


def curves(rows: list[dict[str, Any]], metric: str) -> dict[str, list[list[float]]]:
    """The learning curves ``gpuq report`` draws: [step, value] of the headline metric and of every
    column whose name contains "loss", finite values only, each downsampled to CURVE_POINTS."""
    names = [metric]
    for row in rows:
        for key in row:
            if "loss" in str(key).lower() and key not in names and len(names) < CURVE_NAMES:
                names.append(str(key))
    out: dict[str, list[list[float]]] = {}
    for name in names:
        points = []
        for i, row in enumerate(rows):
            v = number(row.get(name))
            if v is not None and math.isfinite(v):
                points.append([_step_of(row, i), v])
        if points:
            out[name] = downsample(points)
    return out


def payload_curves(job_dir: str, metric: str) -> dict[str, list[list[float]]]:
    """Curves from the payload's result/metrics.jsonl (train lines carry loss, eval lines the metric)."""
    try:
        head, body = _read_bounded(os.path.join(job_dir, P.RESULT_DIR, P.METRICS_FILE))
    except OSError:
        return {}
    return curves(jsonl_rows(head, body), metric)


def _safe_rel(path: str) -> str | None:
    globs = safe_globs([path])
    return globs[0] if globs and not any(c in globs[0] for c in "*?[") else None


def run_summary(job_dir: str, run: dict[str, Any], attempt: int) -> dict[str, Any] | None:
    """The summary of a job whose spec has ``run.metrics``, or None (no metrics, no rows)."""
    metrics = run.get("metrics")
    if not isinstance(metrics, str) or not metrics:
        return None
    metric = run.get("metric") or "val_acc"
    mode = "min" if run.get("mode") == "min" else "max"
    if metrics == "log":
        texts = []
        budget = MAX_METRICS_BYTES
        for n in range(max(1, attempt), 0, -1):  # the newest attempts first, within the budget
            if budget <= 0:
                break
            try:
                head, body = _read_bounded(os.path.join(job_dir, P.ATTEMPTS_DIR, str(n), P.JOB_LOG), budget)
            except OSError:
                continue
            budget -= len(head) + len(body)
            texts.insert(0, head + "\n" + body)
        rows = log_rows(texts, str(run.get("metrics_regex") or ""))
        source = "log"
    else:
        rel = _safe_rel(metrics)
        if rel is None:
            return None
        try:
            head, body = _read_bounded(os.path.join(job_dir, P.RUN_DIR, rel))
        except OSError:
            return None
        is_json = rel.endswith((".jsonl", ".json", ".ndjson")) or head.lstrip().startswith("{")
        rows = jsonl_rows(head, body) if is_json else csv_rows(head, body)
        source = P.RUN_DIR + "/" + rel
    out = summarize(rows, str(metric), mode)
    if out is not None:
        out["source"] = source
        out["curves"] = curves(rows, str(metric))
    return out
