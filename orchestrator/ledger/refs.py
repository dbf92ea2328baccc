"""Job references as users type them: a job id, a unique id prefix (>= 4 characters),
``SWEEP:NAME``, or a bare NAME, which means that job of the newest sweep that has one.

Which job a bare name picked is said in ``JobRef.note`` when other sweeps have a job of that name.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func
from sqlmodel import Session, col, select

from orchestrator.core.errors import JobNotFound
from orchestrator.ledger.tables import Job, Sweep

MIN_PREFIX = 4


@dataclass(frozen=True)
class JobRef:
    job: Job
    note: str = ""  # a bare name that several sweeps use: which sweep's job this is


def resolve_job(s: Session, ref: str) -> JobRef:
    """The job ``ref`` names (see the module doc); JobNotFound (exit 2) when none or several match."""
    if ":" in ref:
        sweep_ref, name = ref.split(":", 1)
        found = list(s.exec(select(Job).where(col(Job.sweep_id).startswith(sweep_ref, autoescape=True),
                                              func.lower(Job.name) == name.casefold())))
        if len(found) == 1:
            return JobRef(found[0])
        if not found:
            raise JobNotFound(f"no job matches {ref!r}; `gpuq status --all` lists sweeps and job names")
        raise JobNotFound(f"job reference {ref!r} is ambiguous: sweep prefix {sweep_ref!r} matches "
                          f"{', '.join(sorted(j.sweep_id for j in found)[:5])}; give more of the sweep id")
    exact = s.get(Job, ref)
    if exact is not None:
        return JobRef(exact)
    named = list(s.exec(select(Job, Sweep.created_at).join(Sweep, col(Sweep.id) == col(Job.sweep_id))
                        .where(func.lower(Job.name) == ref.casefold())
                        .order_by(col(Sweep.created_at).desc(), col(Sweep.id).desc())))
    if named:
        job = named[0][0]
        others = [j.sweep_id for j, _ in named[1:]]
        note = ""
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            note = (f"{ref!r} is job {job.id} of the newest sweep {job.sweep_id} (also in {shown}; "
                    f"give SWEEP:{job.name} for another)")
        return JobRef(job, note)
    if len(ref) < MIN_PREFIX:
        raise JobNotFound(f"no job is named {ref!r}, and {ref!r} is too short for an id prefix: "
                          f"give at least {MIN_PREFIX} characters; `gpuq status --all` lists jobs")
    found = list(s.exec(select(Job).where(col(Job.id).startswith(ref, autoescape=True)).limit(6)))
    if len(found) == 1:
        return JobRef(found[0])
    if not found:
        raise JobNotFound(f"no job matches {ref!r} (an id, id prefix, name or SWEEP:NAME); "
                          "`gpuq status --all` lists jobs")
    ids = ", ".join(sorted(j.id for j in found)[:5])
    raise JobNotFound(f"job reference {ref!r} is ambiguous ({ids}); give more characters")
