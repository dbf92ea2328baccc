"""Incremental scans for the patrol (docs/health.md): crash signatures in an attempt's own
``job.log`` and non-finite losses in ``result/metrics.jsonl``, each only in the bytes added since
the offset the controller stored at the previous tick.  Read-only: the probe writes nothing.

The controller asks with ``status --json --scan JOB_ID:ATTEMPT:LOG_OFFSET:METRICS_OFFSET``; each
scanned job's status entry then carries::

    "scan": {"attempt", "log_from", "log_to", "log_skipped", "hits": [{"signature", "line"}],
             "traceback": [up to 50 lines of the first new traceback],
             "resumed": {"step", "epoch", "sha256"} (only when a GPUQ_RESUMED line is among the new bytes),
             "from_scratch": "why" (only when the wrapper's "restarted from scratch" line is among them),
             "metrics_to", "nonfinite": [{"step", "epoch", "kind", "field", "value"}]}

``log_to``/``metrics_to`` are the offsets to store for the next tick.  A log that shrank (rotated,
or a new attempt) is scanned from 0.  A metrics line still being written (no newline yet) is left
for the next tick.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import gpuq_protocol as P

MAX_SCAN_BYTES = 4 * 1024 * 1024  # per file per tick; more new bytes than this: scan the newest part
MAX_HITS = 20
MAX_TRACEBACK_LINES = 50
MAX_NONFINITE = 20

# (name, pattern): specific on purpose, never a bare "Error" (docs/health.md)
SIGNATURES = (
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("cuda_oom", re.compile(r"CUDA out of memory|OutOfMemoryError")),
    ("disk_full", re.compile(r"No space left on device|basic_ios::clear: iostream error|unexpected pos")),
    ("killed", re.compile(r"^Killed$")),
    ("segfault", re.compile(r"Segmentation fault")),
    ("illegal_memory", re.compile(r"an illegal memory access")),
    ("nccl", re.compile(r"NCCL error|Watchdog caught collective operation timeout")),
    ("child_failed", re.compile(r"ChildFailedError")),
    # torchrun's report of a rank that died of a signal: SIGTERM/SIGINT (a stop) apart from the rest
    ("rank_terminated", re.compile(r"Signal (?:15|2) \(SIG(?:TERM|INT)\) received by PID"
                                   r"|failed \(exitcode: -(?:15|2)\) local_rank")),
    ("rank_killed", re.compile(r"Signal \d+ \(SIG(?!TERM\)|INT\))\w+\) received by PID"
                               r"|failed \(exitcode: -(?!15\)|2\))\d+\) local_rank")),
    ("torn_checkpoint", re.compile(r"PytorchStreamReader failed reading zip archive")),
    ("state_dict", re.compile(r"Missing key\(s\) in state_dict")),
    ("nonfinite_loss", re.compile(r"loss\s*[:=]\s*[-+]?(nan|inf)\b", re.IGNORECASE)),
)
# the last line of a traceback names the exception: the patrol classifies by it
STOPPED = re.compile(r"\b(SignalException|KeyboardInterrupt)\b")
# the wrapper's own line when a retry found no checkpoint to pass (gpuq_launch.resume_note)
FROM_SCRATCH = re.compile(r"^gpuq: restarted from scratch: (.{0,300})")
RESUMED = re.compile(r"GPUQ_RESUMED step=(\d+)(?: epoch=(\d+))?(?: sha256=([0-9a-f]+))?")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|KeyError|StopIteration)\b")


def parse_scan_args(values: Any) -> dict[str, tuple[int, int, int]]:
    """``JOB_ID:ATTEMPT:LOG_OFFSET:METRICS_OFFSET`` strings -> {job_id: (attempt, log_off, metrics_off)}."""
    out: dict[str, tuple[int, int, int]] = {}
    for value in values or ():
        parts = str(value).split(":")
        if len(parts) != 4 or not parts[0] or "/" in parts[0]:
            raise ValueError(f"--scan wants JOB_ID:ATTEMPT:LOG_OFFSET:METRICS_OFFSET, got {value!r}")
        out[parts[0]] = (int(parts[1]), max(0, int(parts[2])), max(0, int(parts[3])))
    return out


def _read_from(path: str, offset: int) -> tuple[bytes, int, int, int]:
    """(new bytes, start, end, skipped) of ``path`` after ``offset``; a shrunk file restarts at 0."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return b"", offset, offset, 0
    if size < offset:
        offset = 0
    start, skipped = offset, 0
    if size - start > MAX_SCAN_BYTES:
        skipped = size - MAX_SCAN_BYTES - start
        start = size - MAX_SCAN_BYTES
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return b"", offset, offset, 0
    return data, start, start + len(data), skipped


