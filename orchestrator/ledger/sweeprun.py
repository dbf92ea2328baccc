"""A sweep's ``[run]`` table as the ledger stores it (``Sweep.run``, JSON text since ledger v6): the
project's validated ``runconfig.RunConfig`` plus what submit computed beside it, the setup hook's key
(``setup_key``) and the ``[data]`` trees the jobs use (``data``).  Parsed here and nowhere else:
``Sweep.run_config()`` (``rowmethods.py``) answers the same for the Ledger's rows and the read path's
records.

The text was validated when the sweep was submitted, so reading it applies no policy again (which names
may be forwarded is checked once more as each spec leaves, ``launcher.enqueue_payload``); it only
holds the value to its types.  Keys this version does not know (a newer gpuq's) are ignored; keys an
older gpuq did not write take their defaults.  A value that is not such a table (not JSON, not an
object, a field of the wrong type) is read as an *unreadable* record: its fields are the defaults and
``unreadable`` says why, so `gpuq status` still draws the sweep, and no spec is built from it
(``launcher.run_spec`` refuses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

UNREADABLE_CHARS = 200  # the reason an unreadable record gives, at most


class DataRef(BaseModel):
    """One ``[data]`` entry as the jobs get it: its tree id and, for a single file or URL, the file's name
    inside the tree ("" for a directory); never a local path (``datasets.wire``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tree: str
    file: str = ""


class SweepRun(BaseModel):
    """The stored ``[run]`` table: ``RunConfig``'s keys (tests/unit/test_sweeprun.py keeps them the same)
    plus ``setup_key`` and ``data``."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    project: str = "."
    command: tuple[str, ...] = ()  # () = the bundled payload's command
    launcher: Literal["torchrun", "python", "none"] = "torchrun"
    setup: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    forward_env: tuple[str, ...] = ()  # names only, never values
    checkpoint: tuple[str, ...] = ()
    resume_args: tuple[str, ...] = ()
    smoke_args: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    metrics: str = ""
    metrics_regex: str = ""
    metric: str = ""
    mode: Literal["max", "min"] = "max"
    progress: str = ""
    verify: tuple[Literal["metrics", "best_ckpt"], ...] = ()
    setup_key: str = ""  # sha256 hex of what the setup hook depends on ("" = no setup): runconfig.setup_key
    data: dict[str, DataRef] = Field(default_factory=dict)  # {NAME: tree and file}: transfer/datasync.py
    unreadable: str = Field(default="", exclude=True)  # why the stored text could not be read ("" = it was)

    @classmethod
    def recorded(cls, table: Mapping[str, Any], *, setup_key: str, data: Mapping[str, Mapping[str, str]]) -> SweepRun:
        """What submit records: the validated table (``RunConfig.wire()``), its setup key and [data] trees."""
        return cls.model_validate({**table, "setup_key": setup_key, "data": data}, strict=False)

    def text(self) -> str:
        """The JSON the ledger stores (``data`` only when there is some, as submit has always written it)."""
        return self.model_dump_json(exclude={"data"} if not self.data else None)


def parse_run(stored: str) -> SweepRun | None:
    """The sweep's ``[run]`` from the ledger's text: None when it has none (""), an unreadable record
    (``SweepRun.unreadable``) when the text is not such a table."""
    if not stored.strip():
        return None
    try:
        return SweepRun.model_validate_json(stored)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        why = f"{where}: {err['msg']}" if where else err["msg"]
        return SweepRun(unreadable="".join(c for c in why if c.isprintable())[:UNREADABLE_CHARS])
