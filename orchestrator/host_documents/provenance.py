"""What one attempt ran with, as its host says (``attempts/<n>/provenance.json``, the agent's
``gpuq_provenance.py``): GPU model and count, driver, CUDA, torch and NCCL versions, Python.

Host text: every field is a short printable string (control characters dropped, at most
``FIELD_CHARS``) or None; a field of the wrong type reads None ("unknown"), never a number gpuq
made up.  ``stored``/``from_stored`` are the ledger's JSON form (``Attempt.provenance``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError

from orchestrator.host_documents.bounds import MAX_GPUS, Open

FIELD_CHARS = 120
UNKNOWN = "unknown"


def _short_text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = "".join(c for c in value if c.isprintable()).strip()
    return text[:FIELD_CHARS] or None


def _gpu_count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
        return None
    return value


ShortText = Annotated[str | None, BeforeValidator(_short_text)]
GpuCount = Annotated[int | None, BeforeValidator(_gpu_count)]

SOFTWARE = ("driver", "cuda", "torch", "nccl", "python")
"""The fields that name software: seeds that differ in one of them ran on different software."""


class Provenance(Open):
    slot_kind: ShortText = None  # "gpu" | "cpu"
    gpu_model: ShortText = None  # "NVIDIA A100-SXM4-80GB" ("A + B" when the attempt's GPUs differ)
    gpu_count: GpuCount = None
    driver: ShortText = None
    cuda: ShortText = None  # the CUDA torch was built with ("none": a CPU build)
    torch: ShortText = None
    nccl: ShortText = None
    python: ShortText = None

    def stored(self) -> str:
        """The ledger's JSON (named fields only: what a host added beyond them is not kept)."""
        return json.dumps({k: getattr(self, k) for k in type(self).model_fields}, sort_keys=True)

    @classmethod
    def from_stored(cls, text: str) -> Provenance | None:
        """The ledger's JSON back (None for "" or anything unreadable)."""
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            return None

    def gpus(self) -> str:
        """``2 x NVIDIA H100 80GB HBM3``, ``CPU`` or ``unknown``."""
        if self.slot_kind == "cpu":
            return "CPU"
        if self.gpu_model is None:
            return UNKNOWN
        return f"{self.gpu_count} x {self.gpu_model}" if self.gpu_count else self.gpu_model

    def software(self) -> dict[str, str]:
        """driver, cuda, torch, nccl, python: each value or "unknown"."""
        return {k: getattr(self, k) or UNKNOWN for k in SOFTWARE}

    def line(self) -> str:
        """One line for a person: GPUs, then each version ("unknown" where the host could not say)."""
        parts = [self.gpus()] + [f"{k} {v}" for k, v in self.software().items()]
        return ", ".join(parts)
