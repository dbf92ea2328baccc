"""``submit``: validate the whole queue, record it in one transaction, place and start its jobs."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.agent.bundle import Bundle, build_bundle, tree_rules
from orchestrator.api import budgeting, resultcache
from orchestrator.context import Context, known_hosts, payload_tasks
from orchestrator.core.config import PROJECT_CONFIG
from orchestrator.core.errors import QueueIssue, UsageError
from orchestrator.core.specs import DependencyEdge, JobSpec, ParsedQueue, job_id_for, new_queue_id, spec_hash_for
from orchestrator.health.setup_holds import held_bundles, is_held
from orchestrator.ledger import HostRow, Job
from orchestrator.ledger.sweeprun import SweepRun
from orchestrator.queue import datasets, dependencies, project_checks
from orchestrator.queue.queuefile import PlacementCheck, parse_queue, read_queue_bytes
from orchestrator.queue.runconfig import (
    RunConfig,
    check_forward_allowed,
    load_run,
    setup_key,
)
from orchestrator.scheduling.chains import critical_first
from orchestrator.scheduling.estimates import epoch_rates, estimate_source, scaled_from
from orchestrator.scheduling.gpumatch import need_of
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.stopping.config import load_stop
from orchestrator.stopping.policy import StopPolicy
from orchestrator.tick.capacity import capacities, plan_job
from orchestrator.tick.placement import deliver, plan_and_push, target_rows
from orchestrator.transfer import datasync


@dataclass
class SubmitResult:
    sweep_id: str
    queue_path: str
    jobs: list[Job]
    bundle: Bundle
    placements: dict[str, str]
    warnings: list[str]
    dry_run: bool
    launch_error: str = ""
    makespan_s: float = 0.0
    makespan_known: bool = False  # every job's estimate comes from est_min= or history (else never shown)
    makespan_scaled: int = 0  # how many of those estimates were scaled from runs of another shape (scaled_from)
    pushed_to: list[str] = field(default_factory=list)  # hosts that received the bundle's bytes
    specs: list[JobSpec] = field(default_factory=list)  # every expanded job (dry run: what would be recorded)
    run: RunConfig | None = None  # the project's [run] table
    hosts: list[HostRow] = field(default_factory=list)  # the hosts the plan could use
    run_json: str = ""  # the sweep's [run] JSON as recorded (setup_key included); "" without [run]
    budget_usd: float | None = None  # the sweep's cap (--budget, else the budget_usd setting; None: none)
    budget_held: Mapping[str, str] = field(default_factory=dict)  # job id -> why its cap keeps it QUEUED
    stop: StopPolicy | None = None  # the sweep's early stopping ([stop], --stop; None: off)
    reused: Mapping[str, str] = field(default_factory=dict)  # job name -> the job whose verified results it reuses
    part: int = 1  # the part of the sweep this submit is (``--into``: 2, 3, ...; 0: it added nothing)
    joined: list[str] = field(default_factory=list)  # ``--into``: one line per queue line not simply new
    edges: Sequence[DependencyEdge] = ()  # the queue's after= edges (by job name)


def _new_sweep_id(ctx: Context) -> str:
    taken = ctx.ledger.sweep_ids()
    while True:
        candidate = new_queue_id(os.urandom(4))
        if candidate not in taken:
            return candidate


def submit(ctx: Context, queue: Path, *, hosts: Sequence[str] = (), dry_run: bool = False,
           budget_usd: float | None = None, stop: str | None = None, rerun: bool = False) -> SubmitResult:
    """Validate the whole queue, record it in one transaction, place and start its jobs: read, warn, plan,
    record, admit, deliver.

    Jobs are packed across the target hosts (see ``target_rows``) by ``scheduler.plan``; the
    bundle is pushed to every host that gets work before anything is written, and a host
    whose push fails is left out of the plan.  ``budget_usd`` (else the ``budget_usd`` setting) caps
    the sweep: only the jobs it fits start, the others stay QUEUED (``api/budgeting.py``).  ``stop``
    (``--stop RULE``) over the project's ``[stop]`` table: the sweep's early stopping (docs/stopping.md).
    A job whose content key a verified success already has is recorded reused, never run, unless ``rerun``
    (``--rerun``) or its line's ``rerun=true`` (``api/resultcache.py``).
    """
    cap = budget_usd if budget_usd is not None else ctx.settings.budget_usd
    policy = load_stop(queue.parent / PROJECT_CONFIG, stop)
    read = read_project(ctx, queue, hosts)
    keys = dependencies.folded_keys(resultcache.content_keys(read.parsed.jobs, read.bundle.digests, read.run_json,
                                                             path_under(queue, read.workdir)), read.parsed.edges)
    reuse = resultcache.reuse_of(read.parsed.jobs, keys, ctx.ledger.reusable(keys.values()), rerun=rerun)
    warnings = submit_warnings(ctx, queue, read, reuse, dry_run)
    if policy is not None:
        policy, said = _stop_direction(policy, read)
        warnings += said + _stop_warnings(policy, read, queue)
    planned = place_jobs(ctx, queue, read, hosts, warnings, dry_run=dry_run, skip=reuse.keys())
    reused = {name: twin.id for name, twin in reuse.items()}
    if dry_run:
        return SubmitResult(planned.sweep_id, str(queue), [], read.bundle, planned.placements, warnings, True,
                            makespan_s=planned.decided.makespan_s, makespan_known=planned.estimated,
                            makespan_scaled=planned.scaled,
                            specs=list(read.parsed.jobs), run=read.run, hosts=planned.rows, run_json=read.run_json,
                            budget_usd=cap, stop=policy, reused=reused, edges=read.parsed.edges)
    jobs = _record(ctx, queue, read, planned.sweep_id, hosts, cap, policy.model_dump_json() if policy else "",
                   keys, reused)
    decided, held = budgeting.admit_submitted(ctx, planned.sweep_id, cap, planned.decided, planned.plan_jobs)
    placements = {job_id: host for job_id, host in planned.placements.items() if job_id not in held}  # not yet
    result = SubmitResult(planned.sweep_id, str(queue), jobs, read.bundle, placements, warnings, False,
                          makespan_s=decided.makespan_s, makespan_known=planned.estimated,
                          makespan_scaled=planned.scaled,
                          pushed_to=sorted(planned.pushed), budget_usd=cap, budget_held=held, stop=policy,
                          reused=reused, edges=read.parsed.edges)
    result.launch_error = deliver_recorded(ctx, planned.sweep_id, decided, jobs, read.bundle.sha256)
    return result


@dataclass
class ProjectRead:
    """What submit read: the expanded queue, its project's ``[run]`` and ``[data]``, and the bundle built."""

    parsed: ParsedQueue
    run: RunConfig | None
    toml_path: Path
    manifests: list[datasets.Manifest]
    run_json: str
    bundle: Bundle

    @property
    def workdir(self) -> Path:
        return Path(self.parsed.workdir)


