"""PURE placement: which host gets which queued job.

``plan`` takes data and returns decisions; no I/O, no clock.  Jobs are placed
longest-estimated-first onto the usable host whose projected queue ends
earliest (LPT), and only onto hosts with at least ``gpus`` slots in total;
a ``host=`` pin is honoured or the job stays unplaced.  The host agent then
packs its inbox onto free slots as they free up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.specs import Assignment, HostSlots


@dataclass(frozen=True)
class PlanJob:
    job_id: str
    gpus: int
    est_s: float
    host_pin: str | None = None


@dataclass(frozen=True)
class Plan:
    assignments: tuple[Assignment, ...]
    unplaced: tuple[tuple[str, str], ...]  # (job_id, reason)


def plan(jobs: Sequence[PlanJob], hosts: Sequence[HostSlots]) -> Plan:
    usable = [h for h in hosts if h.usable and h.total > 0]
    # projected busy slot-seconds per host, normalised by its size
    load = {h.host: float(h.busy) for h in usable}
    size = {h.host: h.total for h in usable}
    out: list[Assignment] = []
    unplaced: list[tuple[str, str]] = []
    for job in sorted(jobs, key=lambda j: (-j.est_s * j.gpus, j.job_id)):
        candidates = [h for h in usable if size[h.host] >= job.gpus]
        if job.host_pin is not None:
            candidates = [h for h in candidates if h.host == job.host_pin]
        if not candidates:
            biggest = max((h.total for h in usable), default=0)
            where = f"host {job.host_pin}" if job.host_pin else "any usable host"
            unplaced.append((job.job_id, f"needs {job.gpus} slots; {where} has at most {biggest}"))
            continue
        best = min(candidates, key=lambda h: (load[h.host] / size[h.host], h.host))
        load[best.host] += job.est_s * job.gpus
        out.append(Assignment(job_id=job.job_id, host=best.host))
    return Plan(tuple(out), tuple(unplaced))
