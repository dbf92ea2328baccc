"""``gpuq submit --dry-run``: every expanded job with its host, its estimate and the exact argv it will
run there (rendered by the agent's own gpuq_argv.py; forwarded secrets' values shown as ``***``)."""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel, ConfigDict

from orchestrator.agent.handed import render_args
from orchestrator.api.budgeting import projection
from orchestrator.api.submitting import SubmitResult
from orchestrator.context import Context
from orchestrator.core import protocol
from orchestrator.core.agent_modules import argv_module
from orchestrator.core.specs import JobSpec, job_id_for
from orchestrator.ledger import HostRow
from orchestrator.ledger.sweeprun import parse_run
from orchestrator.queue.runconfig import RunConfig
from orchestrator.report.cells import cell_name
from orchestrator.scheduling.estimates import epoch_rates, estimate_s, estimate_source
from orchestrator.stopping.seeds import auto_of, describe

MASK = "***"
MASTER_PORT = "<master_port>"  # picked by the host's agent per launch


class DryRunJob(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    name: str
    cell: str
    line: int
    config: str
    task: str
    epochs: int | None  # None: nothing gave the job epochs
    gpus: int
    seed: int | None
    host: str
    est_s: float | None  # None: no estimate (no est_min= and no history)
    estimate_from: str  # "est_min=" | "history of N runs" | "no history"
    argv: list[str]
    after: list[str] = []  # the jobs it waits for (after=): it is placed once they SUCCEEDED, so no host yet


class DryRunCost(BaseModel):
    """What the sweep is projected to cost (``api/budgeting.projection``) and whether its cap fits it."""

    model_config = ConfigDict(frozen=True)

    low_usd: float | None  # None: no projection (why_not says why)
    high_usd: float | None  # None: open (a job on a priced host has no estimate), or no projection
    unestimated: list[str]  # jobs on priced hosts without est_min= or history
    unpriced: list[str]  # jobs placed on hosts without a price (they cost nothing here)
    why_not: str  # "" when there is a projection
    summary: str  # the projection in one line
    budget_usd: float | None  # --budget, else the budget_usd setting; None: no cap
    fits: bool | None  # True: even the high end fits the cap; False: even the low end does not; None: may


class DryRun(BaseModel):
    """One document for ``gpuq submit --dry-run --json``."""

    model_config = ConfigDict(frozen=True)

    queue: str
    bundle_sha: str
    bundle_files: int
    bundle_bytes: int
    warnings: list[str]
    forward_env: list[str]  # the names of the variables whose values would be sent to the hosts
    jobs: list[DryRunJob]
    makespan_s: float | None  # None: unknown until one job of each config has run
    metrics: str = ""  # what each job's results will be read from ([run] metrics), in words; "" = gpuq's payload
    cost: DryRunCost | None = None
    stop: str = ""  # what early stopping will do, in one line (docs/stopping.md); "" = off
    seeds: str = ""  # what seeds=auto will do, in one line (docs/stopping.md); "" = no seeds=auto line
    into: str = ""  # ``--into``: the sweep the jobs would join ("" = a new sweep)
    joined: list[str] = []  # ``--into``: one line per queue line not simply new (already in the sweep, changed)


def metrics_plan(run: RunConfig | None) -> str:
    """What the agent will read a job's metrics from, in words (a glob said as one)."""
    if run is None or not run.metrics:
        return ""
    metric = run.metric or "val_acc"
    head = f"headline {metric} ({run.mode}); a resumed run's rows replace the steps it trains again"
    if run.metrics == "log":
        return f"the named groups of [run] metrics_regex over every attempt's log, in order; {head}"
    if any(c in run.metrics for c in "*?["):
        return (f"every file in the job's run dir matching the glob {run.metrics!r}, read in the order the "
                f"trainer wrote them (attempt, then mtime) and merged by step; {head}")
    return f"the file {run.metrics!r} in the job's run dir; {head}"


def dry_run(ctx: Context, result: SubmitResult) -> DryRun:
    rates = epoch_rates(ctx.ledger.run_history())
    rows = {row.name: row for row in result.hosts}
    secrets = [v for v in (os.environ.get(n) for n in (result.run.forward_env if result.run else ())) if v]
    argv = _Argv(ctx, result, secrets)
    jobs = []
    known = True
    waits: dict[str, list[str]] = {}
    for edge in result.edges:
        waits.setdefault(edge.job, []).append(edge.needs)
    for spec in result.specs:
        job_id = job_id_for(result.sweep_id, spec.name)
        host = result.placements.get(job_id, "")
        source = estimate_source(config=spec.config, task=spec.task, epochs=spec.epochs, est_min=spec.est_min,
                                 rates=rates)
        known = known and source is not None
        seconds = estimate_s(config=spec.config, task=spec.task, epochs=spec.epochs, est_min=spec.est_min,
                             history=rates) if source is not None else None
        jobs.append(DryRunJob(
            job_id=job_id, name=spec.name, cell=spec.cell or spec.name, line=spec.line, config=spec.config,
            task=spec.task, epochs=spec.epochs, gpus=spec.gpus, seed=spec.seed, host=host, est_s=seconds,
            estimate_from=source or "no history", argv=argv.of(spec, job_id, rows.get(host)),
            after=waits.get(spec.name, [])))
    return DryRun(queue=result.queue_path, bundle_sha=result.bundle.sha256, bundle_files=result.bundle.files,
                  bundle_bytes=result.bundle.bytes, warnings=result.warnings, joined=result.joined,
                  into=result.sweep_id if result.part != 1 else "",
                  forward_env=list(result.run.forward_env if result.run else ()), jobs=jobs,
                  makespan_s=result.makespan_s if known and result.makespan_known else None,
                  metrics=metrics_plan(result.run), cost=_cost(ctx, result),
                  stop=result.stop.describe() if result.stop else "", seeds=_seeds_plan(result))


def _seeds_plan(result: SubmitResult) -> str:
    """seeds=auto's line: each cell of a seeds=auto line, the seeds it starts with and the most it may get."""
    cells: dict[str, tuple[int, int]] = {}
    for spec in result.specs:
        if spec.seeds_max:
            now, _ = cells.get(cell := cell_name(spec.name, spec.cell), (0, 0))
            cells[cell] = (now + 1, spec.seeds_max)
    return describe(auto_of(result.stop), cells, result.budget_usd) if cells else ""


def _cost(ctx: Context, result: SubmitResult) -> DryRunCost:
    found = projection(ctx, result.sweep_id, result.specs, result.placements, result.hosts)
    cap = result.budget_usd
    return DryRunCost(low_usd=None if found.why_not else found.low, high_usd=None if found.why_not else found.high,
                      unestimated=list(found.unestimated), unpriced=list(found.unpriced), why_not=found.why_not,
                      summary=found.line(), budget_usd=cap, fits=found.fits(cap) if cap is not None else None)


class _Argv:
    """Renders one job's argv the way the wrapper will on its host (attempt 1, no checkpoint)."""

    def __init__(self, ctx: Context, result: SubmitResult, secrets: list[str]) -> None:
        self.module = argv_module()
        self.run: RunConfig | None = result.run
        self.sha = result.bundle.sha256
        self.secrets = secrets
        entry = ctx.settings.entry
        self.entry = f"{protocol.BUNDLE_WORKDIR}/{entry}" if entry else protocol.TRAIN_ENTRY
        self.launcher = self.run.launcher if self.run is not None else ctx.settings.launcher
        self.local_python = ctx.settings.local_python
        recorded = parse_run(result.run_json)
        self.data = recorded.data if recorded is not None else {}
        key = recorded.setup_key if recorded is not None and recorded.setup else ""
        # with a setup hook, jobs see its prepared tree (payload/agent/gpuq_attempt/gpuq_setup.py project_root)
        self.project = f".prepared/{self.sha}-{key[:32]}" if key else f"{self.sha}/{protocol.BUNDLE_WORKDIR}"

    def of(self, spec: JobSpec, job_id: str, row: HostRow | None) -> list[str]:
        root = row.root if row is not None else "<root>"
        python = row.python if row is not None else ""
        if not python:  # the agent's own interpreter: the local host runs this one's
            python = (self.local_python or sys.executable) if row is not None and row.kind == "local" else "python3"
        bundle = f"{root}/{protocol.BUNDLES_DIR}/{self.sha}"
        job_dir = f"{root}/{protocol.JOBS_DIR}/{job_id}"
        command = list(self.run.command) if self.run is not None else []
        if not command:
            command = [f"{bundle}/{self.entry}", "--config", "{config}", "--task", "{task}", "--epochs", "{epochs}"]
        values = {
            "config": f"{root}/{protocol.BUNDLES_DIR}/{self.project}/{spec.config}", "task": spec.task,
            "epochs": str(spec.epochs or ""), "name": spec.name, "seed": "" if spec.seed is None else str(spec.seed),
            "job_id": job_id, "attempt": "1", "run_dir": f"{job_dir}/run", "ckpt_dir": f"{job_dir}/{protocol.CKPT_DIR}",
            "master_port": MASTER_PORT,
        }
        for name, ref in self.data.items():  # [data]: the synced tree on the host (transfer/datasync.py)
            tree = f"{root}/{protocol.BUNDLES_DIR}/.data/trees/{ref.tree}"
            values[f"data.{name}"] = f"{tree}/{ref.file}" if ref.file else tree
        handed = {name: f"<checkpoint of {name}>" for name in spec.after}  # placed on the host by the tick
        argv: list[str] = self.module.job_argv(
            launcher=self.launcher, python=python, nproc=spec.gpus, command=command,
            args=list(render_args(spec.args, handed)),
            resume_args=list(self.run.resume_args) if self.run is not None else [], values=values, checkpoint=None)
        if self.secrets:
            argv = [_mask(a, self.secrets) for a in argv]
        return argv


def _mask(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, MASK)
    return text
