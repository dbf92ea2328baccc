"""A pull's world for tests: a ledger with two finished jobs on a FakeHost whose link can break mid-file.

Used by tests/unit/test_transfer.py and tests/unit/test_pull_outcomes.py (`gpuq pull`'s transfer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import client
from orchestrator.core import protocol
from orchestrator.core.errors import HostUnreachable
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Job, Ledger
from orchestrator.transfer import pull_jobs
from tests.support.fakehost import FakeHost
from tests.support.jobtree import SHA, finished_job, install_agent

SWEEP = "qtest01"


class LinkHost(FakeHost):
    """A FakeHost whose link can break in the middle of a file.

    ``breaks[name]`` is a list of byte counts: each get of a remote file ending in ``name`` delivers
    that many more bytes, then fails like a dropped connection (HostUnreachable), or raises
    ``crash`` instead (a controller killed mid-copy).  Every get is recorded with its offset.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.breaks: dict[str, list[int]] = {}
        self.crash: type[BaseException] | None = None
        self.gets: list[tuple[str, int]] = []
        self.after_manifest: Callable[[], None] | None = None

    def run(self, argv: Any, *, stdin: bytes | None = None, timeout: float = 60.0) -> Any:
        result = super().run(argv, stdin=stdin, timeout=timeout)
        if "manifest" in argv and self.after_manifest is not None:
            self.after_manifest()
        return result

    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None,
            progress: Any = None, digest: Any = None) -> None:
        self.gets.append((remote, offset))
        plan = next((v for k, v in self.breaks.items() if remote.endswith(k) and v), None)
        if plan is None:
            super().get(remote, local, offset=offset, size=size, progress=progress, digest=digest)
            return
        deliver = plan.pop(0)
        self._check("get")
        with open(remote, "rb") as src, open(local, "r+b" if offset and local.exists() else "wb") as dst:
            dst.truncate(offset)
            dst.seek(offset)
            src.seek(offset)
            dst.write(src.read(deliver))
        if self.crash is not None:
            raise self.crash()
        raise HostUnreachable(self.name, "connection reset (fake, mid-file)")


@dataclass
class World:
    ledger: Ledger
    host: LinkHost
    root: Path
    home: Path
    jobs: list[Job]
    sleeps: list[float] = field(default_factory=list)

    @property
    def results(self) -> Path:
        return self.home / "results"

    @property
    def quarantine(self) -> Path:
        return self.home / "quarantine"

    def pull(self, jobs: list[Job] | None = None, **kw: Any) -> list[Any]:
        fresh = [self.ledger.job(j.id) for j in (jobs or self.jobs)]
        return pull_jobs(self.ledger, self.host, client.command(self.host, SHA), fresh, self.results, self.quarantine,
                         sleep=self.sleeps.append, jitter=lambda: 0.0, **kw)

    def final(self, job: Job) -> Path:
        return self.results / SWEEP / job.id

    def staging(self, job: Job) -> Path:
        return self.results / SWEEP / f"{job.id}.incoming"

    def remote(self, job: Job, rel: str) -> Path:
        return self.root / protocol.JOBS_DIR / job.id / rel


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    home = tmp_path / "home"
    ledger = Ledger(home / "ledger.db")
    host = LinkHost(tmp_path / "root")
    root = Path(host.root)
    install_agent(root)
    ledger.ensure_host(host.name, kind="local", root=host.root)
    specs = [JobSpec(name=n, config="c.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i, n in enumerate(["alpha", "beta"])]
    rows = ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                            default_retries=1)
    for row in rows:
        ledger.start_attempt(row.id, host=host.name, bundle_sha=SHA)
        ledger.transition(row.id, AttemptState.RUNNING, attempt=1)
        ledger.transition(row.id, JobState.RUNNING)
        ledger.transition(row.id, AttemptState.EXITED, attempt=1)
        ledger.transition(row.id, JobState.SUCCEEDED)
        finished_job(root, row.id, queue_id=SWEEP)
    yield World(ledger, host, root, home, [ledger.job(r.id) for r in rows])
    ledger.close()


