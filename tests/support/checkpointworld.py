"""A job on the local host with the real agent, its checkpoints and the controller's copies: the world
of the checkpoint tests (tests/unit/test_ship_checkpoint.py, test_place_checkpoint.py and
test_place_run_checkpoint.py)."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec, job_id_for
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Job
from orchestrator.tick import checkpoints as ck
from tests.support.jobtree import SHA, install_agent
from tests.support.wire import status


def archive(payload: bytes | None = None) -> bytes:
    """A torch-format checkpoint (a zip with one ``<name>/data.pkl``) built without torch: by default a
    pickled state dict of plain values."""
    buf = io.BytesIO()
    stamp = (2026, 1, 1, 0, 0, 0)  # fixed, so that two calls give the same bytes (zip entries carry a time)
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("archive/data.pkl", stamp),
                    payload if payload is not None else pickle.dumps({"step": 8, "lr": 0.1}, protocol=2))
        zf.writestr(zipfile.ZipInfo("archive/version", stamp), "3\n")
    return buf.getvalue()


@dataclass
class World:
    ctx: Context
    root: Path  # the local host's root
    home: Path
    job: str

    def job_row(self) -> Job:
        return self.ctx.ledger.job(self.job)

    def save(self, step: int, data: bytes | None = None, *, metrics: str = "", best: bytes = b"") -> dict[str, Any]:
        """The payload writes a rolling checkpoint (and its metrics so far, and a best checkpoint)."""
        data = data if data is not None else archive()
        jdir = self.root / "jobs" / self.job
        (jdir / "ckpt").mkdir(parents=True, exist_ok=True)
        name = f"latest-{step:09d}.pt"
        (jdir / "ckpt" / name).write_bytes(data)
        pointer = {"file": name, "step": step, "epoch": 1, "sha256": hashlib.sha256(data).hexdigest(),
                   "bytes": len(data), "written_at": 1000.0 + step}
        (jdir / "ckpt" / "LATEST").write_text(json.dumps(pointer))
        if metrics:
            (jdir / "result").mkdir(exist_ok=True)
            (jdir / "result" / "metrics.jsonl").write_text(metrics)
        if best:
            (jdir / "ckpt" / "best.pt").write_bytes(best)
        return pointer

    def ship(self, pointer: dict[str, Any], **entry: Any) -> list[str]:
        row = self.ctx.ledger.host("local")
        assert row is not None
        doc = {"jobs": [{"job_id": self.job, "state": "running", "attempt": 1, "ckpt": pointer, **entry}]}
        return ck.ship_checkpoints(self.ctx, row, status(doc))

    def kept(self) -> list[str]:
        base = self.home / "checkpoints"
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())

    def events(self) -> list[str]:
        return [e.message for e in self.ctx.ledger.events(subject=self.job) if e.subject == self.job]


def running_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: str = "") -> Iterator[World]:
    """One RUNNING job of sweep qaaaaaa on the local host with the real agent; ``run`` is the
    sweep's [run] table as the ledger keeps it (JSON), for a project's own trainer."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUQ_HOME", str(home))
    ctx = open_context(overrides={"ship_checkpoints": "always"})
    local = ctx.fleet.local()
    install_agent(Path(local.root))
    ctx.ledger.update_host("local", agent_bundle=SHA)
    ctx.ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir=str(tmp_path), queue_text="",
                         jobs=[JobSpec(name="a", config="c.yaml", task="t")], default_retries=0, run=run)
    job = job_id_for("qaaaaaa", "a")
    ctx.ledger.start_attempt(job, host="local", bundle_sha=SHA)
    ctx.ledger.transition(job, AttemptState.RUNNING, attempt=1)
    ctx.ledger.transition(job, JobState.RUNNING)
    try:
        yield World(ctx, Path(local.root), home, job)
    finally:
        ctx.close()
