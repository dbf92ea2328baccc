"""Admission: which claimed or queued job starts next, and on which slots.  Pure: no I/O, no clock.

The serving loop (gpuq_serve.py) gathers what a round decides from -- every candidate in its order
(the jobs claimed but never launched, then the inbox oldest first), the slots each asks for, why the
host could never run it, another attempt of the same job still alive here -- and the free slots, calls
``admit`` and acts on its decisions, in order:

* a job the host can never run (``unfit``: a spec the parser refused -- not a JSON object, an unknown
  or newer schema, a field missing or wrong, gpuq_jobspec.parse_spec --; or more slots than the host
  has) fails;
* a job that does not fit in the slots still free waits, and a smaller job behind it may backfill;
* a job that fits waits while another attempt of it is alive here (one job, one run);
* otherwise it starts on the lowest free slots, which are no longer free for the jobs after it.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from gpuq_base.gpuq_jobspec import JobSpec

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


# a spec as the loop holds it: parsed, or the reason the parser refused its document
# (gpuq_jobspec.spec_or_reason); Union, not |: this alias is evaluated at run time on Python 3.8
Parsed = Union[JobSpec, str]


def spec_unfit(spec: Parsed) -> str:
    """Why this agent can never run the spec, whatever its slots ("" when it can): the parser's reason
    for a document it refused (not a JSON object, no or a newer schema, a field missing or wrong)."""
    return "" if isinstance(spec, JobSpec) else spec


def candidate(job_id: str, spec: Parsed) -> Candidate:
    """The candidate a spec makes; its ``alive`` attempt is the loop's to look up, for a job ``admit``
    would start (gpuq_serve.py), never for every waiting one."""
    if isinstance(spec, JobSpec):
        return Candidate(job_id, spec.slots)
    return Candidate(job_id, 1, spec_unfit(spec))


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
