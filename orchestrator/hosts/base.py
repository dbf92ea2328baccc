"""The Host seam: "a machine I can run commands on".

Commands are argument vectors, never shell strings: an implementation that
needs a shell (SSH) quotes every element itself, so no value from a queue
file or a spec can ever be interpreted by a remote shell.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from orchestrator.core.errors import HostError
from orchestrator.core.specs import CommandResult

Progress = Callable[[int], None]  # bytes transferred so far


class Digest(Protocol):
    """What ``Host.get`` feeds the bytes it writes to (a ``hashlib`` object): hashing while copying."""

    def update(self, data: bytes, /) -> None: ...


def too_big(host: str, remote: str, actual: int, expected: int) -> HostError:
    return HostError(host, f"{remote} is {actual} bytes, more than the {expected} expected; not downloaded "
                           "(a host cannot send more than its manifest says)")


class Host(ABC):
    """A machine that runs gpuq's host agent under ``root``."""

    name: str
    root: str
    python: str
    agent_flags: tuple[str, ...] = ()  # extra flags for this host's agent `serve` (slots, train device)

    @abstractmethod
    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        """Run ``argv`` and return what it did, whatever its exit code.

        Raises HostUnreachable when the command could not be run at all
        (transport failure, timeout); never CommandFailed: callers decide what
        a non-zero exit means.  Not idempotent in general: the command is.
        """

    @abstractmethod
    def put(self, local: Path, remote: str, *, progress: Progress | None = None) -> None:
        """Copy one local file to ``remote`` (created or replaced atomically).  ``progress`` is
        called with the bytes sent so far (for a progress bar).

        Raises HostUnreachable on transport failure.  Idempotent.
        """

    @abstractmethod
    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None,
            progress: Progress | None = None, digest: Digest | None = None) -> None:
        """Copy one remote file to ``local``, from byte ``offset`` on.

        ``size``: the size the caller expects (a manifest's): a larger remote file is refused with
        HostError and nothing past ``size`` is ever read, so a host cannot fill the controller's disk.
        ``progress`` is called with the bytes received so far.  ``digest``, when given, is fed every
        byte written to ``local`` (from ``offset`` on, in order) as it is written, so the caller hashes
        the copy without reading it again; after a failure what it holds is meaningless.

        ``offset == 0`` creates or truncates ``local``; ``offset > 0`` resumes a partial
        copy: ``local`` is cut to ``offset`` bytes and the rest is appended.  Raises
        HostError if the remote file is missing, HostUnreachable on transport failure
        (what arrived so far stays in ``local`` for the next resume).  Idempotent.
        """

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release connections.  Idempotent."""

    def path(self, *parts: str) -> str:
        """A path under this host's root (POSIX)."""
        return "/".join([self.root.rstrip("/"), *parts])
