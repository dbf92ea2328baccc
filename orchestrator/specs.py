"""Frozen value types that cross module boundaries."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_EPOCHS = 20


class JobSpec(BaseModel):
    """One validated queue-file line (an ablation cell).

    ``config`` is a POSIX path relative to the queue file's directory (the
    workdir); ``config_sha256`` is the hash of its bytes at validation time.
    ``line`` and ``raw`` are for display only: they never take part in identity.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    config: str
    task: str
    epochs: int = DEFAULT_EPOCHS
    gpus: int = 1
    nodes: int = 1
    est_min: float | None = None
    seed: int | None = None
    host: str | None = None
    retries: int | None = None
    config_sha256: str = ""
    line: int = 0
    raw: str = ""


class ParsedQueue(BaseModel):
    """A whole, valid queue file: its jobs plus warnings that never block a submit."""

    model_config = ConfigDict(frozen=True)

    path: str
    workdir: str
    jobs: tuple[JobSpec, ...]
    warnings: tuple[str, ...] = Field(default_factory=tuple)