@dataclass
class Planned:
    """Where submit's jobs go: the sweep's id, the plan's jobs and hosts, the plan, the hosts pushed to."""

    sweep_id: str
    plan_jobs: list[PlanJob]
    rows: list[HostRow]
    decided: Plan
    pushed: list[str]
    estimated: bool  # every job's estimate comes from est_min= or history
    scaled: int = 0  # jobs whose estimate is scaled from runs of another shape

    @property
    def placements(self) -> dict[str, str]:
        return {a.job_id: a.host for a in self.decided.assignments}


def read_project(ctx: Context, queue: Path, hosts: Sequence[str]) -> ProjectRead:
    """The queue validated, its project's tables read and the bundle built; UsageError for a user mistake."""
    known = known_hosts(ctx)
    for name in hosts:
        if name not in known:
            raise UsageError(f'unknown host "{name}"; known hosts: {", ".join(sorted(known))} '
                             "(`gpuq hosts add` registers one)")
    entry = ctx.settings.entry
    parsed, run, toml_path = read_queue(ctx, queue, known, placement=lambda specs: placement_issues(ctx, hosts, specs))
    if entry:
        path = Path(parsed.workdir) / entry
        if entry.startswith("/") or ".." in Path(entry).parts or not path.is_file():
            raise UsageError(f"entry = {entry!r} (gpuq.toml / GPUQ_ENTRY): must name a file inside the project "
                             f"{parsed.workdir}; nothing was submitted")
    workdir = Path(parsed.workdir)
    manifests = project_checks.data_manifests(run, toml_path, ctx.settings.home, tree_rules)
    run_json = SweepRun.recorded(run.wire(), setup_key=setup_key(run, workdir),
                                 data=datasets.wire(manifests)).text() if run is not None else ""
    bundle = build_bundle(workdir, ctx.settings.bundle_cache, exclude=(ctx.settings.home,),
                          max_bytes=int(ctx.settings.bundle_max_mb * 1e6))
    return ProjectRead(parsed, run, toml_path, manifests, run_json, bundle)


