"""Failure classes (docs/health.md, "Failure classes and retries"): every class, whether gpuq retries it,
and the classification of an ended attempt by the evidence ``verdicts.classify`` does not weigh itself.

On top of ``verdicts.classify`` (exit codes, stops and kills, the older signatures), the first match wins:

- ``checkpoint_mismatch``: the log scan's ``state_dict`` signature ("Missing key(s) in state_dict",
  "Unexpected key(s) in state_dict", "size mismatch for ...: copying a param"): the checkpoint was saved
  by another model config.  Never retried.
- ``shm_exhausted``: a DataLoader worker's Bus error, torch's "unable to allocate shared memory(shm)" /
  "unable to write to file </torch_...>", "No space left on device" about /dev/shm, NCCL's shared
  memory segment: /dev/shm is too small, not the data disk.  Never retried.
- ``host_oom``: torch's "DefaultCPUAllocator: can't allocate memory" (retried with resume, as host_oom is).
- a torchrun job is classed by its first failing rank's exception (the scan's ``rank_failed`` root cause,
  else the traceback's last line), its ``[rankN]:`` prefix removed; unless that exception only says the
  rank lost a peer that died of a signal (torchrun dates failures to the second, so the survivor can
  be named first): then the death decides, ``killed``.

A crash retried with resume (``transient``) whose exception line is the same as the attempt before's
is not retried again: the history says so (``decide``).  The fix a person reads for each class is
``orchestrator/health/hints.py``'s; a class never retried names it in its settling decision.

Pure functions; the tick reads the ledger and passes what they need.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator.health import stops, verdicts
from orchestrator.health.hints import HINTS
from orchestrator.host_documents import ScanHit

# "with_resume" within retries=; "once" (one retry at most); "never" (FAILED); "not_automatic" (FAILED: a
# person decides)
Retry = Literal["with_resume", "once", "never", "not_automatic"]
MAX_EXCEPTION_CHARS = 300


@dataclass(frozen=True)
class FailureClass:
    name: str
    retry: Retry
    interruption: bool  # ended from outside (a signal, a stop, a vanished group, a stall kill), not by its code


CLASSES: tuple[FailureClass, ...] = (
    FailureClass("stopped", "with_resume", True),
    FailureClass("config", "never", False),
    FailureClass("checkpoint_mismatch", "never", False),
    FailureClass("shm_exhausted", "never", False),
    FailureClass("transient", "with_resume", False),
    FailureClass("control_plane", "not_automatic", False),
    FailureClass("divergence", "never", False),
    FailureClass("gpu_oom", "not_automatic", False),
    FailureClass("disk_full", "not_automatic", False),
    FailureClass("host_oom", "with_resume", True),
    FailureClass("killed", "with_resume", True),
    FailureClass("vanished", "with_resume", True),
    FailureClass("stalled", "with_resume", True),
    FailureClass(verdicts.DEADLOCK_AT_START, "once", True),
    FailureClass("unknown", "not_automatic", False),
)
BY_NAME = {c.name: c for c in CLASSES}
NAMES = tuple(c.name for c in CLASSES)

NEVER_RETRIED = frozenset({"checkpoint_mismatch", "shm_exhausted"})  # this module's; verdicts.decide: the rest

# an exception's line, as Python prints it last in a traceback (the agent's gpuq_scan.EXCEPTION_LINE)
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|KeyError|StopIteration)\b")
# a rank's error that only says it lost a peer (gloo's, NCCL's): never the first failure when a peer was killed
LOST_PEER = re.compile(r"Connection (?:reset|closed) by peer|NCCL error|remote process exited|DistNetworkError"
                       r"|Socket Timeout|Broken pipe")
# what wraps an exception without being it: torchrun's own
LAUNCHER_EXCEPTIONS = re.compile(r"^(?:[\w.]+\.)?(ChildFailedError)\b")
RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
ROOT_CAUSE_PREFIX = re.compile(r"^root cause: rank (\d+): ")
FINDING_PREFIX = re.compile(r"^.*? a\d+: ")  # a crash finding's "NAME aN: " (earlier ticks' hits carry it)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"\d+")


def _ranked(line: str) -> tuple[str, str]:
    """(the rank that said it, "" when none says; the exception line ``line`` holds, "" when none), the
    prefixes around it removed: a crash finding's "NAME aN: ", torchrun's root cause, a rank's."""
    text, rank = line.strip(), ""
    for _ in range(3):
        for prefix in (ROOT_CAUSE_PREFIX, RANK_PREFIX):
            found = prefix.match(text)
            if found is not None:
                rank, text = rank or found.group(1), text[found.end():]
        if EXCEPTION_LINE.match(text):
            return rank, text[:MAX_EXCEPTION_CHARS]
        shorter = FINDING_PREFIX.sub("", text, count=1)
        if shorter == text:
            return rank, ""
        text = shorter
    return rank, ""


