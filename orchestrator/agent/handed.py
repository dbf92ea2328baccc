"""What a job's dependencies hand it (``after=``, docs/queue.md): each one's verified checkpoint as a path on the
job's host, its line's ``{checkpoint.NAME}`` arguments rendered with it and ``GPUQ_CHECKPOINT_<NAME>`` set.

The checkpoint is placed there before the attempt is recorded (``tick/handover.py``: the dependency's newest
durable copy, the way a resume places one); the path follows from the ledger alone, so a spec sent again
(``tick/reconcile.py``) names the same file.  The controller renders these placeholders when it writes the
spec; the host never sees one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.core import protocol
from orchestrator.ledger import Checkpoint, HostRow, Job, Ledger
from orchestrator.queue.dependencies import env_name

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_MARK_RE = re.compile(r"\{(\{checkpoint\.(" + _NAME + r")\})\}|\{checkpoint\.(" + _NAME + r")\}")


def remote_path(root: str, source_id: str, file: str) -> str:
    """Where the checkpoint ``file`` of job ``source_id`` lies under a host's ``root``: a payload's rolling file in
    its ``ckpt/``, a project's own (``run/...``) at its path in the job dir."""
    parts = file.split("/") if file.startswith(protocol.RUN_DIR + "/") else [protocol.CKPT_DIR, file]
    return "/".join([root.rstrip("/"), "jobs", source_id, *parts])


def source_of(job: Job) -> str:
    """The job whose files a SUCCEEDED job's results are: the twin it reuses, else itself."""
    return job.reused_from or job.id


def newest_copy(ledger: Ledger, job_id: str) -> Checkpoint | None:
    """The job's newest checkpoint with a verified copy on the controller, or None."""
    rows = [c for c in ledger.checkpoints(job_id) if c.durable_path and Path(c.durable_path).exists()]
    return rows[-1] if rows else None


def handed_paths(ledger: Ledger, job: Job, row: HostRow | None) -> dict[str, str]:
    """{after= name: the path on ``row`` of that dependency's checkpoint} ("" when it has none, or no host)."""
    edges = ledger.dependencies([job.id]).get(job.id, [])
    if not edges:
        return {}
    needed = {j.id: j for j in ledger.jobs_by_ids([e.needs_id for e in edges])}
    out: dict[str, str] = {}
    for edge in edges:
        dep = needed.get(edge.needs_id)
        copy = newest_copy(ledger, source_of(dep)) if dep is not None else None
        out[edge.via] = remote_path(row.root, source_of(dep), copy.file) if copy and dep and row else ""
    return out


def render_args(args: Sequence[str], handed: Mapping[str, str]) -> tuple[str, ...]:
    """The line's arguments with ``{checkpoint.NAME}`` as its path (NAME compared case-insensitively) and a
    literal ``{{checkpoint.NAME}}`` as the text ``{checkpoint.NAME}``."""
    folded = {name.casefold(): path for name, path in handed.items()}

    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return match.group(1)
        return folded.get(match.group(3).casefold(), "")

    return tuple(_MARK_RE.sub(one, arg) for arg in args)


def handed_env(handed: Mapping[str, str]) -> dict[str, str]:
    """``GPUQ_CHECKPOINT_<NAME>``: each dependency's checkpoint path on the job's host."""
    return {env_name(name): path for name, path in handed.items()}
