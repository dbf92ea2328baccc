"""Admission: which claimed or queued job starts next, and on which slots.  Pure: no I/O, no clock.

The serving loop (gpuq_serve.py) gathers what a round decides from -- every candidate in its order
(the jobs claimed but never launched, then the inbox oldest first), the slots each asks for, why the
host could never run it, another attempt of the same job still alive here -- and the free slots, calls
``admit`` and acts on its decisions, in order:

* a job the host can never run (``unfit``: not a JSON object, an unknown or newer spec schema; or more
  slots than the host has) fails;
* a job that does not fit in the slots still free waits, and a smaller job behind it may backfill;
* a job that fits waits while another attempt of it is alive here (one job, one run);
* otherwise it starts on the lowest free slots, which are no longer free for the jobs after it.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import spec_major, spec_slots

START = "start"
WAIT = "wait"
FAIL = "fail"


@dataclass(frozen=True)
class Candidate:
    """One job a round may start: ``need`` slots; ``unfit``: why no host like this one can run its spec
    ("" when one can); ``alive``: the number of another attempt of the job still alive on this host."""

    job_id: str
    need: int = 1
    unfit: str = ""
    alive: int | None = None


@dataclass(frozen=True)
class Decision:
    """What the loop does with one candidate: START on ``slots``, WAIT (``alive``: for that attempt to
    end; None: for room), or FAIL with ``why``."""

    job_id: str
    action: str
    slots: tuple[int, ...] = ()
    why: str = ""
    alive: int | None = None


def too_big(need: int, total: int, kind: str) -> str:
    return "job needs %d slots and the host has %d (%s)" % (need, total, kind)


def spec_unfit(spec: Any) -> str:
    """Why this agent can never run the spec, whatever its slots ("" when it can)."""
    if not isinstance(spec, dict):
        return "job spec is not a JSON object"
    major = spec_major(spec.get("schema"))
    if major is None:
        return "job spec has no valid schema (%r); this agent reads %s" % (spec.get("schema"), P.SPEC_SCHEMA)
    if major > (spec_major(P.SPEC_SCHEMA) or 1):
        return "job spec schema %s is newer than this agent (%s); upgrade the bundle" % (
            spec.get("schema"), P.SPEC_SCHEMA)
    return ""


def candidate(job_id: str, spec: Any, unfit: str = "") -> Candidate:
    """The candidate a spec makes; its ``alive`` attempt is the loop's to look up, for a job ``admit``
    would start (gpuq_serve.py), never for every waiting one."""
    return Candidate(job_id, 1 if unfit else spec_slots(spec), unfit)


def admit(candidates: Sequence[Candidate], free: Sequence[int], total: int, kind: str) -> list[Decision]:
    """One decision per candidate, in their order, packing the starts onto ``free`` (slot ids, lowest
    first) of a host with ``total`` slots of ``kind``."""
    left = list(free)
    out: list[Decision] = []
    for c in candidates:
        if c.unfit or c.need > total:
            out.append(Decision(c.job_id, FAIL, why=c.unfit or too_big(c.need, total, kind)))
        elif c.need > len(left):
            out.append(Decision(c.job_id, WAIT))
        elif c.alive is not None:
            out.append(Decision(c.job_id, WAIT, alive=c.alive))
        else:
            out.append(Decision(c.job_id, START, tuple(left[:c.need])))
            left = left[c.need:]
    return out
