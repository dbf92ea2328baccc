"""One job as ``gpuq status``, ``gpuq wait --json`` and the live dashboard show it: ``JobView``.

Derived from a ``Snapshot`` at ``now``: where the job runs (host and slots), its progress, ETA,
heartbeat age and what it cost so far (``orchestrator/money/cost.py``: the one cost policy, the price each
attempt fixed when it started).  Every string taken from a host is printable (``views/text.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.core.states import JobState
from orchestrator.health import observed
from orchestrator.money.cost import money_spent
from orchestrator.views.text import duration, printable

if TYPE_CHECKING:
    from orchestrator.api import Snapshot
    from orchestrator.host_documents import JobEntry, StatusDocument
    from orchestrator.ledger import Attempt, Job


@dataclass(frozen=True)
class JobView:
    """What a person (or a script) wants to know about one job, derived from a Snapshot at ``now``."""

    job: Job
    attempt: Attempt | None
    host_gpus: list[int]  # slots (GPU indices, or CPU slot ids) the running attempt holds on its host
    fraction: float | None  # share of the steps done, 0..1 (None: no step reported yet)
    eta_s: float | None  # seconds to the last step at the current step rate
    heartbeat_age_s: float | None  # None for finished jobs and jobs without a heartbeat
    cost: float | None  # money spent so far (cost.money_spent); None: no attempt on a priced host
    note: str = ""  # a trainer without a heartbeat: elapsed time and its last log line (plain text)
    waiting: str = ""  # a job placed but not started: Slurm's state and reason ("Slurm job 41 PENDING (Priority)")
    nodes: str = ""  # the Slurm nodes a running job has ("gpu-[01-02]"), or a multi-node job's other SSH hosts
    epochs: int | None = None  # the job's epochs, else the total its progress regex reports; None: unknown

    @property
    def where(self) -> str:
        """``host:slots`` ("g1:0,1"), the bare host when the slots are unknown, "-" when unplaced."""
        if not self.job.host:
            return "-"
        if not self.host_gpus:
            return f"{self.job.host}:{self.nodes}" if self.nodes else self.job.host
        where = f"{self.job.host}:{','.join(str(i) for i in self.host_gpus)}"
        return f"{where}+{self.nodes}" if self.nodes else where  # a multi-node job's other hosts

    @property
    def progress(self) -> str:
        """``ep 3/6 step 120/240``, or "-" before the first heartbeat; no total that nothing gave
        (``ep 3 step 120``, ``step 120``)."""
        att = self.attempt
        if att is None or att.step is None:
            return "-"
        total = f"/{att.total_steps}" if att.total_steps else ""
        of = f"/{self.epochs}" if self.epochs else ""
        if att.epoch is None and not of:
            return f"step {att.step}{total}"
        epoch = "?" if att.epoch is None else str(att.epoch)
        return f"ep {epoch}{of} step {att.step}{total}"


def agent_entries(snap: Snapshot) -> dict[tuple[str, str], JobEntry]:
    """The host agents' job entries by (host, job id), from this tick's status documents."""
    entries: dict[tuple[str, str], JobEntry] = {}
    for name, probe in snap.probes.items():
        if probe.ok and probe.doc is not None:
            for entry in probe.doc.jobs:
                if entry.job_id:
                    entries[(name, entry.job_id)] = entry
    return entries


def slot_jobs(doc: StatusDocument | None) -> dict[int, str]:
    """Slot index -> id of the job whose attempt runs on it, from one host's status document."""
    held: dict[int, str] = {}
    for entry in doc.jobs if doc is not None else []:
        if entry.state == "running":
            for slot in entry.slots or []:
                held[slot] = entry.job_id
    return held


def eta_seconds(att: Attempt | None, steps_per_s: float | None) -> float | None:
    """Seconds to the last step at ``steps_per_s`` (the trainer's recent rate), else at the
    attempt's mean rate when it started from step 0; None ("-") when neither is known, and before
    the first step is done (a rate then measures the startup, not training)."""
    if att is None or att.step is None or att.step <= 0 or not att.total_steps:
        return None
    rate = steps_per_s if steps_per_s and steps_per_s > 0 else None
    if rate is None and not att.resume_from and att.started_at and att.heartbeat_at and att.step > 0:
        elapsed = att.heartbeat_at - att.started_at
        rate = att.step / elapsed if elapsed > 0 else None
    if rate is None:
        return None
    return max(0.0, (att.total_steps - att.step) / rate)


def job_views(snap: Snapshot, now: float | None = None) -> list[JobView]:
    now = snap.generated_at if now is None else now
    entries = agent_entries(snap)
    history: dict[str, list[Attempt]] = snap.attempt_history  # every attempt of each job (cost adds them up)
    views = []
    for job in snap.jobs:
        att = snap.attempts.get(job.id)
        entry = entries.get((job.host or "", job.id))
        attempts = history.get(job.id) or ([att] if att is not None else [])
        views.append(_job_view(job, att, entry, attempts, now))
    return views


def _job_view(job: Job, att: Attempt | None, entry: JobEntry | None, attempts: Sequence[Attempt],
              now: float) -> JobView:
    slots = list(entry.slots or []) if entry is not None and entry.state == "running" else []
    fraction = None
    if job.state == JobState.SUCCEEDED.value:
        fraction = 1.0
    elif att is not None and att.step is not None and att.total_steps:
        fraction = min(1.0, max(0.0, att.step / att.total_steps))
    heartbeat = entry.beat if entry is not None else None
    rate = heartbeat.steps_per_s if heartbeat is not None else None
    running = job.state == JobState.RUNNING.value
    note = ""
    if running and heartbeat is None and entry is not None:  # a project's own trainer: what its log says
        fraction = fraction if fraction is not None else observed.progress_fraction(entry)
        since = observed.elapsed_s(entry, att.started_at if att is not None else None, now)
        note = " ".join(x for x in (duration(since) if since is not None else "", observed.last_line(entry)) if x)
    if job.reused_from:  # the result cache: never ran
        note = f"reused the verified results of {job.reused_from} (not run)"
    waiting = observed.slurm_wait(entry) if entry is not None and job.state == JobState.ASSIGNED.value else ""
    slurm = entry.slurm if entry is not None else None
    nodes = printable(slurm.nodes)[:60] if slurm is not None and running else ""
    terminal = JobState(job.state).terminal
    if att is not None and att.nodes and not terminal:  # a multi-node job over SSH hosts
        nodes = "+".join(att.node_hosts()[1:])
    told = entry.progress.epochs if entry is not None and entry.progress is not None else None
    hb_age = None if terminal or att is None or att.heartbeat_at is None else max(0.0, now - att.heartbeat_at)
    return JobView(
        job=job, attempt=att, host_gpus=slots, fraction=fraction,
        eta_s=eta_seconds(att, rate) if running else None,
        heartbeat_age_s=hb_age, cost=money_spent(attempts, now), note=printable(waiting or note),
        waiting=printable(waiting), nodes=nodes, epochs=job.epochs or told or None,
    )
