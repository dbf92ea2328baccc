"""``gpuq results``: one row per job of a sweep, read in one go (every table once for the whole sweep).

The read path without the ORM: ``results`` runs on a ``Context`` or on a ``ReadContext`` (the read-only
``ledger/reader.py`` in one transaction), so what it imports at module level loads neither the ORM nor the
fleet, the providers or any command's JSON models.  Only ``collect_missing`` talks to hosts (and writes
what they say), and only for jobs that finished without metrics; ``missing_metrics`` says whether there is
any such job, so a command can read through the light path when there is none.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.context import Context, ReadContext, gc_paused
from orchestrator.core.errors import GpuqError, JobNotFound
from orchestrator.core.states import JobState
from orchestrator.health import observed
from orchestrator.host_documents import Provenance
from orchestrator.money.cost import LOST_STATES, JobCost, job_cost
from orchestrator.transfer.verify import PULL_VERIFIED

if TYPE_CHECKING:
    from orchestrator.ledger import Attempt, Job
    from orchestrator.ledger.reader import LedgerReader



@dataclass(slots=True)  # one per job: 100,000 of them for a 100,000-job sweep, no dict each
class ResultRow:
    job: Job
    final: dict[str, float]
    best: dict[str, float]  # each metric's own best by its direction (tick.collect.own_bests)
    attempt: Attempt | None
    pulled: str = ""  # "verified" (local copy in local_dir), "missing" (verified, copy gone), "" (not pulled)
    local_dir: str = ""
    cost: JobCost | None = None
    metric: str = observed.DEFAULT_METRIC[0]  # the sweep's headline metric ([run] metric) and its direction
    mode: str = observed.DEFAULT_METRIC[1]
    error: str = ""  # why this job's results could not be read from its host ("" = none failed)
    provenance: Provenance | None = None  # what the newest attempt ran with (None: its host has not said)
    git: tuple[str, bool | None] = ("", None)  # the project's commit at submit and whether it was dirty
    restarts_from_scratch: int = 0  # retries that found no checkpoint and trained again from the start
    best_row: dict[str, float] = field(default_factory=dict)  # every metric in the row where the headline was best
    joined: str = ""  # its part's line when it joined the sweep later (``submit --into``); "" for part 1
    joined_at: float | None = None  # when that part joined


@functools.lru_cache(maxsize=1024)
def ran_with(stored: str) -> Provenance | None:
    """``Provenance.from_stored``, parsed once per distinct text (a sweep's attempts mostly ran with
    the same few; the model is frozen, so rows may share it)."""
    return Provenance.from_stored(stored)


def cpu_slots(ctx: Context | ReadContext) -> Callable[[Attempt], bool]:
    """Whether an attempt ran on CPU slots (its hours are CPU-hours): its provenance says so, else its
    host's slots at the last probe."""
    kinds = {row.name: row.slots_kind for row in ctx.ledger.hosts()}

    def on_cpu(att: Attempt) -> bool:
        ran = ran_with(att.provenance)
        kind = ran.slot_kind if ran is not None and ran.slot_kind else kinds.get(att.host, "")
        return kind == "cpu"
    return on_cpu


def missing_metrics(ledger: LedgerReader, jobs: Sequence[Job]) -> dict[str, list[str]]:
    """{host: its SUCCEEDED jobs the ledger has no metrics of} (the hosts still registered): what
    ``collect_missing`` would ask them for."""
    have = ledger.with_metrics(j.id for j in jobs)
    pending: dict[str, list[str]] = {}
    for job in jobs:
        if job.state == JobState.SUCCEEDED.value and job.id not in have and job.host:
            pending.setdefault(job.host, []).append(job.id)
    return {name: ids for name, ids in pending.items() if ledger.host(name) is not None}


class HostsNeeded(Exception):
    """A verb on a ``ReadContext`` found finished jobs without metrics: it must run on a ``Context``,
    which collects them from their hosts (``collect_missing``).  ``pending``: {host: those jobs}."""

    def __init__(self, pending: dict[str, list[str]]) -> None:
        super().__init__(pending)
        self.pending = pending

    def note(self) -> str:
        """What the command says before it asks the hosts (only those jobs are asked for)."""
        jobs = sum(map(len, self.pending.values()))
        hosts = ", ".join(sorted(self.pending))
        return (f"{jobs} finished job{'s' if jobs != 1 else ''} without metrics in the ledger: reading "
                f"{'them' if jobs != 1 else 'it'} from {'host' if len(self.pending) == 1 else 'hosts'} {hosts}")


def collect_or_refuse(ctx: Context | ReadContext, jobs: Sequence[Job]) -> dict[str, str]:
    """``collect_missing`` on a ``Context``; on a ``ReadContext``, {} when no job lacks metrics, else
    ``HostsNeeded``."""
    if isinstance(ctx, Context):
        return collect_missing(ctx, jobs)
    pending = missing_metrics(ctx.ledger, jobs)
    if pending:
        raise HostsNeeded(pending)
    return {}


