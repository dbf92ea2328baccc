"""May a project's own checkpoint written on one host be placed on another?  (``checkpoint_trust``,
docs/checkpoints.md, docs/security.md.)

gpuq's payload checkpoints are read opcode by opcode on the controller before they are kept, so a
host cannot use one to run code elsewhere.  A project's own checkpoint is any format the project's
trainer reads (often ``torch.load`` with full pickle): gpuq checks its size and sha256 in transit,
never its content.  A host that turned hostile could plant one whose loading runs code in the next
attempt, on whatever host that attempt runs.  With ``checkpoint_trust = "same-host"`` such a file
goes back only to a host that wrote it: the host of that attempt, or any node of that multi-node
attempt (the nodes of one job trust each other, docs/multinode.md); the job waits for such a host
rather than resuming elsewhere.  ``"any-host"`` (the default) places it anywhere, as gpuq's own.

Pure: data in, a decision out; the caller reads the ledger and raises.
"""

from __future__ import annotations

from collections.abc import Collection

from orchestrator.core import protocol

ANY_HOST = "any-host"
SAME_HOST = "same-host"


def is_project_checkpoint(file: str) -> bool:
    """A project's own checkpoint is named by its path in the run dir (``run/...``)."""
    return file.startswith(protocol.RUN_DIR + "/")


def placement_refusal(trust: str, file: str, written_by: Collection[str], target: str) -> str | None:
    """None when the checkpoint ``file``, written by the hosts ``written_by``, may be placed on
    ``target``; else why not, in one line.  Only a project's own checkpoint is ever refused, and only
    under ``same-host``; an empty ``written_by`` (the writer unknown) is refused there too."""
    if trust != SAME_HOST or not is_project_checkpoint(file) or target in written_by:
        return None
    where = ", ".join(sorted(h for h in written_by if h)) or "an unrecorded host"
    return (f"checkpoint_trust = \"same-host\": the project's own checkpoint {file} was written on {where} and "
            f"is not placed on {target} (gpuq cannot check what loading it runs); the job waits for that host, "
            "or set checkpoint_trust = \"any-host\" to resume it elsewhere")
