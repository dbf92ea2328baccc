"""Checkpoint hand-over (``after=``, docs/queue.md): before a job that waited starts on a host, the verified
checkpoint of each job it waited for is placed there, the way a resume places one (``tick/checkpoints.py``).

For each dependency (the twin it reuses, for a reused success): its newest checkpoint is copied home from its
host (the agent's ``snapshot``, size and sha256 checked), then placed on the job's host (kept when the host
already holds those bytes: the same host, or an earlier hand-over) and its sha256 checked there.  The path it
lies at follows from the ledger (``agent/handed.py``), so the spec, sent now or again, names it.  A dependency
that cannot be handed over now (its host unreachable, a copy that does not verify) keeps the job QUEUED with
an event; the next tick tries again.  Nothing here changes a job's state.
"""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path

from orchestrator.agent.handed import newest_copy, remote_path, source_of
from orchestrator.context import Context
from orchestrator.core.errors import GpuqError
from orchestrator.ledger import Checkpoint, Dependency, Job
from orchestrator.tick.checkpoints import place_checkpoint, refresh_from


def hand_over(ctx: Context, job: Job, host_name: str, edges: list[Dependency]) -> list[str]:
    """Place every dependency's checkpoint on ``host_name`` for ``job``; what happened, one line each.
    GpuqError (the job waits) when one cannot be placed and verified now."""
    needed = {j.id: j for j in ctx.ledger.jobs_by_ids([e.needs_id for e in edges])}
    done = []
    for edge in edges:
        dep = needed.get(edge.needs_id)
        if dep is None:
            raise GpuqError(f"its dependency {edge.needs_id} is not in the ledger")
        copy = _home_copy(ctx, ctx.ledger.job(source_of(dep)), uses=_uses(job, edge.via))
        if copy is None:
            done.append(f"{edge.via}: {dep.name} left no checkpoint; nothing handed over")
            continue
        done.append(_place(ctx, job, host_name, edge, copy))
    return done


def _uses(job: Job, via: str) -> bool:
    """Whether the job's arguments name the dependency's checkpoint (``{checkpoint.VIA}``)."""
    mark = "{checkpoint." + via.casefold() + "}"
    return any(mark in arg.casefold() for arg in job.arg_list())


def _home_copy(ctx: Context, source: Job, *, uses: bool) -> Checkpoint | None:
    """The source job's newest checkpoint with a verified copy home: copied from its host now (its final one),
    else the copy already home.  None when it has none and the job does not name it; GpuqError when it does."""
    why = f"its copy from {source.host} failed (`gpuq explain {source.id}`)" if source.host else "no host"
    if source.host:
        try:
            if refresh_from(ctx, source, source.host):
                why = ""
        except GpuqError as exc:
            why = str(exc)
    copy = newest_copy(ctx.ledger, source.id)
    if copy is not None:
        return copy
    if uses:
        raise GpuqError(f"no verified checkpoint of {source.name} {source.id} to hand over yet ({why})")
    return None


def _place(ctx: Context, job: Job, host_name: str, edge: Dependency, copy: Checkpoint) -> str:
    source = ctx.ledger.job(copy.job_id)
    place_checkpoint(ctx, source, host_name)  # kept when the host holds it already
    row = ctx.ledger.host(host_name)
    if row is None:
        raise GpuqError(f"host {host_name} is no longer registered")
    path = remote_path(row.root, source.id, copy.file)
    if not Path(copy.durable_path).is_dir():  # a directory is checked file by file as it is placed (ckptdir)
        host = ctx.fleet.named(host_name)
        probe = host.run(["sh", "-c", 'sha256sum "$1" 2>/dev/null; true', "sh", path], timeout=300)
        there = probe.stdout.split(" ", 1)[0]
        if there != copy.sha256:
            with contextlib.suppress(GpuqError):  # a torn copy is never left for a trainer to load
                host.run(["rm", "-f", path], timeout=60)
            raise GpuqError(f"the checkpoint of {source.name} on {host_name} does not match its sha256 "
                            f"({copy.sha256[:12]}); placed again next tick")
    message = (f"checkpoint of {edge.via} ({source.name} {source.id}, {copy.sha256[:12]}) handed over on "
               f"{host_name}: {shlex.quote(path)}")
    ctx.ledger.record_event("job", job.id, message, unless_repeated=True)
    return message