def path_under(path: Path, root: Path) -> str:
    """``path`` as a POSIX path under ``root`` ("" when it is outside)."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return ""


def _stop_direction(policy: StopPolicy, read: ProjectRead) -> tuple[StopPolicy, list[str]]:
    """The policy's direction: the headline metric's mode ([run] metric/mode) unless [stop] gives one; a
    [stop] direction against that mode would stop the cells that do better, and is said at submit."""
    metric = (read.run.metric if read.run is not None else "") or "val_acc"
    mode = read.run.mode if read.run is not None else "max"
    if "direction" not in policy.model_fields_set:
        return policy.model_copy(update={"direction": mode}), []
    if policy.direction == mode:
        return policy, []
    way = "maximised" if mode == "max" else "minimised"
    return policy, [f"{read.toml_path}: [stop] direction = {policy.direction!r}, but the headline metric {metric!r} "
                    f"is {way} ([run] mode = {mode!r}): early stopping would stop the cells that do better; "
                    "make them agree"]


def _stop_warnings(policy: StopPolicy, read: ProjectRead, queue: Path) -> list[str]:
    """A [stop] policy with no baseline cell in the queue stops nothing: said at submit, not discovered later
    (a line named like the baseline counts: lines that differ only by ``seed=`` are one cell by their stem)."""
    from orchestrator.report.cells import cell_name

    base = policy.baseline.lower()
    names = sorted({cell_name(spec.name, spec.cell) for spec in read.parsed.jobs})
    if any(name.lower() == base or name.lower().startswith(base) for name in names):
        return []
    return [f"{read.toml_path}: [stop] compares each cell with the cell {policy.baseline!r}, and {queue} has none "
            f"(cells: {', '.join(names[:8])}): nothing will be stopped; name a line {policy.baseline} or set "
            "[stop] baseline"]


def submit_warnings(ctx: Context, queue: Path, read: ProjectRead, reuse: Mapping[str, Job],
          dry_run: bool) -> list[str]:
    """What the user should know before anything runs: what leaves this machine, seeds, repeats (reused or
    run again), the bundle.
    A dry run (and ``--smoke``, which plans with one) submits nothing: a repeat "would" run again."""
    parsed, run = read.parsed, read.run
    warnings = list(parsed.warnings) + project_checks.what_leaves(run, read.workdir, queue, read.toml_path)
    warnings += datasets.leaving(read.manifests, read.toml_path)
    if ctx.settings.entry or (run is not None and run.command):  # gpuq's own payload reads GPUQ_SEED
        warnings += project_checks.seed_warnings(parsed.jobs, run, str(queue))
    hashes = {spec.name: spec_hash_for(spec) for spec in parsed.jobs}
    done = ctx.ledger.succeeded_with(hashes.values())
    for spec in parsed.jobs:
        twin = reuse.get(spec.name)
        if twin is not None:
            warnings.append(f"{queue}:{spec.line}: job {spec.name!r} is identical to {twin.id} of sweep "
                            f"{twin.sweep_id}, which succeeded with verified results: reused, not run "
                            "(--rerun or rerun=true runs it)")
            continue
        twin = done.get(hashes[spec.name])
        if twin is not None:
            warnings.append(f"{queue}:{spec.line}: job {spec.name!r} is identical to {twin.id} of sweep "
                            f"{twin.sweep_id}, which already succeeded; "
                            + ("a submit would run it again" if dry_run else "it will run again")
                            + " (--rerun or rerun=true, its code or [run]/[data] changed, or its results are not "
                            "pulled verified)")
    return warnings + _bundle_warnings(read.bundle)


def _bundle_warnings(bundle: Bundle) -> list[str]:
    """What the bundle left out, and whether it is large."""
    warnings = []
    if bundle.skipped_secrets:
        more = len(bundle.skipped_secrets) - 5
        warnings.append("left out of the bundle (credential-like paths; a `!path` line in .gpuqignore ships one): "
                        + ", ".join(bundle.skipped_secrets[:5]) + (f" and {more} more" if more > 0 else ""))
    if bundle.skipped_outputs:
        more = len(bundle.skipped_outputs) - 5
        warnings.append("left out of the bundle (training framework output, never the job's own; a `!name/` line "
                        "in .gpuqignore ships one): " + ", ".join(bundle.skipped_outputs[:5])
                        + (f" and {more} more" if more > 0 else ""))
    if bundle.biggest:
        warnings.append(f"the bundle is large ({bundle.bytes / 1e6:.0f} MB); biggest: "
                        + ", ".join(f"{rel} ({size / 1e6:.0f} MB)" for rel, size in bundle.biggest)
                        + "; leave data out with .gpuqignore and read it on the host")
    return warnings


def place_jobs(ctx: Context, queue: Path, read: ProjectRead, hosts: Sequence[str], warnings: list[str], *,
               dry_run: bool, skip: Collection[str] = (), sweep_id: str = "") -> Planned:
    """The plan over the target hosts (the bundle pushed to each host that gets work, unless a dry run) of the
    jobs not in ``skip`` (reused) nor waiting (``after=``: the tick places those), for sweep ``sweep_id`` ("": a new
    one); a host left out is added to ``warnings``; a job no host can ever take is a UsageError naming its line."""
    jobs = [j for j in read.parsed.jobs if j.name not in skip]
    sweep_id = sweep_id or _new_sweep_id(ctx)
    rates = epoch_rates(ctx.ledger.run_history())
    ckpt = ctx.ledger.checkpoint_bytes_by_config()
    plan_jobs = [plan_job(job_id_for(sweep_id, j.name), gpus=j.gpus, config=j.config, task=j.task, epochs=j.epochs,
                          est_min=j.est_min, host_pin=j.host, rates=rates, ckpt_bytes=ckpt, nodes=j.nodes,
                          need=need_of(j.gpu, j.gpu_mem)) for j in jobs]
    plan_jobs, later = critical_first(plan_jobs, needs := dependencies.needs_by_id(read.parsed.edges, sweep_id),
                                      {p.job_id for p in plan_jobs} - set(needs))  # waiting jobs: the tick's
    rows = target_rows(ctx, hosts, {j.host for j in jobs if j.host})
    warnings += _data_room(ctx, read.manifests, rows)
    holds = held_bundles(ctx.ledger, [r.name for r in rows])
    for row in [r for r in rows if is_held(holds, r.name, read.bundle.sha256)]:
        warnings.append(f"host {row.name} left out: this project's setup failed there (`gpuq hosts release "
                        f"{row.name}` to try it again)")
        rows.remove(row)
    pushed: list[str] = []
    dropped: dict[str, str] = {}
    if dry_run:
        decided = plan(plan_jobs, capacities(ctx.ledger, ctx.settings, rows, rates))
    else:
        decided, dropped = plan_and_push(ctx.ledger, ctx.fleet, ctx.settings, plan_jobs, rows, read.bundle, rates,
                                         pushed)
    warnings += [f"host {name} left out: {why}" for name, why in sorted(dropped.items())]
    never = [*decided.unplaced, *(plan(later, capacities(ctx.ledger, ctx.settings, rows, rates)).unplaced)]
    if never:
        names = {job_id_for(sweep_id, j.name): j for j in jobs}
        lines = [f"{queue}:{names[jid].line}: job {names[jid].name!r} cannot be placed: {why}"
                 + _did_you_mean(names[jid]) for jid, why in never]
        raise UsageError("\n".join([*lines, "nothing was submitted"]))
    estimated = all(estimate_source(config=j.config, task=j.task, epochs=j.epochs, est_min=j.est_min, rates=rates)
                    for j in jobs)
    scaled = sum(1 for j in jobs if scaled_from(config=j.config, task=j.task, epochs=j.epochs, est_min=j.est_min,
                                                rates=rates))
    return Planned(sweep_id, plan_jobs, rows, decided, pushed, estimated, scaled)


def placement_issues(ctx: Context, hosts: Sequence[str], specs: Sequence[JobSpec]) -> list[QueueIssue]:
    """One issue for each job that no target host can take (``gpu=2`` for ``gpus=2``, more GPUs than any
    host has), from the ledger alone, as the plan decides it; the plan after the push checks again."""
    if not specs:
        return []
    rates = epoch_rates(ctx.ledger.run_history())
    by_id = {job_id_for("qcheck", s.name): s for s in specs}
    jobs = [plan_job(jid, gpus=s.gpus, config=s.config, task=s.task, epochs=s.epochs, est_min=s.est_min,
                     host_pin=s.host, rates=rates, nodes=s.nodes, need=need_of(s.gpu, s.gpu_mem))
            for jid, s in by_id.items()]
    rows = target_rows(ctx, hosts, {s.host for s in specs if s.host})
    decided = plan(jobs, capacities(ctx.ledger, ctx.settings, rows, rates))
    return [QueueIssue(by_id[jid].line, None, f"job {by_id[jid].name!r} cannot be placed: {why}"
                       + _did_you_mean(by_id[jid])) for jid, why in decided.unplaced]


def _did_you_mean(spec: JobSpec) -> str:
    """``gpu=2`` names a GPU model called "2": a count was meant (``gpus=2``)."""
    counts = [m for m in spec.gpu if m.isdigit()]
    if not counts:
        return ""
    return f"; did you mean gpus={counts[0]}? (gpu= names a GPU model, e.g. gpu=A100; gpus= is how many)"


def _record(ctx: Context, queue: Path, read: ProjectRead, sweep_id: str, hosts: Sequence[str],
            cap: float | None, stop: str, keys: Mapping[str, str], reused: Mapping[str, str]) -> list[Job]:
    """The sweep, its jobs (content keys; the reused ones SUCCEEDED, pointing at their twins), in one
    transaction."""
    return ctx.ledger.add_sweep(
        sweep_id=sweep_id, queue_path=str(queue), workdir=str(read.workdir.resolve()),
        queue_text=read_queue_bytes(queue).decode("utf-8-sig", errors="replace"), jobs=read.parsed.jobs,
        default_retries=ctx.settings.retries, bundle_sha=read.bundle.sha256, hosts=list(dict.fromkeys(hosts)),
        entry=ctx.settings.entry, launcher=ctx.settings.launcher,
        verify=read.run.verify if read.run is not None else ctx.settings.verify, run=read.run_json,
        git=project_git(read.workdir), budget_usd=cap, stop=stop, keys=keys, reuse=reused, edges=read.parsed.edges)


def deliver_recorded(ctx: Context, sweep_id: str, decided: Plan, jobs: list[Job], bundle_sha: str) -> str:
    """The admitted jobs' specs into their hosts' inboxes; what failed is recorded (the tick retries it) and
    said: the launch error, or ""."""
    failed = deliver(ctx.ledger, ctx.fleet, ctx.settings, decided, {j.id: j for j in jobs}, bundle_sha)
    budgeting.after_submit(ctx, sweep_id)
    for name, err in failed.items():
        ctx.ledger.record_event("sweep", sweep_id, f"delivery to {name} failed: {err}")
    return "; ".join(f"{err} (recorded; `gpuq status` retries the delivery)" for err in failed.values())


def read_queue(ctx: Context, queue: Path, known: Collection[str], *, placement: PlacementCheck | None = None,
               ) -> tuple[ParsedQueue, RunConfig | None, Path]:
    """The queue validated and expanded as ``submit`` reads it (its project's gpuq.toml ``[run]`` table
    applied), recording nothing: (jobs, the run table or None, the gpuq.toml path); ``placement`` checks
    the jobs of the lines that parsed against the hosts in the same pass (``placement_issues``)."""
    toml_path = queue.parent / PROJECT_CONFIG
    run = load_run(toml_path)
    payload_command = not ctx.settings.entry and (run is None or not run.command)
    parsed = parse_queue(queue, known_hosts=known, tasks=payload_tasks() if payload_command else None,
                         needs_config=run is None or run.needs_config,
                         uses_epochs=run is None or "epochs" in run.uses(), placement=placement)
    if run is not None:
        check_forward_allowed(run, toml_path, ctx.settings.forward_env_allow, str(ctx.settings.home / "config.toml"))
        parsed = project_checks.under_project(parsed, run, toml_path, str(queue), ctx.settings.home)
    return parsed, run, toml_path


GIT_TIMEOUT_S = 20


def project_git(workdir: Path) -> tuple[str, bool | None]:
    """(commit, dirty) of the project at submit: ``git rev-parse HEAD`` and whether ``git status`` lists
    a change under the project root (untracked files included: the bundle ships them).  ("", None) when
    it is not a git checkout or git cannot say; never guessed."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(workdir), *args], stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=GIT_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    head = (git("rev-parse", "--verify", "HEAD") or "").strip()
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head):
        return "", None
    changes = git("status", "--porcelain", "--untracked-files=normal", "--", ".")
    return head, None if changes is None else bool(changes.strip())
def _data_room(ctx: Context, manifests: list[datasets.Manifest], rows: list[HostRow]) -> list[str]:
    """A warning per host whose disk (beyond its gate, at its last probe) cannot take the ``[data]`` it does
    not hold yet: the data counts against the same disk budget as the jobs' checkpoints."""
    out = []
    for row in rows:
        if row.disk_free_bytes is None or not manifests:
            continue
        have = {h["tree"] for h in datasync.held(ctx.settings.home, row.name)}
        need = sum(m.bytes for m in manifests if m.tree not in have)
        room = row.disk_free_bytes - max(row.min_free_gb, ctx.settings.min_free_gb) * 1e9
        if need > room:
            out.append(f"host {row.name}: [data] needs {need / 1e9:.1f} GB there and its disk has "
                       f"{max(0.0, room) / 1e9:.1f} GB free above min_free_gb; its jobs will stop at the disk gate")
    return out
