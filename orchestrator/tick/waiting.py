"""The dependency gate (``after=``, docs/queue.md): which QUEUED jobs may be placed now.

A job that waits (``Dependency`` rows) is placeable only once every job it waits for has SUCCEEDED; while one
has not ended it stays QUEUED (one event says for what), and when one ended otherwise (FAILED, CANCELLED: a
stopped cell's jobs end so) it is ended CANCELLED, never started, with a reason that names that job.  Ending
one ends its own waiting jobs in the same tick.  ``Gate.needs`` lets the plan see the chains
(``chains.critical_first``): the critical path first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.context import Context
from orchestrator.core.errors import IllegalTransition
from orchestrator.core.states import JobState
from orchestrator.ledger import Dependency, Job

_ENDED_BADLY = (JobState.FAILED.value, JobState.CANCELLED.value)


@dataclass(frozen=True)
class Gate:
    """The QUEUED jobs split: ``ready`` to place, ``waiting`` (each with the edges it still waits on)."""

    ready: list[Job]
    waiting: list[Job] = field(default_factory=list)
    needs: Mapping[str, list[str]] = field(default_factory=dict)  # every job id -> the job ids it waits for


def gate(ctx: Context, queued: Sequence[Job]) -> Gate:
    """Split ``queued`` (see the module docstring), ending the jobs whose dependency ended otherwise."""
    edges = ctx.ledger.dependencies(j.id for j in queued)
    if not edges:
        return Gate(list(queued))
    wanted = {e.needs_id for found in edges.values() for e in found}
    states = {j.id: (j.state, j) for j in ctx.ledger.jobs_by_ids(wanted)}
    needs = {job_id: [e.needs_id for e in found] for job_id, found in edges.items()}
    ended: set[str] = set()
    changed = True
    while changed:  # a job ended here ends the jobs that wait on it in the same tick
        changed = False
        for job in queued:
            if job.id in ended or job.id not in edges:
                continue
            bad = next((e for e in edges[job.id] if e.needs_id in ended
                        or states.get(e.needs_id, ("", None))[0] in _ENDED_BADLY), None)
            if bad is not None and _end(ctx, job, bad, states):
                ended.add(job.id)
                states[job.id] = (JobState.CANCELLED.value, job)
                changed = True
    ready: list[Job] = []
    waiting: list[Job] = []
    for job in queued:
        if job.id in ended:
            continue
        pending = [e for e in edges.get(job.id, [])
                   if states.get(e.needs_id, ("", None))[0] != JobState.SUCCEEDED.value]
        if not pending:
            ready.append(job)
            continue
        waiting.append(job)
        words = ", ".join(f"{_named(e, states)} ({states.get(e.needs_id, ('unknown', None))[0]})" for e in pending)
        ctx.ledger.record_event("job", job.id, f"still queued: waits for {words} (after=)", unless_repeated=True)
    return Gate(ready, waiting, needs)


def _named(edge: Dependency, states: Mapping[str, tuple[str, Job | None]]) -> str:
    dep = states.get(edge.needs_id, ("", None))[1]
    return f"{dep.name} {dep.id}" if dep is not None else edge.needs_id


def _end(ctx: Context, job: Job, edge: Dependency, states: Mapping[str, tuple[str, Job | None]]) -> bool:
    state = states.get(edge.needs_id, ("", None))[0] or JobState.CANCELLED.value
    reason = (f"not started: it waits for {_named(edge, states)} (after={edge.via}), which ended {state}; "
              "a job starts only after what it waits for SUCCEEDED")
    try:
        ctx.ledger.transition(job.id, JobState.CANCELLED, message=reason)
    except IllegalTransition:
        return False  # another command started or ended it meanwhile
    return True
