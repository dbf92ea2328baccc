"""A summary of a project's own metrics, in the shape of the payload's ``result/summary.json``:
{"metric", "mode", "final": {..row.., "step"}, "best": {..row..}, "steps", "source"}.

Sources (spec ``run.metrics``): CSV files with a header in the run dir (as Lightning's CSVLogger
writes them: rows may leave cells empty; a step and/or epoch column) or JSON-lines files, named by a
path or a glob (``lightning_logs/version_*/metrics.csv``, ``outputs/*/*/metrics.csv``), or "log": the
named groups of ``run.metrics_regex`` over the attempts' job.log files.  Every source is read in the
order the trainer wrote it and merged into one series (``merge_runs``: the rows of steps a resumed
run trains again replace the earlier ones).  At most MAX_METRICS_BYTES are read in all (a bigger
file: its header and its newest bytes).  ``final`` is the last
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

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_jobspec import RunSection
from gpuq_records import gpuq_own
from gpuq_records.gpuq_observe import safe_globs

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


def downsample(points: list[Any], limit: int = CURVE_POINTS) -> list[Any]:
    """At most ``limit`` points spread evenly over the list, the first, the last and the lowest and
    highest value (``[step, value]`` points: each metric's own best survives) always kept."""
    if len(points) <= limit:
        return points
    last = len(points) - 1
    picks = {0, last}
    if isinstance(points[0], list):
        picks |= {min(range(len(points)), key=lambda i: points[i][1]),
                  max(range(len(points)), key=lambda i: points[i][1])}
    for i in range(limit):  # evenly spread, up to the budget
        if len(picks) >= limit:
            break
        picks.add(round(i * last / (limit - 1)))
    return [points[i] for i in sorted(picks)]


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


MAX_METRICS_FILES = 64  # files a metrics glob may merge (the newest kept)
_STEP_KEYS = ("step", "global_step", "trainer/global_step")


def _position(row: dict[str, Any]) -> tuple[tuple[str, ...], tuple[float, ...]] | None:
    """Where a row sits in training: (the keys present, their values) of epoch and step, or None.
    Rows are compared only with rows that have the same keys (a step within an epoch, a global
    step, an epoch alone)."""
    keys, values = [], []
    e = number(row.get("epoch"))
    if e is not None and math.isfinite(e):
        keys.append("epoch")
        values.append(e)
    for key in _STEP_KEYS:
        s = number(row.get(key))
        if s is not None and math.isfinite(s):
            keys.append("step")
            values.append(s)
            break
    return (tuple(keys), tuple(values)) if keys else None


def _drop_from(rows: list[dict[str, Any]], where: tuple[tuple[str, ...], tuple[float, ...]]) -> list[dict[str, Any]]:
    """``rows`` without those at or after ``where`` (same keys only): the steps a run trains again."""
    kept = []
    for row in rows:
        pos = _position(row)
        if pos is not None and pos[0] == where[0] and pos[1] >= where[1]:
            continue
        kept.append(row)
    return kept


def merge_runs(sources: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One series from the rows of every run of a job, oldest source first (an attempt's log, a
    Lightning ``version_N``, a Hydra dated dir).  A run that trains steps again replaces what earlier
    rows said of them: rows from a later source, or a row whose step goes back within one file (a
    trainer that appends to the same file after a resume), drop the earlier rows at or after their
    own first step.  Rows without an epoch or step are kept as they come."""
    merged: list[dict[str, Any]] = []
    for rows in sources:
        first = True
        high: dict[tuple[str, ...], tuple[float, ...]] = {}
        for row in rows:
            pos = _position(row)
            if pos is not None:
                keys, values = pos
                if first or (keys in high and values < high[keys]):
                    merged = _drop_from(merged, pos)
                    high = {}
                first = False
                high[keys] = max(high.get(keys, values), values)
            merged.append(row)
    return merged


def _launch_times(job_dir: str, attempt: int) -> list[float]:
    """When each attempt 1..attempt started (its launch.json's time; 0 when unknown)."""
    out = []
    for n in range(1, max(1, attempt) + 1):
        try:
            with open(os.path.join(job_dir, P.ATTEMPTS_DIR, str(n), P.LAUNCH_FILE), "rb") as f:
                t = number(json.loads(f.read(65536).decode("utf-8", "replace")).get("time"))
        except (OSError, ValueError, AttributeError):
            t = None
        out.append(t if t is not None and math.isfinite(t) else 0.0)
    return out


def metrics_files(job_dir: str, pattern: str, attempt: int) -> list[tuple[str, float]]:
    """(path under run/, mtime) of the real files under run/ that the ``metrics`` setting (a path or a
    glob) matches, in the order the trainer wrote them: by the attempt that wrote each (the last one
    started before its mtime), then mtime, then name; at most MAX_METRICS_FILES, the newest kept."""
    own, _refused = gpuq_own.scan(os.path.join(job_dir, P.RUN_DIR), [pattern])
    found = [(f.rel, f.mtime) for f in own if f.kind == "file"]  # never through a link (gpuq_own.py)
    starts = _launch_times(job_dir, attempt)

    def written_by(mtime: float) -> int:
        return max([n for n, t in enumerate(starts, 1) if t <= mtime] or [0])

    found.sort(key=lambda f: (written_by(f[1]), f[1], f[0]))
    return found[-MAX_METRICS_FILES:]


def _file_rows(path: str, rel: str, budget: int) -> tuple[list[dict[str, Any]], int]:
    head, body = _read_bounded(path, budget)
    is_json = rel.endswith((".jsonl", ".json", ".ndjson")) or head.lstrip().startswith("{")
    return (jsonl_rows(head, body) if is_json else csv_rows(head, body)), len(head) + len(body)


def file_sources(job_dir: str, pattern: str, attempt: int) -> tuple[list[list[dict[str, Any]]], int]:
    """(rows of each matching file, oldest first; how many files matched), within MAX_METRICS_BYTES
    in all: the newest files are read first."""
    files = metrics_files(job_dir, pattern, attempt)
    sources: list[list[dict[str, Any]]] = []
    budget = MAX_METRICS_BYTES
    for rel, _st in reversed(files):
        if budget <= 0:
            break
        try:
            rows, used = _file_rows(os.path.join(job_dir, P.RUN_DIR, rel), rel, budget)
        except OSError:
            continue
        budget -= used
        sources.insert(0, rows)
    return sources, len(files)


def log_sources(job_dir: str, run: RunSection, attempt: int) -> list[list[dict[str, Any]]]:
    """The rows of ``metrics_regex`` over each attempt's job.log, oldest attempt first, within budget."""
    sources: list[list[dict[str, Any]]] = []
    budget = MAX_METRICS_BYTES
    for n in range(max(1, attempt), 0, -1):  # the newest attempts first, within the budget
        if budget <= 0:
            break
        try:
            head, body = _read_bounded(os.path.join(job_dir, P.ATTEMPTS_DIR, str(n), P.JOB_LOG), budget)
        except OSError:
            continue
        budget -= len(head) + len(body)
        sources.insert(0, log_rows([head + "\n" + body], run.metrics_regex))
    return sources


def run_summary(job_dir: str, run: RunSection, attempt: int) -> dict[str, Any] | None:
    """The summary of a job whose spec has ``run.metrics`` (None without it, or with an unsafe path).
    It always says what was read: ``files`` (how many files the setting matched; attempts' logs for
    "log") and ``rows``; ``final`` and ``best`` are null when no row has the metric."""
    metrics = run.metrics
    if not metrics:
        return None
    metric = run.metric or "val_acc"
    mode = "min" if run.mode == "min" else "max"
    if metrics == "log":
        sources = log_sources(job_dir, run, attempt)
        files, source = sum(1 for rows in sources if rows), "log"
    else:
        globs = safe_globs([metrics])
        if not globs:
            return None
        sources, files = file_sources(job_dir, globs[0], attempt)
        source = P.RUN_DIR + "/" + globs[0]
    rows = merge_runs(sources)
    out = summarize(rows, metric, mode) or {"metric": metric, "mode": mode, "final": None, "best": None,
                                            "steps": 0, "rows": len(rows)}
    out["source"] = source
    out["files"] = files
    out["curves"] = curves(rows, metric)
    return out


def _last(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> float | None:
    for row in reversed(rows):
        for key in keys:
            v = number(row.get(key))
            if v is not None and math.isfinite(v):
                return v
    return None


def metrics_progress(job_dir: str, run: RunSection, attempt: int, rows_too: bool = True,
                     tail: int = 64 * 1024) -> tuple[float | None, dict[str, Any] | None]:
    """For the status probe of a running job whose ``metrics`` names files: (the newest mtime among
    them, a sign of life; with ``rows_too``, progress from the newest file's last rows: step, epoch,
    loss).  Bounded: one capped walk and the newest file's header and last ``tail`` bytes."""
    metrics = run.metrics
    globs = safe_globs([metrics]) if metrics and metrics != "log" else []
    if not globs:
        return None, None
    files = metrics_files(job_dir, globs[0], attempt)
    if not files:
        return None, None
    rel, newest = files[-1]
    if not rows_too:
        return newest, None
    try:
        rows, _ = _file_rows(os.path.join(job_dir, P.RUN_DIR, rel), rel, tail)
    except OSError:
        return newest, None
    step = _last(rows, _STEP_KEYS)
    epoch = _last(rows, ("epoch",))
    loss_keys = tuple(k for k in ("train_loss", "loss", "train/loss", "train_loss_step", "train_loss_epoch")
                      if any(k in r for r in rows))
    loss = _last(rows, loss_keys) if loss_keys else None
    if step is None and epoch is None:
        return newest, None
    return newest, {"step": None if step is None else int(step), "epoch": None if epoch is None else int(epoch),
                      "loss": loss, "source": "metrics"}
