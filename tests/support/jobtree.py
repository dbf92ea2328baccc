"""Fabricated host-side files of a finished job, as the agent and the wrapper leave them.

No trainer runs: ``finished_job`` writes the claimed spec, the attempt's log and exit record, the
result files and a best checkpoint.  The checkpoint is a zip archive shaped like ``torch.save``
output (``archive/data.pkl`` holding a pickled dict), so tests need no torch; pass ``ckpt`` to
use real bytes (e.g. from torch.save).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import zipfile
from collections import OrderedDict
from pathlib import Path

from orchestrator.core import protocol
from tests.conftest import ROOT
from tests.support.jobspecs import spec_doc

SHA = "f" * 64  # the fake bundle every fabricated root carries


def install_agent(root: Path) -> None:
    """Copy the real agent into ``root/bundles/SHA/`` so ``agent.client.command(host, SHA)`` runs it."""
    target = root / protocol.BUNDLES_DIR / SHA / "payload" / "agent"
    if not target.exists():
        shutil.copytree(ROOT / "payload" / "agent", target, ignore=shutil.ignore_patterns("__pycache__"))


def fake_checkpoint(payload: object | None = None) -> bytes:
    """A zip archive shaped like torch.save output: ``archive/data.pkl`` + version records."""
    state = payload if payload is not None else {"model": OrderedDict(w=[1.0, 2.0]), "metrics": {"val_acc": 0.5}}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(state, protocol=2))
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def finished_job(root: Path, job_id: str, *, queue_id: str = "qtest01", attempt: int = 1, code: int = 0,
                 ckpt: bytes | None = None, extra: dict[str, bytes] | None = None) -> Path:
    """Write a job that exited ``code``; returns its ``jobs/<job_id>/`` directory."""
    jdir = root / protocol.JOBS_DIR / job_id
    adir = jdir / protocol.ATTEMPTS_DIR / str(attempt)
    rdir = jdir / protocol.RESULT_DIR
    cdir = jdir / protocol.CKPT_DIR
    for d in (adir, rdir, cdir, root / protocol.CLAIMED_DIR):
        d.mkdir(parents=True, exist_ok=True)
    (root / protocol.CLAIMED_DIR / f"{job_id}.json").write_text(json.dumps(
        spec_doc(job_id=job_id, queue_id=queue_id, attempt=attempt, name=job_id)))
    best = ckpt if ckpt is not None else fake_checkpoint()
    (cdir / protocol.BEST_CKPT).write_bytes(best)
    (cdir / protocol.LATEST_CKPT).write_bytes(b"rolling state, never pulled")
    (cdir / protocol.LATEST_POINTER).write_text('{"file": "latest.pt"}')
    lines = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in range(1, 40)]
    lines.append({"kind": "eval", "step": 39, "epoch": 1, "val_acc": 0.75})
    (rdir / protocol.METRICS_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    (rdir / protocol.SUMMARY_FILE).write_text(json.dumps({"final": {"val_acc": 0.75}, "best": {"val_acc": 0.8}}))
    (rdir / "plots").mkdir(exist_ok=True)
    (rdir / "plots" / "curve.csv").write_text("step,loss\n1,1.0\n2,0.5\n")
    (rdir / "summary.json.123.tmp").write_text("{half")  # an interrupted write: never a result
    for rel, data in (extra or {}).items():
        (jdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (jdir / rel).write_bytes(data)
    (adir / protocol.JOB_LOG).write_text("=== attempt 1\ntraining...\ndone\n")
    (adir / protocol.EXIT_FILE).write_text(json.dumps(
        {"job_id": job_id, "attempt": attempt, "wrapper_code": code, "trainer_code": code, "phase": "finalize",
         "best_sha256": sha256(best), "message": ""}))
    return jdir


def pulled_paths(attempt: int = 1) -> set[str]:
    """The paths a manifest of ``finished_job`` lists."""
    return {"result/metrics.jsonl", "result/summary.json", "result/plots/curve.csv", "ckpt/best.pt",
            f"attempts/{attempt}/job.log", f"attempts/{attempt}/exit.json"}
