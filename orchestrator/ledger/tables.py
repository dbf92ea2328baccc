"""Ledger tables.  Times are UTC epoch seconds (float); states are enum values."""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import Index, UniqueConstraint
from sqlmodel import Field, SQLModel

from orchestrator.ledger.rowmethods import (
    AttemptMethods,
    EventMethods,
    HostMethods,
    JobMethods,
    PartMethods,
    SweepMethods,
)


class HostRow(SQLModel, HostMethods, table=True):
    """One registered host (the ledger's row; the host seam's object is ``hosts.base.Host``)."""

    __tablename__ = "host"

    name: str = Field(primary_key=True)
    kind: str  # "local" | "ssh" | "slurm"
    target: str = ""
    root: str
    python: str = ""
    profile: str = ""
    agent_bundle: str = ""  # sha of the bundle whose agent serves this host
    slots_kind: str = ""  # "gpu" | "cpu" from the last probe
    slots_total: int = 0
    price_per_hour: float | None = None
    unreachable_since: float | None = None
    last_probe_at: float | None = None
    created_at: float
    # v2: remote SSH hosts
    port: int = 22
    user: str = ""
    key_path: str = ""
    host_key: str = ""  # "<type> <base64>" trusted for this host (known_hosts holds the same line)
    train_device: str = ""  # "" = follow the slots; "cpu" = rehearsal host with emulated GPUs
    disk_free_bytes: int | None = None  # free bytes under root at the last probe (or the audit)
    min_free_gb: float = 0.0  # the profile's disk gate: jobs are refused below this
    # v4: health
    health: str = ""  # "" = never checked | "pass" | "warn" | "fail" (the last GPU preflight's verdict)
    health_at: float | None = None
    health_detail: str = ""  # the failing/warning checks of that preflight, one line
    hold_detail: str = ""  # v15 (was hold_reason): what the hold's kind (``hold_kind``) leaves to say
    probe_failures: int = 0  # consecutive failed probes (backoff, docs/health.md)
    next_probe_at: float | None = None  # backoff: not probed before this time
    kernel_cursor: str = ""  # monotonic timestamp of the last kernel-log line seen ("boot_id:ts")
    oom_kill: int | None = None  # the cgroup oom_kill counter at the last probe
    # v5: rented hosts (gpuq up); "" provider = a host the user brought
    provider: str = ""  # "" | "runpod" | "lambda"
    instance_id: str = ""  # the provider's pod / instance id
    spot: bool = False
    bid_per_gpu: float | None = None  # the spot bid, dollars per GPU-hour
    gpu_type: str = ""  # the provider's GPU type id / instance type
    gpu_count: int = 0
    region: str = ""
    lease_state: str = ""  # states.LeaseState; only Ledger.lease_transition changes it, with lease_reason
    lease_reason: str = ""  # why the lease is in its state: the provider's words (vast.ai status_msg, Lambda status)
    lease_changed_at: float | None = None
    # v7: the rented host this one replaced (`gpuq resume`), so `gpuq down --sweep` finds it unused too
    replaces: str = ""
    # v8: a Slurm host (kind "slurm"): JSON of its settings (orchestrator/slurm.py), "" otherwise
    slurm: str = ""
    # v12: money (docs/providers.md): the provider-side name gpuq created the instance under
    # ("gpuq-<lease>-<i>", written before the create call), and whether the tick ends the host once
    # its work is done and every result is home and verified (`gpuq up --down-when-done`)
    instance_name: str = ""
    down_when_done: bool = False
    # v14: its GPUs as the audit or the last probe listed them, for jobs with `gpu=` / `gpu_mem=`
    # (orchestrator/scheduling/gpumatch.py): JSON, one [model, memory.total MiB] per GPU; "" = not known yet
    gpu_facts: str = ""
    # v16: a hold is a kind (states.HoldKind; "" = not held: the host gets new jobs) and free detail text
    hold_kind: str = ""


class HostFields(TypedDict, total=False):
    """What ``Ledger.update_host`` may write: every HostRow column but its name, its lease
    (``Ledger.lease_transition``) and its hold (``Ledger.change_hold``)."""

    kind: str
    target: str
    root: str
    python: str
    profile: str
    agent_bundle: str
    slots_kind: str
    slots_total: int
    price_per_hour: float | None
    unreachable_since: float | None
    last_probe_at: float | None
    created_at: float
    port: int
    user: str
    key_path: str
    host_key: str
    train_device: str
    disk_free_bytes: int | None
    min_free_gb: float
    health: str
    health_at: float | None
    health_detail: str
    probe_failures: int
    next_probe_at: float | None
    kernel_cursor: str
    oom_kill: int | None
    provider: str
    instance_id: str
    spot: bool
    bid_per_gpu: float | None
    gpu_type: str
    gpu_count: int
    region: str
    replaces: str
    slurm: str
    instance_name: str
    down_when_done: bool
    gpu_facts: str


