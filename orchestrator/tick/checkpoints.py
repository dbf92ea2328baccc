"""Checkpoints off the box and back (docs/checkpoints.md): every tick, the newest checkpoint of each
running job on a rented host is copied to ``$GPUQ_HOME/checkpoints/<job>/`` (size and sha256 checked);
before a resumed attempt starts on a host that lacks it, the verified copy is pushed there.

Two kinds of checkpoint travel the same way:

- gpuq's payload: the rolling file ``ckpt/LATEST`` names (``latest-<step>.pt``), with ``best.pt`` and
  the metrics so far as companions;
- a project's own (``[run] checkpoint`` globs, docs/your-project.md): the newest matching file of the
  job's run dir, named ``run/<path>``, with the project's metrics file as companion.

Everything a host says here is untrusted (docs/security.md): only jobs the ledger assigned to that host
are shipped, job ids must be gpuq's, and a file name must be a plain rolling checkpoint name or a
clean ``run/`` path, so a host can never make the controller write outside the job's own directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from orchestrator import host_documents
from orchestrator.agent import client
from orchestrator.context import Context
from orchestrator.core import filenames, protocol
from orchestrator.core.config import Settings
from orchestrator.core.errors import GpuqError, HostError
from orchestrator.core.states import JobState
from orchestrator.health import checkpoint_trust
from orchestrator.host_documents import Pointer, ResultCheckpoint, SnapshotPointer, StatusDocument
from orchestrator.ledger import HostRow, Job
from orchestrator.transfer import ckptdir
from orchestrator.transfer import progress as transfer_progress
from orchestrator.transfer.verify import checkpoint_problem, file_sha256

CHECKPOINTS_DIR = "checkpoints"
JOB_ID_RE = re.compile(r"c[0-9a-f]{12}")
_ROLLING_RE = re.compile(r"latest(?:-[0-9]{1,12}(?:-[0-9]{1,3})?)?\.pt")
_MAX_DEPTH = 8
# what a payload job needs besides its rolling checkpoint to finish on another host: the best
# checkpoint so far and the metrics written so far (the payload trims lines past the checkpoint's step)
COMPANIONS = {"ckpt/best.pt": "best.pt", "result/metrics.jsonl": "metrics.jsonl"}
_ACTIVE = (JobState.ASSIGNED, JobState.RUNNING)


def safe_checkpoint_file(name: object) -> str | None:
    """``name`` if it is a payload rolling checkpoint (``latest-<step>.pt``) or a clean path under the
    run dir (``run/a/b.pt``: no ``..``, no hidden or odd components, at most 8 deep); else None."""
    if not isinstance(name, str):
        return None
    if _ROLLING_RE.fullmatch(name):
        return name
    parts = name.split("/")
    if len(parts) < 2 or len(parts) > _MAX_DEPTH + 1 or parts[0] != protocol.RUN_DIR:
        return None
    if filenames.path_problem("/".join(parts[1:])) is None:  # the agent's rule (gpuq_own.name_problem)
        return name
    return None


def ship_wanted(settings: Settings, row: HostRow) -> bool:
    if settings.ship_checkpoints == "never" or row.kind == "local":
        return False
    return settings.ship_checkpoints == "always" or bool(row.provider)


def _assigned(ctx: Context, host: str) -> dict[str, Job]:
    return {job.id: job for job in ctx.ledger.jobs(states=_ACTIVE) if job.host == host}


def _is_newer(have: Any, pointer: Pointer) -> bool:
    if have is None:
        return True
    if have.sha256 == pointer.sha256:
        return False
    if pointer.step is not None:
        return bool(pointer.step > have.step)
    mtime = pointer.mtime  # a project's checkpoint has no step: the newer file wins
    return mtime is not None and mtime > have.written_at


def ship_checkpoints(ctx: Context, row: HostRow, doc: StatusDocument) -> list[str]:
    """Copy the newest checkpoint of every running job the ledger assigned to ``row``.  A failed copy
    is retried next tick.  Returns the job ids shipped."""
    shipped = []
    assigned = _assigned(ctx, row.name)
    for entry in doc.jobs:
        if entry.state != "running":
            continue
        job_id = entry.job_id
        if not JOB_ID_RE.fullmatch(job_id) or job_id not in assigned:
            continue  # not gpuq's, or not this host's to report
        pointer = entry.ckpt
        own = entry.run_ckpt_mtime
        if pointer is not None and pointer.sha256:
            if not _is_newer(newest_durable(ctx, job_id), pointer):
                continue
        elif own is None:
            continue
        else:
            have = newest_durable(ctx, job_id)
            if have is not None and have.file.startswith(protocol.RUN_DIR + "/") and own <= have.written_at:
                continue
        if _ship_one(ctx, row, job_id, assigned[job_id], entry.attempt):
            shipped.append(job_id)
    return shipped


def _ship_one(ctx: Context, row: HostRow, job_id: str, job: Job, attempt: int) -> bool:
    target_dir = ctx.settings.home / CHECKPOINTS_DIR / job_id
    target_dir.mkdir(parents=True, exist_ok=True)
    host = ctx.fleet.host(row)
    fetched = _fetch_checkpoint(host, row.agent_bundle, job_id, target_dir)
    if isinstance(fetched, str):
        ctx.ledger.record_event("job", job_id, f"checkpoint copy from {row.name} failed: {fetched}",
                                unless_repeated=True)
        return False
    pointer, part = fetched
    name = pointer.file
    if not name.startswith(protocol.RUN_DIR + "/"):
        # gpuq's payload checkpoint: a torch archive of plain state, read by opcodes (never unpickled);
        # one that needs more than a state dict's globals is never kept, so never pushed to another host
        why = checkpoint_problem(part)
        if why is not None:
            part.unlink(missing_ok=True)
            ctx.ledger.record_event("job", job_id, f"checkpoint {name} from {row.name} refused: {why}; the "
                                    "controller keeps its previous copy", unless_repeated=True)
            return False
    previous = newest_durable(ctx, job_id)
    final = target_dir.joinpath(*name.split("/"))
    final.parent.mkdir(parents=True, exist_ok=True)
    ckptdir.swap_in(part, final) if pointer.dir else os.replace(part, final)
    recorded = ResultCheckpoint(sha256=pointer.sha256, file=name, step=pointer.step or 0, epoch=pointer.epoch,
                                bytes=pointer.bytes or 0, written_at=pointer.written_at)
    if name.startswith(protocol.RUN_DIR + "/"):
        # a project's checkpoint carries no step gpuq can read
        recorded = recorded.model_copy(update={"step": 0, "written_at": pointer.mtime or 0.0})
        _fetch_run_companions(ctx, host, job, target_dir)
    else:
        _fetch_companions(host, job_id, target_dir)
    _write_pointer(target_dir, pointer, recorded)
    if previous is not None and previous.durable_path:
        old = Path(previous.durable_path)
        if old != final and old.is_relative_to(target_dir):
            ckptdir.remove(old)  # one copy per job: the newest
    ctx.ledger.record_checkpoint(job_id, attempt or job.attempt_count, recorded)
    ctx.ledger.mark_checkpoint_durable(job_id, pointer.sha256, str(final), row.name)
    return True


def _fetch_companions(host: Any, job_id: str, target_dir: Path) -> None:
    for remote, local in COMPANIONS.items():
        _fetch_whole_lines(host, host.path("jobs", job_id, *remote.split("/")), target_dir / local)


def _run_metrics(ctx: Context, job: Job) -> str | None:
    """The project's metrics file (relative to the run dir) when the sweep names one."""
    sweep = ctx.ledger.sweep(job.sweep_id)
    run = sweep.run_config() if sweep is not None else None
    metrics = run.metrics if run is not None else ""
    if not metrics or metrics == "log":
        return None
    return metrics if safe_checkpoint_file(f"{protocol.RUN_DIR}/{metrics}") else None


