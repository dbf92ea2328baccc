"""Frozen value types that cross module boundaries."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

DEFAULT_EPOCHS = 20
MAX_SLOTS = 100_000
"""The most slots one host may have: a count a host reports (or the ledger kept) becomes a list this
long (a slot's free time), so it is bounded at the edge and clamped again where it becomes a size.
A Slurm host's slots are its job cap (at most 100,000, ``slurm_hosts``)."""


def known_epochs(epochs: int | None) -> int | None:
    """A job's epochs as shown: None when nothing gave them (the ledger keeps 0 for "not given")."""
    return epochs if epochs else None


def clamp_slots(count: int) -> int:
    """A slot count fit to size a list: 0..MAX_SLOTS (docs/security.md, a host reporting 10**12 slots)."""
    return min(max(int(count), 0), MAX_SLOTS)


class JobSpec(BaseModel):
    """One validated queue-file line (an ablation cell).

    ``config`` is a POSIX path relative to the project root ("" for a line without one);
    ``config_sha256`` is the hash of its bytes at validation time.
    ``line`` and ``raw`` are for display only: they never take part in identity.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    config: str
    task: str
    epochs: int | None = DEFAULT_EPOCHS  # None: neither the line, the config nor the command gives epochs
    gpus: int = 1
    nodes: int = 1
    est_min: float | None = None
    seed: int | None = None
    host: str | None = None
    retries: int | None = None
    rerun: bool = False  # `rerun=true`: run it even when the result cache holds its verified success
    gpu: tuple[str, ...] = ()  # `gpu=`: the GPU models it may run on, any one of them (() = any; gpumatch.py)
    gpu_mem: float | None = None  # `gpu_mem=`: GB (10^9 bytes) of memory each of its GPUs needs at least (None = any)
    config_sha256: str = ""
    args: tuple[str, ...] = ()  # trainer arguments after `--`, grid-expanded, literal
    cell: str = ""  # the line's name before grid/seed expansion ("" = the job's own name)
    after: tuple[str, ...] = ()  # `after=`: the cells or jobs it waits for, as the line names them
    seeds_max: int = 0  # seeds=auto:MIN..MAX: the most seeds its cell may have (0 = a fixed number; not identity)
    line: int = 0
    raw: str = ""


class DependencyEdge(BaseModel):
    """One ``after=`` edge between two expanded jobs: ``job`` starts only once ``needs`` SUCCEEDED; ``via`` is
    the name the line wrote (``after=VIA``; ``{checkpoint.VIA}`` and ``GPUQ_CHECKPOINT_<VIA>``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    needs: str
    via: str


class ParsedQueue(BaseModel):
    """A whole, valid queue file: its jobs (and their ``after=`` edges) plus warnings that never block a submit."""

    model_config = ConfigDict(frozen=True)

    path: str
    workdir: str
    jobs: tuple[JobSpec, ...]
    warnings: tuple[str, ...] = Field(default_factory=tuple)
    edges: tuple[DependencyEdge, ...] = Field(default_factory=tuple)


class CommandResult(BaseModel):
    """What one command on a host did."""

    model_config = ConfigDict(frozen=True)

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float


class HostSlots(BaseModel):
    """A host's capacity as the scheduler sees it.

    ``slot_free_at`` gives, for each of the ``total`` slots, the seconds from
    now until it frees (0 = free now).  When it is empty, ``busy`` slots are
    busy for an unknown time (the scheduler documents what it assumes) and
    the rest are free now.  ``disk_free_bytes`` is the disk budget for new
    jobs (None = unknown = no limit).  ``reason`` says why an unusable host is
    unusable ("unreachable since ...", "unhealthy: ...").  ``speed`` scales
    durations: a job estimated at ``est_s`` takes ``est_s / speed`` here.
    """

    model_config = ConfigDict(frozen=True)

    host: str
    total: Annotated[int, BeforeValidator(clamp_slots)]  # a count a host reported: never more than MAX_SLOTS
    busy: Annotated[int, BeforeValidator(clamp_slots)] = 0
    usable: bool = True
    slot_free_at: tuple[float, ...] = ()
    disk_free_bytes: int | None = None
    reason: str = ""
    job_slots: int = 0  # > 0: every job takes this many slots here whatever its GPUs (a Slurm host: 1)
    max_gpus: int | None = None  # the most GPUs one job may ask for here (a Slurm node's GRES), None = total
    max_nodes: int = 1  # the most nodes one job may span here (a Slurm partition's nodes)
    gang: bool = False  # may be one node of a multi-node job spanning several hosts (an SSH host)
    speed: float = Field(default=1.0, gt=0)
    # its GPUs, for jobs with `gpu=` / `gpu_mem=` (gpumatch.py): the distinct models (() = no GPUs, None =
    # unknown) and the smallest GPU's memory.total in MiB (None = unknown)
    gpu_models: tuple[str, ...] | None = None
    gpu_mem_mib: float | None = None

    @model_validator(mode="after")
    def _slot_times_match_total(self) -> HostSlots:
        if self.slot_free_at and len(self.slot_free_at) != self.total:
            raise ValueError(
                f"host {self.host}: slot_free_at has {len(self.slot_free_at)} entries for {self.total} slots"
            )
        return self


class Assignment(BaseModel):
    """The scheduler's decision: this job goes to this host."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    host: str
    peers: tuple[str, ...] = ()  # a multi-node job across SSH hosts: the hosts of node ranks 1..K-1 (host is 0)
    start_s: float = 0.0  # planned start, seconds from now (a multi-node job is only sent when it is 0)


# --- identity (docs/queue.md) -----------------------------------------------------

_B32 = "abcdefghijklmnopqrstuvwxyz234567"


def new_queue_id(entropy: bytes) -> str:
    """``q`` + 6 lowercase base32 characters drawn from ``entropy`` (>= 4 bytes)."""
    value = int.from_bytes(entropy[:4], "big")
    chars = []
    for _ in range(6):
        chars.append(_B32[value & 31])
        value >>= 5
    return "q" + "".join(chars)


def job_id_for(queue_id: str, name: str) -> str:
    """Stable job id: ignores line numbers, neighbours and comments."""
    digest = hashlib.sha256(f"{queue_id}/{name.casefold()}".encode()).hexdigest()
    return "c" + digest[:12]


def spec_hash_for(job: JobSpec) -> str:
    """sha256 of the canonical JSON of the identity fields of a job."""
    identity: dict[str, object] = {
        "config": job.config,
        "config_sha256": job.config_sha256,
        "task": job.task,
        "epochs": job.epochs,
        "gpus": job.gpus,
        "nodes": job.nodes,
        "seed": job.seed,
        "name": job.name,
    }
    if job.args:  # an empty list leaves the hashes of jobs without arguments as they were
        identity["args"] = list(job.args)
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