def exception_in(line: str) -> str:
    """The exception line ``line`` holds (a traceback's last line, a crash finding's, torchrun's root
    cause), without the prefixes around it; "" when it holds none."""
    return _ranked(line)[1]


def exception_line(hits: Sequence[ScanHit], traceback: Sequence[str] = ()) -> str:
    """The exception that ended the attempt: torchrun's first failing rank's (its root cause, or that
    rank's traceback, this tick's or an earlier one's), else the traceback's last line, else the first
    traceback hit naming one (torchrun's own ChildFailedError only when nothing else does); "" when none."""
    last = next((line for line in reversed(traceback) if line.strip()), "")
    lines = [last, *(h.line for h in hits if h.signature == "traceback")]
    for hit in hits:
        if hit.signature != stops.RANK_FAILED:
            continue
        rank, found = _ranked(hit.line)
        if found:
            return found
        by_rank = [said for said_rank, said in map(_ranked, lines) if said and rank and said_rank == rank]
        if by_rank:
            return by_rank[0]
    said = [found for found in map(exception_in, lines) if found]
    return next((found for found in said if not LAUNCHER_EXCEPTIONS.match(found)), said[0] if said else "")


def same_exception(a: str, b: str) -> bool:
    """Two exception lines that differ at most in numbers and addresses (pids, ports, sizes): the same."""
    if not a or not b:
        return False
    return _NUMBER.sub("N", _ADDRESS.sub("0x", a)) == _NUMBER.sub("N", _ADDRESS.sub("0x", b))


def classify(exit_code: int | None, trainer_code: int | None, hits: Sequence[ScanHit],
             traceback: Sequence[str] = (), *, oom_kill_rose: bool = False, rebooted: bool = False,
             wrapper_signal: int | None = None) -> str:
    """The failure class of an ended attempt (docs/health.md): ``verdicts.classify``'s, given the first
    failing rank's exception, unless a stop came first or the log names a class of this module."""
    raised = exception_line(hits, traceback)
    if raised and LOST_PEER.search(raised) and any(h.signature == "rank_killed" for h in hits):
        # torchrun dates failures to the second: a rank that lost its killed peer can be named first.  A
        # peer's death is not the survivor's fault: the death decides (stops.outside_class)
        hits = [h for h in hits if h.signature != stops.RANK_FAILED]
    base = verdicts.classify(exit_code, trainer_code, hits, [raised] if raised else traceback,
                           oom_kill_rose=oom_kill_rose, rebooted=rebooted, wrapper_signal=wrapper_signal)
    if base == "stopped":
        return base
    signatures = {h.signature for h in hits}
    if "state_dict" in signatures:
        return "checkpoint_mismatch"
    if "shm_exhausted" in signatures:
        return "shm_exhausted"
    if "cpu_alloc" in signatures:
        return "host_oom"
    return base


def repeat_matters(klass: str) -> bool:
    """Whether an exception repeated from the attempt before stops retries of ``klass``: a crash of the
    job's own that is otherwise retried (not a stop, a kill, a vanished group or a stall)."""
    known = BY_NAME.get(klass)
    return known is not None and known.retry == "with_resume" and not known.interruption


def decide(klass: str, failures: int, retries: int, *, repeated: str = "") -> verdicts.Decision:
    """``verdicts.decide``, and never a retry for this module's classes, nor for a crash whose exception
    (``repeated``) already ended the attempt before."""
    if klass in NEVER_RETRIED:
        return verdicts.Decision("fail", f"{klass}: never retried; {HINTS[klass]}")
    decision = verdicts.decide(klass, failures, retries)
    if repeated and decision.action == "requeue" and repeat_matters(klass):
        return verdicts.Decision("fail", f"{klass}: never retried: the attempt before ended with the same exception, "
                                       f"{repeated} (fix it and submit again)")
    return decision