def scan_log(path: str, offset: int) -> dict[str, Any]:
    data, start, end, skipped = _read_from(path, offset)
    if data and not data.endswith(b"\n"):  # leave a half-written line for the next tick
        cut = data.rfind(b"\n") + 1
        end = start + cut
        data = data[:cut]
    hits: list[dict[str, str]] = []
    traceback: list[str] = []
    resumed: dict[str, Any] | None = None
    scratch: str | None = None
    in_tb = False
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.rstrip("\r")
        marker = RESUMED.search(line) if resumed is None else None
        if marker is not None:
            resumed = {"step": int(marker.group(1)),
                       "epoch": int(marker.group(2)) if marker.group(2) is not None else None,
                       "sha256": marker.group(3)}
        fresh = FROM_SCRATCH.match(line) if scratch is None else None
        if fresh is not None:
            scratch = fresh.group(1)
        if in_tb:
            traceback.append(line[:400])
            if EXCEPTION_LINE.match(line) or len(traceback) >= MAX_TRACEBACK_LINES:
                in_tb = False
        for name, pattern in SIGNATURES:
            if pattern.search(line) and len(hits) < MAX_HITS:
                hits.append({"signature": name, "line": line.strip()[:400]})
                if name == "traceback" and not traceback:
                    traceback.append(line[:400])
                    in_tb = True
                break
    if traceback and STOPPED.search(traceback[-1]):
        # torchrun's answer to SIGTERM (a preemption, a cancel) is a traceback ending in
        # SignalException: a stop, not a crash
        hits = [dict(h, signature="stopped_by_signal") if h["signature"] == "traceback" else h for h in hits]
    out: dict[str, Any] = {"log_from": start, "log_to": end, "log_skipped": skipped, "hits": hits,
                           "traceback": traceback}
    if resumed is not None:
        out["resumed"] = resumed  # the payload's proof of what it loaded (docs/checkpoints.md)
    if scratch is not None:
        out["from_scratch"] = scratch  # a retry that found no checkpoint to resume from
    return out


def _nonfinite(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return not math.isfinite(float(value))
    return isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity",
                                                                 "-infinity")


def scan_metrics(path: str, offset: int) -> dict[str, Any]:
    data, start, _end, _skipped = _read_from(path, offset)
    cut = data.rfind(b"\n") + 1  # only whole lines
    found: list[dict[str, Any]] = []
    for raw in data[:cut].decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(raw)  # Python's json reads NaN / Infinity, as json.dumps writes them
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        for field in ("loss", "val_loss"):
            if field in rec and _nonfinite(rec[field]) and len(found) < MAX_NONFINITE:
                found.append({"step": rec.get("step"), "epoch": rec.get("epoch"), "kind": rec.get("kind"),
                              "field": field, "value": str(rec[field])})
    return {"metrics_to": start + cut, "nonfinite": found}


def scan_job(job_dir: str, attempt: int, log_offset: int, metrics_offset: int) -> dict[str, Any]:
    log = scan_log(os.path.join(job_dir, P.ATTEMPTS_DIR, str(attempt), P.JOB_LOG), log_offset)
    log.update(scan_metrics(os.path.join(job_dir, P.RESULT_DIR, P.METRICS_FILE), metrics_offset))
    log["attempt"] = attempt
    return log
