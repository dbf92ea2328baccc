"""FakeHost: a LocalHost whose transport can be cut, and which counts round trips."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.core.errors import HostUnreachable
from orchestrator.core.specs import CommandResult
from orchestrator.hosts.base import Digest, Progress
from orchestrator.hosts.local import LocalHost


class FakeHost(LocalHost):
    """Runs for real under ``root``; ``down = True`` makes every call fail like a dropped link."""

    def __init__(self, root: Path, *, name: str = "fake") -> None:
        super().__init__(root, name=name)
        self.down = False
        self.calls: list[tuple[str, ...]] = []

    def _check(self, what: str) -> None:
        self.calls.append((what,))
        if self.down:
            raise HostUnreachable(self.name, "connection refused (fake link cut)")

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        self.calls.append(tuple(argv))
        if self.down:
            raise HostUnreachable(self.name, "connection refused (fake link cut)")
        return super().run(argv, stdin=stdin, timeout=timeout)

    def put(self, local: Path, remote: str, *, progress: Progress | None = None) -> None:
        self._check("put")
        super().put(local, remote, progress=progress)

    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None,
            progress: Progress | None = None, digest: Digest | None = None) -> None:
        self._check("get")
        super().get(remote, local, offset=offset, size=size, progress=progress, digest=digest)