def _fetch_run_companions(ctx: Context, host: Any, job: Job, target_dir: Path) -> None:
    metrics = _run_metrics(ctx, job)
    if metrics is not None:
        local = target_dir.joinpath(protocol.RUN_DIR, *metrics.split("/"))
        local.parent.mkdir(parents=True, exist_ok=True)
        _fetch_whole_lines(host, host.path("jobs", job.id, protocol.RUN_DIR, *metrics.split("/")), local)


def _fetch_whole_lines(host: Any, remote: str, local: Path) -> None:
    """Copy a growing text file up to its last complete line (a line being appended is left out)."""
    part = local.with_name(f".{local.name}.part")
    try:
        host.get(remote, part)
    except HostError:
        part.unlink(missing_ok=True)  # not written yet: nothing to carry
        return
    if not local.name.endswith(".pt"):
        data = part.read_bytes()
        part.write_bytes(data[:data.rfind(b"\n") + 1])
    os.replace(part, local)


def _fetch_checkpoint(host: Any, agent_bundle: str, job_id: str,
                      target_dir: Path) -> tuple[SnapshotPointer, Path] | str:
    """Copy the checkpoint the job's agent pins now, verified by size and sha256.  The agent first pins
    it as ``ckpt/.ship.pt``: a hard link of the payload's rolling file (a trainer that saves often
    rotates it away faster than a copy runs), a private copy of a project's own file (``torch.save`` to
    the same path rewrites it in place).  The pin goes when the copy is done.
    Returns (the pointer copied, the verified .part file), or why nothing could be copied."""
    pointer = client.snapshot(host, agent_bundle, job_id)
    if isinstance(pointer, str):
        return pointer
    name = safe_checkpoint_file(pointer.file)
    if name is None:
        return f"the pointer names an unsafe file {pointer.file[:80]!r}"
    snapshot = pointer.snapshot
    if snapshot != f"{protocol.CKPT_DIR}/{'.ship.d' if pointer.dir else '.ship.pt'}":
        return f"the agent pinned an unexpected file {snapshot[:80]!r}"
    sha, size = pointer.sha256, pointer.bytes  # sha256 checked at the edge
    if size is None:
        return "the pointer's sha256 or size is malformed"
    if pointer.dir:
        return _fetch_dir(host, job_id, pointer, target_dir)
    part = target_dir / ".checkpoint.part"
    remote = host.path("jobs", job_id, *snapshot.split("/"))
    try:
        with transfer_progress.track(f"checkpoint {job_id} <- {host.name}", size) as shown:
            host.get(remote, part, size=size, progress=shown)
        with contextlib.suppress(HostError):
            host.run(["rm", "-f", remote], timeout=60)
    except HostError as exc:
        part.unlink(missing_ok=True)
        return str(exc)
    if part.stat().st_size != size or file_sha256(part) != sha:
        part.unlink(missing_ok=True)
        return f"{name} did not match its pointer (torn or replaced)"
    return pointer, part