class Sweep(SQLModel, SweepMethods, table=True):
    id: str = Field(primary_key=True)
    queue_path: str
    workdir: str
    queue_text: str  # the parsed copy: the file is never read again
    bundle_sha: str = ""
    job_count: int
    created_at: float
    hosts: str = ""  # v2: comma-separated hosts the user restricted the sweep to; "" = any host
    entry: str = ""  # v2: trainer path inside the bundle ("" = the bundled payload/train.py)
    launcher: str = "torchrun"  # v2: "torchrun" | "python"
    verify: str = "metrics,best_ckpt"  # v2: comma-separated finalize checks (protocol.py, job spec)
    run: str = ""  # v6: JSON of the project's [run] table (runconfig.RunConfig; names only, no secrets); "" = none
    git_commit: str = ""  # v10: the project's git commit at submit ("" = not a git checkout, or unknown)
    git_dirty: bool | None = None  # v10: uncommitted changes at submit (None = unknown)
    budget_usd: float | None = None  # v12: the sweep's spending cap in dollars (None = no cap)
    stop: str = ""  # v18: JSON of the sweep's stopping.policy.StopPolicy ("" = off; docs/stopping.md)


class Job(SQLModel, JobMethods, table=True):
    id: str = Field(primary_key=True)
    sweep_id: str = Field(foreign_key="sweep.id", index=True)
    name: str
    line: int
    raw: str
    config: str
    config_sha256: str
    task: str
    epochs: int  # 0: nothing gave the job epochs (specs.known_epochs); never shown as a number
    gpus: int
    nodes: int
    est_min: float | None = None
    seed: int | None = None
    host_pin: str | None = None
    retries: int
    spec_hash: str
    state: str = Field(index=True)
    host: str | None = None
    attempt_count: int = 0
    created_at: float
    updated_at: float
    # v6: your own trainer
    args: str = "[]"  # JSON list: the trainer arguments after `--`, grid-expanded
    cell: str = ""  # the line's name before grid/seed expansion
    # v14: the hardware it needs (docs/queue.md): GPU models joined by "|" ("" = any), GB per GPU (None = any)
    gpu: str = ""
    gpu_mem: float | None = None
    # v19: the result cache (docs/queue.md): what the job computes, and the job whose results it reuses
    content_key: str = ""  # sha256 of the spec, the code it runs and the [run]/[data] it reads ("" = none)
    reused_from: str = ""  # SUCCEEDED without running: the job id whose verified results it reuses ("" = ran)
    # v21: seeds=auto:MIN..MAX: the most seeds its cell may have (0 = a fixed number; tick/autoseeds.py)
    seeds_max: int = 0
    # v22: the part of its sweep that added it (1: the submit that made the sweep; each `submit --into`, the next)
    part: int = 1


