"""Incremental scans for the patrol (docs/health.md): crash signatures in an attempt's own
``job.log`` and non-finite losses in ``result/metrics.jsonl``, each only in the bytes added since
the offset the controller stored at the previous tick.  Read-only: the probe writes nothing.

The controller asks with ``status --json --scan JOB_ID:ATTEMPT:LOG_OFFSET:METRICS_OFFSET``; each
scanned job's status entry then carries::

    "scan": {"attempt", "log_from", "log_to", "log_skipped", "hits": [{"signature", "line"}],
             "traceback": [up to 50 lines of the first new traceback: torchrun's root-cause rank's when
                           its report names one],
             "resumed": {"step", "epoch", "sha256"} (only when a GPUQ_RESUMED line is among the new bytes),
             "from_scratch": "why" (only when the wrapper's "restarted from scratch" line is among them),
             "metrics_to", "nonfinite": [{"step", "epoch", "kind", "field", "value"}]}

A traceback's hit carries its exception line (``[rank1]: AttributeError: ...``), not its header: the
alert shows what went wrong.  Ranks' lines (``[rank1]: ``, ``[default1]:``) are followed per rank, so
interleaved tracebacks of two ranks stay apart.  torchrun's "Root Cause (first observed failure)"
report becomes the first hit: ``rank_failed`` when that rank exited with a code of its own (an
exception: the SIGTERMs torchrun then sent the other ranks are not a stop), ``rank_killed`` /
``rank_terminated`` when it died of a signal (docs/health.md).

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

from gpuq_base.gpuq_lazyre import lazy
from gpuq_base import gpuq_protocol as P

MAX_SCAN_BYTES = 4 * 1024 * 1024  # per file per tick; more new bytes than this: scan the newest part
MAX_HITS = 20
MAX_TRACEBACK_LINES = 50
MAX_NONFINITE = 20
MAX_TRACEBACKS = 16  # followed per log chunk (ranks interleave theirs)
MAX_ROOT_CAUSE_LINES = 12

# (name, pattern): specific on purpose, never a bare "Error" (docs/health.md)
SIGNATURES = (
    ("traceback", lazy(r"Traceback \(most recent call last\)")),
    ("cuda_oom", lazy(r"CUDA out of memory|OutOfMemoryError")),
    # /dev/shm too small for the DataLoader's workers (or NCCL's segments): before disk_full, whose
    # "No space left on device" torch's shared-memory allocation also says
    ("shm_exhausted", lazy(r"is killed by signal: Bus error|Unexpected bus error encountered in worker"
                                 r"|insufficient shared memory \(shm\)"
                                 r"|unable to (?:write to|allocate shared memory\(shm\) for) file </torch_"
                                 r"|No space left on device.{0,80}/dev/shm|/dev/shm\S*.{0,80}No space left on device"
                                 r"|Error while creating shared memory segment /dev/shm/")),
    ("cpu_alloc", lazy(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)")),
    ("disk_full", lazy(r"No space left on device|basic_ios::clear: iostream error|unexpected pos")),
    ("killed", lazy(r"^Killed$")),
    ("segfault", lazy(r"Segmentation fault")),
    ("illegal_memory", lazy(r"an illegal memory access")),
    ("nccl", lazy(r"NCCL error|Watchdog caught collective operation timeout")),
    ("child_failed", lazy(r"ChildFailedError")),
    # torchrun's report of a rank that died of a signal: SIGTERM/SIGINT (a stop) apart from the rest
    ("rank_terminated", lazy(r"Signal (?:15|2) \(SIG(?:TERM|INT)\) received by PID"
                                   r"|failed \(exitcode: -(?:15|2)\) local_rank")),
    ("rank_killed", lazy(r"Signal \d+ \(SIG(?!TERM\)|INT\))\w+\) received by PID"
                               r"|failed \(exitcode: -(?!15\)|2\))\d+\) local_rank")),
    ("torn_checkpoint", lazy(r"PytorchStreamReader failed reading zip archive")),
    # a checkpoint saved by another model config (torch's load_state_dict, strict)
    ("state_dict", lazy(r"(?:Missing|Unexpected) key\(s\) in state_dict|size mismatch for \S+: copying a param")),
    ("nonfinite_loss", lazy(r"loss\s*[:=]\s*[-+]?(nan|inf)\b", re.IGNORECASE)),
)
# the last line of a traceback names the exception: the patrol classifies by it
STOPPED = lazy(r"\b(SignalException|KeyboardInterrupt)\b")
# the wrapper's own line when a retry found no checkpoint to pass (gpuq_launch.resume_note)
FROM_SCRATCH = lazy(r"^gpuq: restarted from scratch: (.{0,300})")
RESUMED = lazy(r"GPUQ_RESUMED step=(\d+)(?: epoch=(\d+))?(?: sha256=([0-9a-f]+))?")
# a rank's line under torchrun (``[rank1]: ...``) or its --tee/--log-dir form (``[default1]:...``)
RANK_PREFIX = lazy(r"^\[(rank|default)(\d+)\]:\s?")
ORIGINAL_TRACEBACK = lazy(r"^Original Traceback \(most recent call last\):")
ROOT_CAUSE = lazy(r"^Root Cause \(first observed failure\):")
ROOT_FIELD = lazy(r"^\s+(rank|exitcode|traceback)\s*:\s?(.*)$")
RANK_FIELD = lazy(r"^(\d+)\b")
EXITCODE_FIELD = lazy(r"^(-?\d+)\b")
EXCEPTION_LINE = lazy(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|KeyError|StopIteration)\b")


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


class _Traceback:
    """One traceback being read: its ``prefix`` (a rank's ``[rank1]: ``, "" for none), its lines, its
    exception line (the prefix removed) and the hit that announced it."""

    def __init__(self, prefix: str, hit: dict[str, str] | None) -> None:
        self.prefix = prefix
        self.hit = hit
        self.lines: list[str] = []
        self.exception = ""
        self.ended = False  # the exception line was read; "Original Traceback" may still continue it

    @property
    def rank(self) -> str:
        found = RANK_PREFIX.match(self.prefix)
        return found.group(2) if found else ""


def _root_cause(lines: list[str]) -> dict[str, str]:
    """The fields of torchrun's "Root Cause (first observed failure)" block: rank, exitcode, traceback."""
    out: dict[str, str] = {}
    for line in lines:
        field = ROOT_FIELD.match(line)
        if field is not None and field.group(1) not in out:
            out[field.group(1)] = field.group(2).strip()[:300]
    return out


def _root_cause_hit(cause: dict[str, str], tracebacks: list[_Traceback]) -> tuple[dict[str, str], str] | None:
    """(the hit, the rank) for torchrun's root cause: ``rank_failed`` with the rank's exception line when it
    exited with a code of its own, ``rank_killed``/``rank_terminated`` when a signal ended it."""
    rank = RANK_FIELD.match(cause.get("rank", ""))
    code = EXITCODE_FIELD.match(cause.get("exitcode", ""))
    if rank is None or code is None:
        return None
    number, exitcode = rank.group(1), int(code.group(1))
    said = cause.get("traceback", "")
    if exitcode < 0:
        name = "rank_terminated" if -exitcode in (2, 15) else "rank_killed"
        return {"signature": name, "line": f"root cause: rank {number}: {said or f'exitcode {exitcode}'}"}, number
    if exitcode == 0:
        return None
    raised = next((tb.exception for tb in tracebacks if tb.rank == number and tb.exception), "")
    if not raised and said and not said.startswith("To enable traceback"):
        raised = said
    return {"signature": "rank_failed",
            "line": f"root cause: rank {number}: {raised or f'exitcode {exitcode}'}"[:400]}, number


def scan_log(path: str, offset: int) -> dict[str, Any]:
    data, start, end, skipped = _whole_lines(path, offset)
    scan = _LogScan()
    for raw in data.decode("utf-8", "replace").splitlines():
        scan.read(raw.rstrip("\r"))
    hits, chosen = scan.verdict()
    out: dict[str, Any] = {"log_from": start, "log_to": end, "log_skipped": skipped, "hits": hits,
                           "traceback": chosen.lines if chosen is not None else []}
    if scan.resumed is not None:
        out["resumed"] = scan.resumed  # the payload's proof of what it loaded (docs/checkpoints.md)
    if scan.scratch is not None:
        out["from_scratch"] = scan.scratch  # a retry that found no checkpoint to resume from
    return out


def _whole_lines(path: str, offset: int) -> tuple[bytes, int, int, int]:
    """``_read_from`` up to the last newline: a half-written line is left for the next tick."""
    data, start, end, skipped = _read_from(path, offset)
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        end = start + cut
        data = data[:cut]
    return data, start, end, skipped


class _LogScan:
    """One log chunk read line by line: the first resume and from-scratch markers, torchrun's first
    root-cause block, each rank's tracebacks, the signature hits."""

    def __init__(self) -> None:
        self.hits: list[dict[str, str]] = []
        self.tracebacks: list[_Traceback] = []  # in the order they began, at most MAX_TRACEBACKS
        self.reading: dict[str, _Traceback] = {}  # prefix -> the traceback of that rank still being read
        self.resumed: dict[str, Any] | None = None
        self.scratch: str | None = None
        self.cause_lines: list[str] = []  # torchrun's root-cause block
        self.cause_open = False

    def read(self, line: str) -> None:
        """Take one line through each step: markers, the root-cause block, its rank's traceback, signatures."""
        self._markers(line)
        self._root_cause_block(line)
        prefixed = RANK_PREFIX.match(line)
        prefix = prefixed.group(0) if prefixed else ""
        tb, reopened = self._follow(line, prefix)
        if not reopened:
            self._signatures(line, prefix, tb)

    def _markers(self, line: str) -> None:
        """The payload's GPUQ_RESUMED line and the wrapper's "restarted from scratch" line: the first of each."""
        marker = RESUMED.search(line) if self.resumed is None else None
        if marker is not None:
            self.resumed = {"step": int(marker.group(1)),
                            "epoch": int(marker.group(2)) if marker.group(2) is not None else None,
                            "sha256": marker.group(3)}
        fresh = FROM_SCRATCH.match(line) if self.scratch is None else None
        if fresh is not None:
            self.scratch = fresh.group(1)

    def _root_cause_block(self, line: str) -> None:
        """Whether ``line`` opens, continues or closes torchrun's first root-cause report in these bytes."""
        if self.cause_open and (line.startswith("===") or len(self.cause_lines) >= MAX_ROOT_CAUSE_LINES):
            self.cause_open = False
        elif self.cause_open:
            self.cause_lines.append(line)
        elif not self.cause_lines and ROOT_CAUSE.match(line):  # the first report in these bytes
            self.cause_open = True

    def _follow(self, line: str, prefix: str) -> tuple[_Traceback | None, bool]:
        """(the traceback of this line's rank that ``line`` belongs to, or None; True when the line is
        a DataLoader worker's "Original Traceback" reopening one that ended: no signature is looked for)."""
        body = line[len(prefix):]
        tb = self.reading.get(prefix)
        if tb is not None and tb.ended:
            if ORIGINAL_TRACEBACK.match(body.lstrip("\x00")):  # a DataLoader worker's: the cause follows
                tb.ended = False
                tb.lines.append(line[:400])
                return tb, True
            del self.reading[prefix]
            tb = None
        if tb is not None:
            tb.lines.append(line[:400])
            if EXCEPTION_LINE.match(body):
                tb.exception, tb.ended = body.strip()[:400], True
            if len(tb.lines) >= MAX_TRACEBACK_LINES:
                del self.reading[prefix]
        return tb, False

    def _signatures(self, line: str, prefix: str, tb: _Traceback | None) -> None:
        """The first signature ``line`` matches, as a hit (at most MAX_HITS); a traceback header outside
        one being read begins a new traceback of its rank (at most MAX_TRACEBACKS)."""
        for name, pattern in SIGNATURES:
            if pattern.search(line):
                hit = {"signature": name, "line": line.strip()[:400]}
                if len(self.hits) < MAX_HITS:
                    self.hits.append(hit)
                if name == "traceback" and tb is None and len(self.tracebacks) < MAX_TRACEBACKS:
                    begun = _Traceback(prefix, hit)
                    begun.lines.append(line[:400])
                    self.tracebacks.append(begun)
                    self.reading[prefix] = begun
                break

    def verdict(self) -> tuple[list[dict[str, str]], _Traceback | None]:
        """(the hits, the traceback to show): a traceback's hit names its exception, torchrun's root cause
        comes first and picks its rank's traceback, and a traceback ending in a stop signal is no crash."""
        hits, tracebacks = self.hits, self.tracebacks
        for tb in tracebacks:  # the alert shows what went wrong, not "Traceback (most recent call last):"
            if tb.exception and tb.hit is not None:
                tb.hit["line"] = (tb.prefix.strip() + " " + tb.exception).strip()[:400]
        chosen = tracebacks[0] if tracebacks else None
        cause = _root_cause_hit(_root_cause(self.cause_lines), tracebacks) if self.cause_lines else None
        if cause is not None:
            hits.insert(0, cause[0])  # the first failure first; the rest follow
            del hits[MAX_HITS:]
            chosen = next((tb for tb in tracebacks if tb.rank == cause[1]), chosen)
        if tracebacks and STOPPED.search(tracebacks[0].lines[-1]):
            # torchrun's answer to SIGTERM (a preemption, a cancel) is a traceback ending in
            # SignalException: a stop, not a crash
            hits = [dict(h, signature="stopped_by_signal") if h["signature"] == "traceback" else h for h in hits]
            chosen = tracebacks[0]
        return hits, chosen


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
