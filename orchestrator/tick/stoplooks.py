"""A sweep's recorded stopping policy and the stop recorded for a job's cell, in the user's words: read by
the stopping stage (``tick/stopping.py``), by reconcile (a cancel of a stopped cell's job that gpuq did
not live to record ends STOPPED) and by ``gpuq explain``."""

from __future__ import annotations

from pydantic import ValidationError

from orchestrator.ledger import Job, Ledger, StopLook, Sweep
from orchestrator.report.cells import group
from orchestrator.stopping import rules
from orchestrator.stopping.policy import StopPolicy


def policy_of(sweep: Sweep | None) -> StopPolicy | None:
    """The sweep's recorded policy (None: off, or a record this gpuq cannot read: nothing is stopped)."""
    if sweep is None or not sweep.stop:
        return None
    try:
        return StopPolicy.model_validate_json(sweep.stop)
    except ValidationError:
        return None


def reason(look: StopLook) -> str:
    """``gpuq explain``'s words for a stop, from the look's fields."""
    fields = look.model_dump(include=set(rules.Look.model_fields))
    return rules.Look(**fields).reason(look.step)


def decided_stop(ledger: Ledger, job: Job) -> StopLook | None:
    """The recorded stop of ``job``'s cell, if its sweep's policy stopped it (None: none)."""
    if policy_of(ledger.sweep(job.sweep_id)) is None:
        return None
    looks = [look for look in ledger.stop_looks([job.sweep_id]) if look.stop]
    if not looks:
        return None
    for cell, members in group(ledger.jobs(sweep_id=job.sweep_id)).items():
        if any(j.id == job.id for j in members):
            return next((look for look in looks if look.cell == cell), None)
    return None


def headline(look: StopLook) -> str:
    """The few words a report's row shows: "stopped: worse than baseline at step N"."""
    return rules.stop_words(look.rule, look.step)
