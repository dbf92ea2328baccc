"""``submit QUEUE --into SWEEP``: a queue's new cells (and new seeds of its cells) join a running or finished
sweep as its next part: the same baseline, one report, one budget (docs/queue.md, "Growing a sweep").

The sweep's ground must hold: the same ``[run]``/``[data]`` record, entry, launcher and finalize checks, and code
whose content key the sweep's baseline would keep (``_same_ground``); which lines are new is ``joinplan.classify``.
Joins of one sweep are one at a time (``_join_lock``: read, plan, record, deliver under a lock file), and the
ledger's join transaction leaves out any name the sweep already has: every line once, however many
``--into`` submits race.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from itertools import combinations
from pathlib import Path

from orchestrator.api import budgeting, joinplan, resultcache
from orchestrator.api.submitting import (
    ProjectRead,
    SubmitResult,
    deliver_recorded,
    path_under,
    place_jobs,
    read_project,
    submit_warnings,
)
from orchestrator.context import Context
from orchestrator.core import protocol
from orchestrator.core.errors import JobNotFound, UsageError
from orchestrator.ledger import Job, Sweep, SweepPart
from orchestrator.queue.queuefile import read_queue_bytes
from orchestrator.report.cells import cell_name

_MAX_GUESSES = 8  # names whose place in the baseline's bundle is guessed both ways (2^8 hashes at most)


def submit_into(ctx: Context, queue: Path, into: str, *, hosts: Sequence[str] = (), dry_run: bool = False,
                rerun: bool = False, budget_usd: float | None = None, stop: str | None = None) -> SubmitResult:
    """Join ``queue``'s new jobs to sweep ``into`` (an id or unique prefix) as its next part, placed and started
    as ``submit`` places them, under the sweep's cap.  UsageError (nothing written) for an unknown or ambiguous
    sweep, a host it may not use, ``budget_usd``/``stop`` (the sweep keeps its own), or a queue whose baseline
    differs; a queue with nothing new adds no part."""
    if budget_usd is not None or stop is not None:
        raise UsageError(f"--into {into}: the sweep keeps its own budget and stopping rule; leave out "
                         f"--{'budget' if budget_usd is not None else 'stop'} (`gpuq budget {into} USD` changes its "
                         "cap); nothing was submitted")
    sweep = _sweep_of(ctx, into)
    targets = _targets(sweep, hosts)
    with nullcontext() if dry_run else _join_lock(ctx, sweep.id):
        read = read_project(ctx, queue, targets)
        if read.parsed.edges:  # a part's after= edges are not recorded with it (yet): never start one unhanded
            line = min(s.line for s in read.parsed.jobs if s.after)
            raise UsageError(f"{queue}:{line}: after= is not supported with --into yet; submit the chain as a sweep "
                             "of its own; nothing was submitted")
        existing = ctx.ledger.jobs(sweep_id=sweep.id)
        parts = ctx.ledger.parts_of(sweep.id)
        _same_ground(ctx, queue, read, sweep, existing, parts)
        number = max((p.number for p in parts), default=1) + 1
        joined = joinplan.classify(str(queue), read.parsed.jobs, existing, sweep.id, number)
        if joined.errors:
            raise UsageError("\n".join([*joined.errors, "nothing was submitted"]))
        if not joined.new:
            return SubmitResult(sweep.id, str(queue), [], read.bundle, {}, list(read.parsed.warnings), dry_run,
                                part=0, joined=joined.notes)
        return _join(ctx, queue, replace(read, parsed=read.parsed.model_copy(update={"jobs": tuple(joined.new)})),
                     sweep, targets, number, joined.notes, dry_run=dry_run, rerun=rerun)


def _join(ctx: Context, queue: Path, read: ProjectRead, sweep: Sweep, targets: Sequence[str], number: int,
          notes: list[str], *, dry_run: bool, rerun: bool) -> SubmitResult:
    """Plan, record and deliver the new jobs of ``read`` as part ``number`` of ``sweep``."""
    specs = read.parsed.jobs
    keys = resultcache.content_keys(specs, read.bundle.digests, read.run_json, path_under(queue, read.workdir))
    reuse = resultcache.reuse_of(specs, keys, ctx.ledger.reusable(keys.values()), rerun=rerun)
    warnings = submit_warnings(ctx, queue, read, reuse, dry_run)
    planned = place_jobs(ctx, queue, read, targets, warnings, dry_run=dry_run, skip=reuse.keys(), sweep_id=sweep.id)
    reused = {name: twin.id for name, twin in reuse.items()}
    if dry_run:
        return SubmitResult(sweep.id, str(queue), [], read.bundle, planned.placements, warnings, True,
                            makespan_s=planned.decided.makespan_s, makespan_known=planned.estimated,
                            specs=list(specs), run=read.run, hosts=planned.rows, run_json=read.run_json,
                            budget_usd=sweep.budget_usd, reused=reused, part=number, joined=notes)
    part, jobs = ctx.ledger.join_sweep(
        sweep_id=sweep.id, queue_path=str(queue), queue_text=read_queue_bytes(queue).decode("utf-8-sig", "replace"),
        bundle_sha=read.bundle.sha256, jobs=specs, default_retries=ctx.settings.retries, keys=keys, reuse=reused)
    mine, names = {job.id for job in jobs}, {job.name for job in jobs}
    decided = replace(planned.decided, assignments=tuple(a for a in planned.decided.assignments if a.job_id in mine))
    decided, held = budgeting.admit_joined(ctx, sweep.id, decided, [p for p in planned.plan_jobs if p.job_id in mine])
    placements = {a.job_id: a.host for a in decided.assignments}
    result = SubmitResult(sweep.id, str(queue), jobs, read.bundle, placements, warnings, False,
                          makespan_s=decided.makespan_s, makespan_known=planned.estimated,
                          pushed_to=sorted(planned.pushed), budget_usd=sweep.budget_usd, budget_held=held,
                          reused={n: r for n, r in reused.items() if n in names},
                          part=part.number if part is not None else 0, joined=notes)
    if jobs:
        result.launch_error = deliver_recorded(ctx, sweep.id, decided, jobs, read.bundle.sha256)
    return result


def _sweep_of(ctx: Context, into: str) -> Sweep:
    try:
        return ctx.ledger.resolve_sweep(into)
    except JobNotFound as exc:
        raise UsageError(f"--into {into}: {exc}; nothing was submitted") from exc


def _targets(sweep: Sweep, hosts: Sequence[str]) -> list[str]:
    """The hosts this part may use: ``--host`` (each one the sweep may use), else the sweep's own."""
    allowed = sweep.host_set()
    outside = [h for h in hosts if allowed and h not in allowed]
    if outside:
        raise UsageError(f"--host {outside[0]}: sweep {sweep.id} may use only {', '.join(sorted(allowed))}; "
                         "nothing was submitted")
    return list(dict.fromkeys(hosts)) or sorted(allowed)


