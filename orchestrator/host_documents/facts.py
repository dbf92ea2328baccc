"""What `gpuq hosts add` learns about a host (its audit script, orchestrator/fleet.py), and the
per-job verdicts of ``enqueue`` / ``withdraw`` / ``cancel``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, RootModel

from orchestrator.host_documents.bounds import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_ITEMS,
    MAX_JOBS,
    Count,
    Open,
    Short,
    Text,
)


class AuditGpu(Open):
    index: Annotated[int, Field(ge=0, lt=MAX_GPUS)]
    name: Text = ""


class HostFacts(Open):
    home: Text = ""
    root: Annotated[str, Field(min_length=1, max_length=4096)]
    python: Text = ""
    version: Annotated[list[Annotated[int, Field(ge=0, le=1_000_000)]], Field(min_length=1, max_length=5)]
    writable: bool = False
    error: Text = ""
    free_bytes: Count | None = None
    gpus: Annotated[list[AuditGpu], Field(max_length=MAX_GPUS)] = Field(default_factory=list)
    gpu_error: Text | None = None
    cpus: Annotated[int, Field(ge=1, le=MAX_CPUS)] = 1


class SlurmPartition(Open):
    """One line of ``sinfo --format=%P|%a|%D|%G|%c|%l`` as the Slurm audit reports it."""

    name: Short = ""
    default: bool = False
    avail: Short = ""
    nodes: Annotated[str, Field(max_length=9)] = ""  # sinfo's %D: digits (a longer count is no sane one)
    gres: Annotated[str, Field(max_length=256)] = ""

    def node_count(self) -> int:
        return int(self.nodes) if self.nodes.isdigit() else 0


class SlurmAudit(Open):
    """What `gpuq hosts add --slurm` learns on the login node (slurm_hosts.AUDIT)."""

    missing: Annotated[list[Text], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    partitions: Annotated[list[SlurmPartition], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    probe: Short = ""  # "shared" | "not_shared" | "pending" | "failed" | "" (not tried)
    probe_detail: Text = ""
    versions: Annotated[dict[Short, Text], Field(max_length=16)] = Field(default_factory=dict)

    @property
    def sbatch_version(self) -> str:
        return self.versions.get("sbatch", "")


class Verdicts(RootModel[Annotated[dict[Short, Short], Field(max_length=MAX_JOBS)]]):
    """enqueue / withdraw / cancel: {job_id: verdict}."""

    def of(self, job_id: str) -> str:
        """The verdict on ``job_id`` ("" when the host said nothing about it)."""
        return self.root.get(job_id, "")