def _fetch_dir(host: Any, job_id: str, pointer: SnapshotPointer,
               target_dir: Path) -> tuple[SnapshotPointer, Path] | str:
    """A checkpoint directory: every file verified, then the tree (orchestrator/transfer/ckptdir.py)."""
    part = target_dir / ".checkpoint.part.d"
    remote = host.path("jobs", job_id, *pointer.snapshot.split("/"))
    try:
        with transfer_progress.track(f"checkpoint {job_id} <- {host.name}", pointer.bytes or 0):
            why = ckptdir.fetch_dir(host, job_id, pointer, part)
        with contextlib.suppress(HostError):
            host.run(["rm", "-rf", remote], timeout=60)
    except HostError as exc:
        shutil.rmtree(part, ignore_errors=True)
        return str(exc)
    return why if why is not None else (pointer, part)


def _write_pointer(directory: Path, pointer: SnapshotPointer, recorded: ResultCheckpoint) -> None:
    """The copy's LATEST: the host's pointer (not its pin), with the step and time the ledger records."""
    fields = pointer.model_dump(mode="json", exclude_unset=True, exclude={"snapshot"})
    if pointer.file.startswith(protocol.RUN_DIR + "/"):
        fields.update(step=recorded.step, written_at=recorded.written_at)
    tmp = directory / ".LATEST.tmp"
    tmp.write_text(json.dumps(fields, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, directory / "LATEST")


def newest_durable(ctx: Context, job_id: str) -> Any:
    """The newest checkpoint of the job with a verified copy on the controller, or None."""
    rows = [c for c in ctx.ledger.checkpoints(job_id) if c.durable_path and Path(c.durable_path).exists()]
    return rows[-1] if rows else None


def refresh_from(ctx: Context, job: Job, host_name: str) -> bool:
    """Copy the job's newest checkpoint home from ``host_name`` now, whatever the job's state (a
    multi-node job about to resume: every node must get the newest one).  True when a copy was kept."""
    row = ctx.ledger.host(host_name)
    if row is None:
        raise GpuqError(f"host {host_name} is no longer registered")
    return _ship_one(ctx, row, job.id, job, job.attempt_count)


def place_checkpoint(ctx: Context, job: Job, host_name: str, *, same_on_every_node: bool = False) -> str:
    """Before attempt n+1 starts on ``host_name``: make sure its newest checkpoint is there.  A host
    that already has a checkpoint at least as new keeps it; otherwise the controller's verified copy
    is pushed.  ``same_on_every_node`` (a multi-node job): the host keeps its own only when it is that
    very copy (same sha256), so every node loads the same checkpoint.  Returns what happened."""
    ckpt = newest_durable(ctx, job.id)
    if ckpt is None:
        return "no shipped checkpoint"
    if ckpt.file.startswith(protocol.RUN_DIR + "/"):
        wrote = ctx.ledger.attempt(job.id, ckpt.attempt)
        why = checkpoint_trust.placement_refusal(ctx.settings.checkpoint_trust, ckpt.file,
                                                 {ckpt.host, *(wrote.node_hosts() if wrote else [])}, host_name)
        if why is not None:
            raise GpuqError(why)
        return _place_run_checkpoint(ctx, job, host_name, ckpt)
    host = ctx.fleet.named(host_name)
    remote_dir = host.path("jobs", job.id, "ckpt")
    probe = host.run(["sh", "-c", 'cat "$1/LATEST" 2>/dev/null; true', "sh", remote_dir], timeout=60)
    with contextlib.suppress(host_documents.ProtocolError):
        there = host_documents.read_pointer(host_name, probe.stdout or "{}")
        step = there.step
        if same_on_every_node:
            if there.sha256 == ckpt.sha256:
                return f"kept the host's own checkpoint (step {step}, the same one)"
        elif step is not None and step >= ckpt.step:
            return f"kept the host's own checkpoint (step {step})"
    _mkdir(host, host_name, remote_dir)
    local_dir = Path(ckpt.durable_path).parent
    for remote, name in COMPANIONS.items():
        if (local_dir / name).is_file():
            target = host.path("jobs", job.id, *remote.split("/"))
            _mkdir(host, host_name, target.rsplit("/", 1)[0])
            host.put(local_dir / name, target)
    with transfer_progress.track(f"checkpoint {job.id} -> {host_name}", ckpt.bytes) as shown:
        host.put(Path(ckpt.durable_path), f"{remote_dir}/{ckpt.file}", progress=shown)
    pointer = {"file": ckpt.file, "step": ckpt.step, "epoch": ckpt.epoch, "sha256": ckpt.sha256,
               "bytes": ckpt.bytes, "written_at": ckpt.written_at}
    local = ctx.settings.home / CHECKPOINTS_DIR / job.id / ".LATEST.push"
    local.write_text(json.dumps(pointer, sort_keys=True) + "\n", encoding="utf-8")
    try:
        host.put(local, f"{remote_dir}/LATEST")
    finally:
        local.unlink(missing_ok=True)
    ctx.ledger.record_event("job", job.id, f"checkpoint step {ckpt.step} ({ckpt.sha256[:12]}) placed on {host_name}")
    return f"pushed checkpoint step {ckpt.step}"


def _place_run_checkpoint(ctx: Context, job: Job, host_name: str, ckpt: Any) -> str:
    """A project's own checkpoint goes back to the same path in the job's run dir (and its metrics
    file beside it), unless the host already holds those exact bytes."""
    host = ctx.fleet.named(host_name)
    remote = host.path("jobs", job.id, *ckpt.file.split("/"))
    if Path(ckpt.durable_path).is_dir():  # a checkpoint directory goes back whole, or not at all
        _place_run_metrics(ctx, job, host, host_name)
        if not ckptdir.place_dir(host, host_name, Path(ckpt.durable_path), remote):
            return "kept the host's own checkpoint (same files)"
        ctx.ledger.record_event("job", job.id, f"checkpoint {ckpt.file}/ ({ckpt.sha256[:12]}) placed on {host_name}")
        return f"pushed checkpoint {ckpt.file}/"
    probe = host.run(["sh", "-c", 'sha256sum "$1" 2>/dev/null; true', "sh", remote], timeout=120)
    if probe.stdout.split(" ", 1)[0] == ckpt.sha256:
        return "kept the host's own checkpoint (same bytes)"
    _mkdir(host, host_name, remote.rsplit("/", 1)[0])
    _place_run_metrics(ctx, job, host, host_name)
    with transfer_progress.track(f"checkpoint {job.id} -> {host_name}", ckpt.bytes) as shown:
        host.put(Path(ckpt.durable_path), remote, progress=shown)
    ctx.ledger.record_event("job", job.id, f"checkpoint {ckpt.file} ({ckpt.sha256[:12]}) placed on {host_name}")
    return f"pushed checkpoint {ckpt.file}"


def _place_run_metrics(ctx: Context, job: Job, host: Any, host_name: str) -> None:
    metrics = _run_metrics(ctx, job)
    local_dir = ctx.settings.home / CHECKPOINTS_DIR / job.id
    if metrics is not None and local_dir.joinpath(protocol.RUN_DIR, *metrics.split("/")).is_file():
        target = host.path("jobs", job.id, protocol.RUN_DIR, *metrics.split("/"))
        _mkdir(host, host_name, target.rsplit("/", 1)[0])
        host.put(local_dir.joinpath(protocol.RUN_DIR, *metrics.split("/")), target)


def _mkdir(host: Any, host_name: str, path: str) -> None:
    made = host.run(["mkdir", "-p", path], timeout=60)
    if made.exit_code != 0:
        raise GpuqError(f"host {host_name}: cannot create {path}: {made.stderr.strip()[:200]}")