class SweepPart(SQLModel, PartMethods, table=True):
    """One submit that added jobs to a sweep (v22): part 1 made it, each ``submit --into`` the next (docs/queue.md).
    Its jobs run with its bundle (``Job.part``); ``job_count``: the jobs it added."""

    __tablename__ = "sweep_part"
    __table_args__ = (Index("ux_sweep_part_number", "sweep_id", "number", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: str = Field(foreign_key="sweep.id", index=True)
    number: int
    queue_path: str
    queue_text: str  # the queue file as it was read for this part
    bundle_sha: str = ""
    job_count: int
    created_at: float


class Dependency(SQLModel, table=True):
    """v24: one ``after=`` edge (docs/queue.md): job ``job_id`` starts only once job ``needs_id`` SUCCEEDED, and
    gets its checkpoint as ``{checkpoint.<via>}`` / ``GPUQ_CHECKPOINT_<VIA>``; ``via`` is the name the line wrote."""

    __tablename__ = "dependency"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    needs_id: str = Field(foreign_key="job.id", index=True)
    via: str
    created_at: float


class Attempt(SQLModel, AttemptMethods, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    number: int
    host: str
    state: str
    bundle_sha: str
    resume_from: str = ""
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    trainer_code: int | None = None
    phase: str | None = None
    message: str = ""
    step: int | None = None
    total_steps: int | None = None
    epoch: int | None = None
    loss: float | None = None
    heartbeat_at: float | None = None
    log_bytes: int | None = None
    # v4: patrol
    log_scanned: int = 0  # job.log bytes already scanned for crash signatures
    metrics_scanned: int = 0  # result/metrics.jsonl bytes already scanned for non-finite loss
    # v5: cost and preemption
    price_per_hour: float | None = None  # the host's price when the attempt started (whole machine)
    gpu_share: float = 1.0  # the attempt's GPUs / the host's GPUs: its share of the price
    resumed_step: int | None = None  # the step the attempt resumed from (GPUQ_RESUMED), None = fresh
    lost_step: int | None = None  # preempted/lost: the last step seen; minus the checkpoint step = work lost
    # v9: multi-node over SSH hosts
    nodes: str = ""  # JSON list of the hosts of node ranks 0..K-1 (rank 0 is ``host``); "" = one host
    # v10: provenance
    provenance: str = ""  # JSON of host_documents.Provenance: GPUs, driver, CUDA, torch, NCCL, Python ("" = none yet)
    # v13: why the controller is withdrawing it unstarted from its host's inbox ("steal" | "budget"; "" = not)
    withdrawing: str = ""
    # v18: what gpuq saw, on its own clock (money/cost.billed_interval clamps started_at/ended_at to it), and
    # what the host claimed (kept, never billed)
    dispatched_at: float | None = None  # the spec's first dispatch (None: created_at)
    seen_running_at: float | None = None  # the first probe that saw it running
    seen_alive_at: float | None = None  # the latest probe that saw it running
    seen_ended_at: float | None = None  # the first probe that saw it ended
    host_started_at: float | None = None  # the host's claims, as it made them
    host_ended_at: float | None = None


class Event(SQLModel, EventMethods, table=True):
    id: int | None = Field(default=None, primary_key=True)
    time: float = Field(index=True)
    kind: str  # "job" | "attempt" | "host" | "sweep"
    subject: str = Field(index=True)
    old: str = ""
    new: str = ""
    message: str = ""
    # v4: patrol findings are events with a severity, the rule that fired and a suggested action
    severity: str = ""  # "" (a plain event) | "info" | "warn" | "escalate"
    rule: str = ""
    action: str = ""
    # v15: what an event says, in fields that are never read back from its words: the failure class the
    # settling decision or an "ended badly" finding names ("unknown": an older gpuq's words did not say),
    # a finding's reason without its subject's name, the attempt it speaks of (None: not said)
    failure_class: str = ""
    reason: str = ""
    attempt: int | None = None
    # v17: a crash finding's signature names as a JSON list ("": none; "unknown": an older gpuq's finding
    # did not name them); read as ``signature_names``
    signatures: str = ""


class Checkpoint(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    attempt: int
    file: str
    step: int
    epoch: int | None = None
    sha256: str
    bytes: int
    written_at: float
    durable: bool = False
    durable_path: str = ""  # v5: the controller's verified copy ($GPUQ_HOME/checkpoints/<job>/<file>)
    host: str = ""  # v5: the host that wrote it


class Artifact(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    attempt: int
    path: str
    bytes: int
    sha256: str
    verified_at: float


class Metric(SQLModel, table=True):
    # v11: a job's final and best rows without walking its learning curves (results, report)
    __table_args__ = (Index("ix_metric_job_id_scope", "job_id", "scope"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    attempt: int
    scope: str  # "final" | "best"
    name: str
    value: float
    step: int | None = None
    epoch: int | None = None


class StopLook(SQLModel, table=True):
    """v21: one look of a sweep's stopping policy at one cell and rung (stopping.rules.Look), stop or not,
    recorded before any job of the cell is stopped (docs/stopping.md); a cell is looked at once per rung."""

    __tablename__ = "stop_look"
    __table_args__ = (UniqueConstraint("sweep_id", "cell", "rung", name="uq_stop_look_cell_rung"),)

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: str = Field(foreign_key="sweep.id", index=True)
    cell: str
    rung: int
    step: int  # the rung's step in the cell's runs
    rule: str  # "baseline" | "halving"
    fraction: float
    cell_mean: float
    baseline_mean: float
    n_cell: int
    n_baseline: int
    statistic: float
    threshold: float
    p_value: float | None = None
    stop: bool
    decided_at: float


class Pull(SQLModel, table=True):
    """One outcome of ``gpuq pull`` for one job (v3).  The newest row of a job is its pull state.

    ``state``: "verified" (every file of the manifest matched; ``local_dir`` holds the copy and its
    PULL_VERIFIED.json), "quarantined" (verification failed; ``local_dir`` is the quarantine dir) or
    "incomplete" (transfer gave up; the staging dir is kept for the next pull to resume).
    """

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    attempt: int
    host: str
    state: str
    manifest_sha256: str = ""
    files: int = 0
    bytes: int = 0
    local_dir: str = ""
    reason: str = ""
    created_at: float = Field(index=True)
