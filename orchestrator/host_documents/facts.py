"""What `gpuq hosts add` learns about a host (its audit script, orchestrator/fleet/registry.py), the
per-job verdicts of ``enqueue`` / ``withdraw`` / ``cancel``, who retries each ended attempt
(``decide-retry``), and what ``stop-agent`` did."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, RootModel

from orchestrator.host_documents.bounds import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_JOBS,
    Count,
    LenientFloat,
    LenientInt,
    LenientText,
    Line,
    Open,
    Short,
    Text,
    object_or_none,
)
from orchestrator.host_documents.status import ExitRecord


class AuditGpu(Open):
    index: Annotated[int, Field(ge=0, lt=MAX_GPUS)]
    name: Text = ""
    memory_total_mib: LenientFloat = None  # an older audit sent the text nvidia-smi printed: unknown


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


class Verdicts(RootModel[Annotated[dict[Short, Short], Field(max_length=MAX_JOBS)]]):
    """enqueue / withdraw / cancel: {job_id: verdict}."""

    def of(self, job_id: str) -> str:
        """The verdict on ``job_id`` ("" when the host said nothing about it)."""
        return self.root.get(job_id, "")


class RetryDecision(Open):
    """Who starts attempt n+1 (attempts/<n>/next.json): "host" (its agent already did: ``attempt``) or
    "controller" (gpuq settles it)."""

    by: Literal["host", "controller"]
    attempt: LenientInt = None
    klass: Annotated[LenientText, Field(alias="class")] = None
    why: Line = None
    stacks: Line = None  # a stall the host healed: its agent's one line on the saved stacks
    exit: Annotated[ExitRecord | None, BeforeValidator(object_or_none)] = None  # "host": attempt n's end


class RetryDecisions(RootModel[Annotated[dict[Short, RetryDecision], Field(max_length=MAX_JOBS)]]):
    """``decide-retry``: {job_id: who starts its next attempt}."""


class AgentStop(Open):
    """``stop-agent``: "stopped", "none" (no agent ran), "busy" (refused: it has work) or "timeout"."""

    outcome: Literal["stopped", "none", "busy", "timeout"]
    pid: Count | None = None
    running: Annotated[list[Short], Field(max_length=MAX_JOBS)] = Field(default_factory=list)
    queued: Count = 0


def _not_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("a time, not true/false")
    return value


class SelfStopRecord(Open):
    """``selfstop.json``: what a rented host did to its own billing with no gpuq command for its lease
    (payload/agent/gpuq_serving/gpuq_selfstop.py).  Only its claimed time is read, and only as a claim."""

    action: Short = ""
    at_epoch: Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False, ge=0.0, le=1e11)]