@contextmanager
def _join_lock(ctx: Context, sweep_id: str) -> Iterator[None]:
    """Hold ``$GPUQ_HOME/locks/join-<sweep>.lock`` (flock; released when the process dies): one join of a
    sweep at a time, so each reads the jobs the one before it added."""
    folder = ctx.settings.home / "locks"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder / f"join-{sweep_id}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _same_ground(ctx: Context, queue: Path, read: ProjectRead, sweep: Sweep, existing: Sequence[Job],
                 parts: Sequence[SweepPart]) -> None:
    """UsageError (one line) unless the queue's project runs as the sweep's baseline ran: the same ``[run]``/
    ``[data]`` record, entry, launcher and checks, and code under which the baseline keeps its content key."""
    said = []
    if read.run_json != sweep.run:
        said.append("[run]/[data] tables (command, setup or data versions)")
    verify = ",".join(read.run.verify if read.run is not None else ctx.settings.verify)
    if (ctx.settings.entry, ctx.settings.launcher, verify) != (sweep.entry, sweep.launcher, sweep.verify):
        said.append("entry, launcher or verify setting")
    if not said and not _same_code(queue, read, existing, parts):
        said.append("code (a project file other than the queues and their configs changed)")
    if said:
        raise UsageError(f"{queue}: sweep {sweep.id}'s baseline ran with other {' and '.join(said)}; a grown sweep "
                         "compares its cells with the same baseline: restore them, or submit without --into for a "
                         "new sweep; nothing was submitted")


def _same_code(queue: Path, read: ProjectRead, existing: Sequence[Job], parts: Sequence[SweepPart]) -> bool:
    """Whether the sweep's baseline job (else its first job) keeps its content key under this bundle (True when
    no job has one: a ledger from before the result cache).

    Its key left out the configs its queue named and that queue file; the files this queue names now (its configs,
    itself) may be new since, or may have been in that bundle unnamed: each way of telling which is tried
    (``resultcache.code_hash`` without them, or with them), up to ``_MAX_GUESSES`` names, else all left out."""
    keyed = [j for j in existing if j.content_key]
    refs = [j for j in keyed if cell_name(j.name, j.cell).casefold() == joinplan.BASELINE] or keyed
    if not refs:
        return True
    sure = {j.config for j in existing}  # left out of every key of the sweep
    maybe = {s.config for s in read.parsed.jobs} | {path_under(queue, read.workdir)}
    for part in parts:  # the queue files the sweep was read from, wherever they were given from
        maybe |= {path_under(Path(part.queue_path), read.workdir), Path(part.queue_path).name}
    held = {name for name, _ in read.bundle.digests}
    guesses = sorted(n for n in maybe - sure if n and f"{protocol.BUNDLE_WORKDIR}/{n}" in held)
    if len(guesses) > _MAX_GUESSES:
        tries: list[tuple[str, ...]] = [tuple(guesses)]
    else:
        tries = [c for k in range(len(guesses) + 1) for c in combinations(guesses, k)]
    ref = refs[0]
    return any(resultcache.key_of(ref.spec_hash, resultcache.code_hash(read.bundle.digests, sure | set(left)),
                                  read.run_json) == ref.content_key for left in tries)
