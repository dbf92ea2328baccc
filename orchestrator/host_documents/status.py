"""The probe's document (``status --json``, schema "gpuq.status/1"): the host, its slots, GPUs, disk,
memory and kernel log, and one entry per job it holds (docs/host-protocol.md, gpuq_status.py).

Every field the controller reads is named here with its type and bounds; a count becomes at most
a sane size (slots, GPUs, nodes, attempts).  Values a trainer writes (its heartbeat, the progress
its log shows) are dropped when they do not fit, never a reason to refuse the host's document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from orchestrator.host_documents.bounds import (
    MAX_GPUS,
    MAX_HOST_RETRIES,
    MAX_ITEMS,
    MAX_JOBS,
    MAX_NODES,
    AnyInt,
    Attempt,
    Count,
    LenientCount,
    LenientFloat,
    LenientInt,
    LenientPct,
    LenientText,
    Line,
    Open,
    Short,
    SlotCount,
    Stamp,
    Text,
    object_or_none,
    objects_only,
)
from orchestrator.host_documents.provenance import Provenance
from orchestrator.host_documents.results import Partial, Pointer, Results

Objects = BeforeValidator(objects_only)  # a list of records: items that are no JSON object are dropped


class Slots(Open):
    kind: Short = ""
    total: SlotCount = 0
    free: SlotCount = 0


class Disk(Open):
    path: Text = ""
    total_bytes: Count | None = None
    free_bytes: Count | None = None
    used_pct: LenientPct = None
    inodes_total: Count | None = None
    inodes_free: Count | None = None
    inodes_used_pct: LenientPct = None


class Memory(Open):
    source: Text = ""
    used_bytes: Count | None = None
    limit_bytes: Count | None = None
    used_pct: LenientPct = None
    oom_kill: LenientCount = None  # not a count: unknown


class Agent(Open):
    alive: bool = False
    pid: LenientInt = None


class Xid(Open):
    ts: LenientFloat = None
    code: LenientInt = None
    pci: LenientText = None
    line: Text = ""


class OomKill(Open):
    ts: LenientFloat = None
    pid: LenientInt = None
    line: Text = ""


class Kernel(Open):
    readable: bool | None = None
    error: Text = ""
    cursor: Text | None = None
    xids: Annotated[list[Xid], Field(max_length=MAX_ITEMS), Objects] = Field(default_factory=list)
    oom_kills: Annotated[list[OomKill], Field(max_length=MAX_ITEMS), Objects] = Field(default_factory=list)


class Gpu(Open):
    index: Annotated[int, Field(ge=0, lt=MAX_GPUS)] | None = None
    name: Text = ""
    uuid: Text = ""
    util_pct: LenientPct = None
    mem_used_mib: LenientFloat = None
    mem_total_mib: LenientFloat = None
    temp_c: LenientFloat = None


class ExitRecord(Open):
    """The attempt's exit.json (the wrapper's, or one the agent wrote for a group that vanished)."""

    job_id: LenientText = None
    attempt: LenientInt = None
    wrapper_code: AnyInt | None = None
    trainer_code: AnyInt | None = None
    wrapper_signal: LenientInt = None
    message: Text | None = None
    phase: LenientText = None  # "setup" | "gate" | "train" | "finalize"
    started_at: Stamp = None
    ended_at: Stamp = None
    last_step: LenientInt = None
    last_epoch: LenientInt = None
    vanished: bool = False  # the agent wrote it: the wrapper's whole group died (kill -9)
    slurm_time_limit: bool = False  # stopped near its Slurm time limit (one chunk of a longer run)
    setup_failed: bool = False  # the project's setup failed before training (setup_holds)
    setup_tail: LenientText = None

    @property
    def code(self) -> int:
        """The wrapper's exit code (-1 when it wrote none)."""
        return -1 if self.wrapper_code is None else self.wrapper_code


class ScanHit(Open):
    signature: Text = ""
    line: Text = ""


class NonFinite(Open):
    """A metrics line with a NaN or infinite loss (the value as the agent quoted it)."""

    step: LenientInt = None
    epoch: LenientInt = None
    kind: LenientText = None
    field: LenientText = None
    value: LenientText = None


class Resumed(Open):
    """A GPUQ_RESUMED line among the log's new bytes: where the trainer resumed from."""

    step: LenientInt = None
    epoch: LenientInt = None
    sha256: LenientText = None


