"""The GPU preflight's verdict (``health``) and the VRAM-zombie reaper's report (``reap``),
docs/health.md, gpuq_health.py, gpuq_reap.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from orchestrator.host_documents.bounds import (
    MAX_GPUS,
    MAX_ITEMS,
    AnyInt,
    LenientFloat,
    LenientText,
    Open,
    Short,
    Text,
    objects_only,
)


class Check(Open):
    check: Text = ""
    status: Short = ""
    detail: Text = ""


class HealthGpu(Open):
    """What the preflight read of one GPU that gpuq keeps (gpumatch.py: the host's GPUs)."""

    name: LenientText = None
    memory_total_mib: LenientFloat = None


class HealthDocument(Open):
    verdict: Literal["pass", "warn", "fail"]
    host: Text = ""
    checks: Annotated[list[Check], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    gpus: Annotated[list[HealthGpu], Field(max_length=MAX_GPUS), BeforeValidator(objects_only)] = \
        Field(default_factory=list)

    def problems(self) -> list[Check]:
        """The checks that warn or fail."""
        return [c for c in self.checks if c.status in ("warn", "fail")]


class ReapCandidate(Open):
    """A process holding a GPU that no live attempt owns (secret-looking values already redacted)."""

    pid: AnyInt | None = None
    user: Text = ""
    comm: Text = ""
    age_s: LenientFloat = None
    devices: Annotated[list[Text], Field(max_length=MAX_GPUS + 16)] = Field(default_factory=list)
    cmdline: Text = ""


class ReapEntry(Open):
    pid: AnyInt | None = None
    outcome: Text = ""


class ReapDocument(Open):
    schema_: Annotated[Literal["gpuq.reap/1"], Field(alias="schema")]
    clean: bool | None = None
    dry_run: bool | None = None
    tool: Short = ""
    error: Text = ""
    candidates: Annotated[list[ReapCandidate], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    killed: Annotated[list[ReapEntry], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    notes: Annotated[list[Text], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
