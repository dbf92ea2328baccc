"""The bounds every host document is checked against, and the field types built from them.

A rented host is someone else's machine: every count it reports is bounded here to a sane limit, so
no number from a host becomes a list length, a loop bound or a column value the ledger cannot hold
(docs/security.md).  Floats a host reports are finite: a NaN or an infinity never passes the edge.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from orchestrator.core.specs import MAX_SLOTS

MAX_DOCUMENT_CHARS = 64 * 1024 * 1024  # what one answer may weigh; the transport caps output too
MAX_JOBS = 20_000  # job entries in one status document
MAX_GPUS = 1_024  # GPUs of one host (and a GPU's index)
MAX_NODES = 1_024  # nodes of one multi-node attempt
MAX_CPUS = 65_536  # CPUs one host reports (a CPU host's slots)
MAX_ATTEMPTS = 1_000_000  # attempts of one job
MAX_FILES = 200_000  # files in one collect / manifest entry
MAX_ITEMS = 10_000  # any other list (scan hits, checks, reap candidates, verdicts)
MAX_STR = 256 * 1024  # any one string the controller reads
MAX_ID = 128  # job ids, states, schema names
MAX_INT = 2**63 - 1  # byte counts, offsets, steps: what SQLite's INTEGER holds
MAX_CURVES = 8  # learning curves per job (the headline metric and loss-like ones; gpuq report)
MAX_CURVE_POINTS = 1_000  # points per curve (the agent sends at most 200)
MAX_PCT = 1_000.0  # a percentage (a few tools report slightly over 100)
MAX_HOST_RETRIES = 20  # attempts one status entry says its host retried: the agent's own bound (gpuq_retry.MAX_CHAIN)
MAX_LINE = 300  # one line a host's agent says of a retry (why, where it saved stacks): cut there, never refused

Short = Annotated[str, Field(max_length=MAX_ID)]
Text = Annotated[str, Field(max_length=MAX_STR)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# numbers are JSON numbers (strict: never a string, never a bool)
Count = Annotated[int, Field(ge=0, le=MAX_INT, strict=True)]
AnyInt = Annotated[int, Field(ge=-MAX_INT, le=MAX_INT, strict=True)]
SlotCount = Annotated[int, Field(ge=0, le=MAX_SLOTS, strict=True)]
Attempt = Annotated[int, Field(ge=0, le=MAX_ATTEMPTS, strict=True)]
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-1e300, le=1e300, strict=True)]
Pct = Annotated[float, Field(allow_inf_nan=False, ge=0.0, le=MAX_PCT, strict=True)]


def none_if_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A value a trainer or a tool wrote (a heartbeat, a log's progress): one that does not fit its
    type and bounds is dropped (None), not a reason to refuse the whole document."""
    try:
        return handler(value)
    except ValidationError:
        return None


def _stamp(value: Any) -> float | None:
    """Agent documents carry ISO-8601 UTC strings; the payload's heartbeat carries epoch floats."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) and abs(value) < 1e12 else None
    if isinstance(value, str) and value and len(value) <= MAX_ID:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            return None
    return None


def one_line(value: Any) -> str | None:
    """A line a host's agent says (why it retried an attempt, where it saved stacks), as an event will
    carry it: on one line, printable, cut to ``MAX_LINE`` characters; not a string: none."""
    if not isinstance(value, str):
        return None
    flat = " ".join("".join(c if c.isprintable() else " " for c in value[:MAX_LINE * 4]).split())
    return flat if len(flat) <= MAX_LINE else flat[:MAX_LINE - 1] + "…"


LenientInt = Annotated[AnyInt | None, WrapValidator(none_if_invalid)]
LenientCount = Annotated[Count | None, WrapValidator(none_if_invalid)]
LenientFloat = Annotated[Finite | None, WrapValidator(none_if_invalid)]
LenientPct = Annotated[Pct | None, WrapValidator(none_if_invalid)]
LenientText = Annotated[Text | None, WrapValidator(none_if_invalid)]
Line = Annotated[str | None, BeforeValidator(one_line)]
Stamp = Annotated[float | None, BeforeValidator(_stamp)]
"""A time a host reports, as epoch seconds: an ISO-8601 string or a number; None when unreadable."""


def objects_only(value: Any) -> Any:
    """A list of records a host reports (Xids, scan hits, ...): an item that is not a JSON object is
    dropped, as the rules always ignored it; the list's own type and length are still checked."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def object_or_none(value: Any) -> Any:
    """A section a trainer's file fills (heartbeat, pointer, exit record): not a JSON object, none."""
    return value if isinstance(value, dict) else None


def finite_number(value: Any) -> float | None:
    """A real number that is finite (never a bool, NaN or an infinity), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float
        return None
    return number if math.isfinite(number) else None


class Open(BaseModel):
    """Known fields checked; unknown ones kept (a newer minor protocol adds optional fields), never
    read: the controller reads named fields only."""

    model_config = ConfigDict(extra="allow", str_max_length=MAX_STR, allow_inf_nan=False, frozen=True)