class Scan(Open):
    log_to: Count = 0
    metrics_to: Count = 0
    hits: Annotated[list[ScanHit], Field(max_length=MAX_ITEMS), Objects] = Field(default_factory=list)
    traceback: Annotated[list[Text], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    resumed: Annotated[Resumed | None, BeforeValidator(object_or_none)] = None
    from_scratch: LenientText = None  # a retry that found no checkpoint to resume from (the wrapper's line)
    nonfinite: Annotated[list[NonFinite], Field(max_length=MAX_ITEMS), Objects] = Field(default_factory=list)


class Heartbeat(Open):
    """The trainer's heartbeat file (rank 0 of gpuq's payload, or a project's own trainer)."""

    time: Stamp = None
    step: LenientInt = None
    total_steps: LenientInt = None
    epoch: LenientInt = None
    epochs: LenientInt = None
    loss: LenientFloat = None
    lr: LenientFloat = None
    phase: LenientText = None
    steps_per_s: LenientFloat = None


class Progress(Open):
    """What the log's tail says of a trainer without a heartbeat (gpuq_observe.parse_progress)."""

    step: LenientInt = None
    total: LenientInt = None
    epoch: LenientInt = None
    epochs: LenientInt = None
    loss: LenientFloat = None
    pct: LenientPct = None
    line: LenientText = None
    source: LenientText = None


class SlurmJob(Open):
    """Slurm's word on a job of a Slurm host (squeue): its id, state and pending reason."""

    id: Annotated[str, Field(max_length=32, pattern=r"^[0-9]*$")] = ""
    state: Short = ""
    reason: Annotated[str, Field(max_length=256)] = ""
    nodes: Annotated[str, Field(max_length=256)] = ""


class SlurmSection(Open):
    jobs: Annotated[int, Field(ge=0, le=MAX_JOBS)] = 0
    error: Annotated[str, Field(max_length=1024)] = ""


class NodeRank(Open):
    rank: Annotated[int, Field(ge=0, lt=MAX_NODES)]
    host: Short = ""


JobState = Short  # "queued" | "withdrawn" | "claimed" | "running" | "exited" | "dead" (others: nothing said)


class HostRetry(Open):
    """An attempt the host's agent retried itself (gpuq_retry.chain): its exit record and why."""

    attempt: Attempt = 0
    exit: Annotated[ExitRecord | None, BeforeValidator(object_or_none)] = None
    klass: Annotated[LenientText, Field(alias="class")] = None
    why: Line = None
    stacks: Line = None  # a stall the host healed: its agent's one line on the saved stacks


class JobEntry(Open):
    job_id: Short
    name: LenientText = None
    queue_id: LenientText = None
    slurm: Annotated[SlurmJob | None, BeforeValidator(object_or_none)] = None
    # a multi-node attempt's machines
    nodes: Annotated[list[NodeRank], Field(max_length=MAX_NODES)] | None = None
    attempt: Attempt = 0
    state: JobState = ""
    boot_id: Short | None = None
    pgid: LenientInt = None
    group_alive: bool | None = None
    launched_at: Stamp = None
    cancel_requested: bool = False
    exit: Annotated[ExitRecord | None, BeforeValidator(object_or_none)] = None
    scan: Scan | None = None
    results: Results | None = None
    partial: Partial | None = None  # ``--curves-for``: a running job's curves so far (early stopping)
    slots: Annotated[list[SlotCount], Field(max_length=MAX_GPUS)] | None = None
    ckpt: Annotated[Pointer | None, BeforeValidator(object_or_none)] = None
    heartbeat: Annotated[Heartbeat | None, BeforeValidator(object_or_none)] = None
    heartbeat_age_s: LenientFloat = None
    log_mtime: LenientFloat = None
    log_bytes: Count | None = None
    progress: Annotated[Progress | None, BeforeValidator(object_or_none)] = None
    run_ckpt_mtime: LenientFloat = None
    run_metrics_mtime: LenientFloat = None  # protocol 1.x: the newest mtime of the files [run] metrics names
    gpu_util_pct: LenientPct = None
    provenance: Annotated[Provenance | None, BeforeValidator(object_or_none)] = None  # what the attempt ran with
    gang_cause: Text = ""  # set by the controller (gangs.standing_entry): the node that ended the attempt
    # attempts before this one that the host's agent retried itself, from the one the controller scanned on
    # (the agent reports at most MAX_HOST_RETRIES: a longer chain is a protocol error)
    host_retried: Annotated[list[HostRetry], Field(max_length=MAX_HOST_RETRIES), Objects] = Field(default_factory=list)

    @property
    def beat(self) -> Heartbeat | None:
        """The heartbeat when the trainer wrote one that says anything (an empty file says nothing)."""
        hb = self.heartbeat
        return hb if hb is not None and (hb.model_fields_set or hb.model_extra) else None

    @property
    def exit_or_empty(self) -> ExitRecord:
        """The exit record, or an empty one (code -1) when the host has none."""
        return self.exit if self.exit is not None else ExitRecord()


class StatusDocument(Open):
    schema_: Annotated[Literal["gpuq.status/1"], Field(alias="schema")]
    protocol: Short = ""
    hostname: LenientText = None
    boot_id: Short | None = None
    uptime_s: LenientFloat = None
    agent: Agent = Agent()
    slots: Slots = Slots()
    disk: Disk = Disk()
    memory: Memory | None = None
    kernel: Kernel | None = None
    gpus: Annotated[list[Gpu], Field(max_length=MAX_GPUS)] = Field(default_factory=list)
    bundles: Annotated[list[Short], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    jobs: Annotated[list[JobEntry], Field(max_length=MAX_JOBS)] = Field(default_factory=list)
    slurm: SlurmSection | None = None

    @classmethod
    def empty(cls) -> StatusDocument:
        """What a host that said nothing says."""
        return cls.model_validate({"schema": "gpuq.status/1"})

    def entries(self) -> dict[str, JobEntry]:
        """The job entries by job id."""
        return {j.job_id: j for j in self.jobs}

    def entry(self, job_id: str, attempt: int | None = None) -> JobEntry | None:
        """The entry of ``job_id`` (of that attempt when given), or None."""
        for job in self.jobs:
            if job.job_id == job_id and (attempt is None or job.attempt == attempt):
                return job
        return None

    def known_jobs_only(self, known: Callable[[str], bool]) -> StatusDocument:
        """The document without the jobs gpuq does not know (another controller sharing the host, or
        a job the ledger forgot): they are ignored, never written to the ledger."""
        kept = [j for j in self.jobs if known(j.job_id)]
        return self if len(kept) == len(self.jobs) else self.model_copy(update={"jobs": kept})