def collect_missing(ctx: Context, jobs: Sequence[Job]) -> dict[str, str]:
    """Read the summaries of SUCCEEDED jobs the ledger has no metrics of yet from their hosts
    (one ``collect`` round trip per host).

    Errors are per host: a host that cannot be reached, or whose answer the ledger refuses (a
    non-finite metric), leaves its own jobs without metrics and the others are read all the same.
    Returns {job id: why its results are missing} for the jobs of the hosts that failed."""
    have = ctx.ledger.with_metrics(j.id for j in jobs)
    pending: dict[str, list[str]] = {}
    for job in jobs:
        if job.state == JobState.SUCCEEDED.value and job.id not in have and job.host:
            pending.setdefault(job.host, []).append(job.id)
    errors: dict[str, str] = {}
    if not pending:
        return errors
    from orchestrator.context import host_for  # the hosts and the collect stage: only when a job lacks metrics
    from orchestrator.tick.collect import collect

    for name, ids in pending.items():
        row = ctx.ledger.host(name)
        if row is None:
            continue
        try:
            collect(ctx.ledger, host_for(ctx, row), row.agent_bundle, ids)
        except GpuqError as exc:
            reason = " ".join(str(exc).split())[:300]
            why = reason if reason.startswith(f"host {name}") else f"host {name}: {reason}"
            done = ctx.ledger.with_metrics(ids)  # jobs recorded before the failure
            errors.update({jid: f"results not collected: {why}" for jid in ids if jid not in done})
    return errors


def collect_notes(errors: dict[str, str]) -> list[str]:
    """One line per distinct failure of ``collect_missing`` (a host's), with how many jobs it hides."""
    counts: dict[str, int] = {}
    for why in errors.values():
        counts[why] = counts.get(why, 0) + 1
    return [f"{why} ({n} job{'s' if n != 1 else ''} without metrics)" for why, n in counts.items()]


def results(ctx: Context | ReadContext, *, sweep: str | None = None) -> list[ResultRow]:
    """One row per job of the sweep (the newest by default).  Every table is read once for the whole
    sweep and grouped by job: the time grows with the sweep, not with its square.  On a ``ReadContext``
    nothing is collected from hosts: ``HostsNeeded`` when a finished job lacks metrics."""
    with gc_paused():
        return _results(ctx, sweep)


def _results(ctx: Context | ReadContext, sweep: str | None) -> list[ResultRow]:
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    jobs = ctx.ledger.jobs(sweep_id=sweep_id)
    errors = collect_or_refuse(ctx, jobs)
    ids = [j.id for j in jobs]
    source = {j.id: j.reused_from or j.id for j in jobs}  # a reused job's results are its twin's (never its cost)
    values: dict[tuple[str, str], dict[str, float]] = {}  # (job id, "final" | "best" | "best_row") -> name -> value
    for job_id, scope, name, value, _ in ctx.ledger.metric_values(sorted(set(source.values())),
                                                                   ("final", "best", "best_row")):
        values.setdefault((job_id, scope), {})[name] = value
    tried: dict[str, list[Attempt]] = {}
    for att in ctx.ledger.attempts_of(ids):  # by job, then number: the last is the newest
        tried.setdefault(att.job_id, []).append(att)
    # checkpoints count only against work lost (cost.job_cost): read for the jobs that lost some
    saved = ctx.ledger.checkpoints_of(j for j, atts in tried.items() if any(a.state in LOST_STATES for a in atts))
    restarts = ctx.ledger.rule_counts(ids, observed.FROM_SCRATCH)  # among each job's newest 200 events, as ever
    verified = ctx.ledger.verified_pulls(sorted(set(source.values())))
    sweep_row = ctx.ledger.sweep(sweep_id)
    metric, mode = observed.headline(sweep_row.run_config() if sweep_row is not None else None)
    git = (sweep_row.git_commit, sweep_row.git_dirty) if sweep_row is not None else ("", None)
    on_cpu = cpu_slots(ctx)
    parts = {p.number: p for p in ctx.ledger.parts_of(sweep_id) if p.number > 1}
    warned = ctx.ledger.open_findings(ids)  # a [run] metrics that gave no value says why
    for job in jobs:
        event = warned.get((job.id, observed.METRICS_RULE))
        if event is not None and job.id not in errors:
            errors[job.id] = event.reason
    now = time.time()
    rows = []
    for job in jobs:
        attempts = tried.get(job.id, [])
        newest = attempts[-1] if attempts else None
        entry = ResultRow(job, values.get((source[job.id], "final"), {}), values.get((source[job.id], "best"), {}),
                          newest,
                          metric=metric, mode=mode, error=errors.get(job.id, ""),
                          provenance=ran_with(newest.provenance) if newest is not None else None,
                          git=git, best_row=values.get((source[job.id], "best_row"), {}))
        entry.cost = job_cost(job.gpus * job.nodes, attempts, saved.get(job.id, []), now, on_cpu)
        entry.restarts_from_scratch = restarts.get(job.id, 0)
        if job.part in parts:
            entry.joined, entry.joined_at = parts[job.part].line, parts[job.part].created_at
        mark = verified.get(source[job.id])
        if mark is not None:
            present = (Path(mark.local_dir) / PULL_VERIFIED).is_file()
            entry.pulled, entry.local_dir = ("verified" if present else "missing"), mark.local_dir
        rows.append(entry)
    if not rows:
        raise JobNotFound(f"sweep {sweep_id} has no jobs")
    return rows
