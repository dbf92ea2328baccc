"""``gpuq submit --smoke``: a short run of every distinct cell on this machine before any money is spent
(docs/your-project.md, "Smoke before you rent").

Per cell (the first seed of it; seeds only change GPUQ_SEED), in a private host root of its own
(``$GPUQ_HOME/smoke/<time>/``), through the real agent's wrapper (``gpuq_agent.py wrap``: the setup
hook, the prepared tree, the run dir, the argv, the environment a host gives the job):

1. attempt 1 with ``[run] smoke_args`` appended to the cell's arguments (gpuq's own payload: its
   epochs cut to ``PAYLOAD_SMOKE_EPOCHS``), stopped with SIGTERM as soon as a checkpoint and a metrics
   row exist (or left to end);
2. attempt 2 in the same run dir: the wrapper adds ``resume_args`` with the newest checkpoint, as a
   resume on a host does, and it must exit 0;
3. the metrics are read by the agent's own reader (``gpuq_runmetrics``); the run *resumed* when the
   rows attempt 2 added start after the first row of attempt 1 (a trainer that ignores its checkpoint
   starts over at the same step) or when it had nothing left to train.

Nothing is recorded in the ledger: no sweep, no job, no event.  The smoke root is removed when every
cell passed and kept (its path printed) when one failed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from glob import glob
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.agent import client, launcher
from orchestrator.agent.spec import OutboundSpec
from orchestrator.api.smoketalk import Say, SmokeTalk, silent
from orchestrator.api.submitting import SubmitResult, submit
from orchestrator.context import Context
from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec, spec_hash_for
from orchestrator.host_documents import ExitRecord
from orchestrator.hosts import jail
from orchestrator.hosts.local import LocalHost, command_env
from orchestrator.ledger import Attempt, Job, Sweep
from orchestrator.transfer import datasync

PAYLOAD_SMOKE_EPOCHS = 2  # gpuq's own payload: its short mode is fewer epochs
RUN_TIMEOUT_S = 600.0  # one attempt of one cell
POLL_S = 0.2
ERROR_LINE = re.compile(r"^\S.*\b\w*(Error|Exception)\b:|\berror:", re.I)

# The agent's metric reader, run by the host's Python from the smoke root's bundle; argv: the agent
# dir, the job dir, the attempt.  Prints {"rows", "steps"}: the headline metric's steps in row order.
PROBE = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from gpuq_base import gpuq_jobspec
from gpuq_records import gpuq_runmetrics as m
job_dir, attempt = sys.argv[2], int(sys.argv[3])
run = gpuq_jobspec.parse_spec(json.load(open(os.path.join(job_dir, "spec.json")))).run
if run is not None and run.command:
    summary = m.run_summary(job_dir, run, attempt) or {}
    curves = summary.get("curves") or {}
    metric = summary.get("metric") or run.metric
    rows = summary.get("rows") or 0
else:
    curves = m.payload_curves(job_dir, "val_acc")
    metric = "val_acc"
    rows = sum(len(c) for c in curves.values())
points = max(curves.values(), key=len) if curves else []  # the curve with the most rows: eval rows may be rare
print(json.dumps({"rows": rows, "steps": [p[0] for p in points]}))
"""


@dataclass
class SmokeRow:
    """One cell's smoke run, as the table shows it."""

    cell: str
    started: bool = False
    metrics: int = 0  # rows gpuq read
    checkpoint: str = ""  # the newest checkpoint after attempt 1, relative to the job dir
    resumed: bool | None = False  # None: no metric row before the stop to tell by
    exit_code: int | None = None  # attempt 2's (attempt 1's when it failed on its own)
    seconds: float = 0.0
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


@dataclass
class SmokeResult:
    rows: list[SmokeRow]
    root: str  # the smoke host root, "" once removed
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)


def distinct_cells(specs: list[JobSpec]) -> list[JobSpec]:
    """The first job of every cell: jobs that differ only in their seed run the same code path."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for spec in specs:
        key = (spec.config, spec.task, spec.epochs, spec.gpus, spec.nodes, spec.args)
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


def smoke(ctx: Context, queue: Path, *, timeout_s: float = RUN_TIMEOUT_S, say: Say = silent) -> SmokeResult:
    """Smoke-run every distinct cell of ``queue`` on this machine; records nothing in the ledger.  ``say``
    gets a line at each step of each cell and when the setup hook starts and ends (``smoketalk.py``)."""
    planned = submit(ctx, queue, dry_run=True)  # every check a submit makes, nothing recorded
    base = ctx.settings.home / "smoke"
    base.mkdir(parents=True, exist_ok=True)
    root = tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base)
    host = LocalHost(Path(root), name="smoke", python=ctx.settings.local_python)
    launcher.ensure_bundle(host, planned.bundle)
    cell_jail = jail.prefix(host.python or "python3", root, ctx.settings.home, command_env())
    warnings = list(planned.warnings)
    if cell_jail.why_not:
        warnings.append(f"the smoke runs the project with HOME at its own root but cannot hide $GPUQ_HOME, ~/.ssh "
                        f"and ~/.aws from it ({cell_jail.why_not}): it can read what you can")
    talk = SmokeTalk(Path(root), say)
    cells = distinct_cells(planned.specs)
    handed = [spec for spec in cells if any("{checkpoint." in arg for arg in spec.args)]
    warnings += [f"cell {spec.cell or spec.name} is not smoke-run: its {{checkpoint.NAME}} is a checkpoint of what it "
                 f"waits for (after={','.join(spec.after)}), which no smoke run hands over" for spec in handed]
    cells = [c for c in cells if c not in handed]
    rows = []
    for i, spec in enumerate(cells):
        talk.about(re.sub(r"-seed\d+$", "", spec.name), i, len(cells))
        rows.append(_smoke_cell(ctx, host, cell_jail, planned, spec, i, timeout_s, talk))
        talk.line("passed" if rows[-1].ok else f"FAILED: {rows[-1].problem}")
    result = SmokeResult(rows, root, warnings)
    if result.ok:
        _remove(root)
        result.root = ""
    return result


def _remove(root: str) -> None:
    """Remove the smoke root: its bundle, prepared trees and data are read-only by mode bits."""
    for top, dirs, _files in os.walk(root):
        for d in dirs:
            path = os.path.join(top, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(root, ignore_errors=True)


def _documents(ctx: Context, planned: SubmitResult, spec: JobSpec, job_id: str, number: int) -> OutboundSpec:
    """The attempt's inbox spec, built by the launcher as for a real host (``launcher.job_spec``)."""
    now = time.time()
    run = planned.run
    args = list(spec.args) + (list(run.smoke_args) if run is not None else [])
    # a trainer of its own keeps its epochs (0: none given); gpuq's payload is cut short
    epochs = (spec.epochs or 0) if run is not None and run.command else min(spec.epochs or PAYLOAD_SMOKE_EPOCHS,
                                                                             PAYLOAD_SMOKE_EPOCHS)
    sweep = Sweep(id="smoke", queue_path=planned.queue_path, workdir="", queue_text="",
                  bundle_sha=planned.bundle.sha256, job_count=1, created_at=now, entry=ctx.settings.entry,
                  launcher=ctx.settings.launcher,
                  verify=",".join(run.verify if run is not None else ctx.settings.verify),
                  run=planned.run_json)
    job = Job(id=job_id, sweep_id="smoke", name=spec.name, line=spec.line, raw=spec.raw, config=spec.config,
              config_sha256=spec.config_sha256, task=spec.task, epochs=epochs, gpus=spec.gpus, nodes=1,
              seed=spec.seed, retries=0, spec_hash=spec_hash_for(spec), state="QUEUED", created_at=now,
              updated_at=now, args=json.dumps(args), cell=spec.cell or spec.name)
    attempt = Attempt(job_id=job_id, number=number, host="smoke", state="STARTING",
                      bundle_sha=planned.bundle.sha256, created_at=now)
    spec_doc = launcher.job_spec(job, attempt, ctx.settings, sweep=sweep)
    return replace(spec_doc, ckpt_interval_s=min(float(spec_doc.ckpt_interval_s or 5), 5.0))  # the payload saves early


def _start(host: LocalHost, cell_jail: jail.Jail, spec_doc: OutboundSpec, job_id: str, number: int,
           gpus: int) -> subprocess.Popen[bytes]:
    """Write the spec and launch record as the agent's ``serve`` does, and start the wrapper in the jail
    (``hosts/jail.py``: HOME at the smoke root; $GPUQ_HOME and your credentials hidden where it can)."""
    jdir = Path(host.root) / protocol.JOBS_DIR / job_id
    adir = jdir / protocol.ATTEMPTS_DIR / str(number)
    for d in (adir, jdir / protocol.CKPT_DIR, jdir / protocol.RESULT_DIR):
        d.mkdir(parents=True, exist_ok=True)
    (jdir / protocol.SPEC_FILE).write_text(json.dumps(spec_doc.as_document()))
    slots = list(range(max(1, gpus)))
    (adir / protocol.LAUNCH_FILE).write_text(json.dumps({
        "time": "", "slots": slots, "kind": "cpu", "device": "cpu", "total_slots": len(slots), "index": 1,
        "count": 1, "master_port": _free_port()}))
    agent = client.agent_path(host, spec_doc.bundle_sha)
    with open(adir / protocol.JOB_LOG, "ab") as logf:
        return subprocess.Popen([*cell_jail.prefix, host.python, agent, "--root", host.root, "wrap", job_id,
                                 str(number)], stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                cwd=host.root, env=cell_jail.env, start_new_session=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _checkpoint(host: LocalHost, job_id: str, spec_doc: OutboundSpec) -> str:
    """The newest file matching the cell's checkpoint globs (gpuq's payload: its ckpt dir), relative to
    the job dir; "" when none."""
    jdir = os.path.join(host.root, protocol.JOBS_DIR, job_id)
    run = spec_doc.run
    patterns = ([os.path.join(jdir, protocol.RUN_DIR, g) for g in run.checkpoint]
                if run is not None and run.command else [os.path.join(jdir, protocol.CKPT_DIR, "*.pt")])
    found = [p for pat in patterns for p in glob(pat, recursive=True)  # a file, or a checkpoint directory
             if (os.path.isfile(p) or os.path.isdir(p)) and not os.path.islink(p)]
    return os.path.relpath(max(found, key=os.path.getmtime), jdir) if found else ""


def _has_rows(host: LocalHost, job_id: str, spec_doc: OutboundSpec) -> bool:
    """A metrics row is written (cheaply: a CSV with a line after its header, a JSON-lines file with a
    line; ``metrics = "log"`` and no metrics at all: True, the checkpoint alone decides)."""
    jdir = os.path.join(host.root, protocol.JOBS_DIR, job_id)
    own = spec_doc.run is not None and bool(spec_doc.run.command)
    metrics = spec_doc.run.metrics if spec_doc.run is not None else ""
    if own and (not metrics or metrics == "log"):
        return True
    path = (os.path.join(jdir, protocol.RUN_DIR, metrics) if own
            else os.path.join(jdir, protocol.RESULT_DIR, protocol.METRICS_FILE))
    try:
        with open(path, "rb") as f:
            lines = f.read(1 << 16).count(b"\n")
    except OSError:
        return False
    return lines >= (2 if path.endswith(".csv") else 1)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float, stop_when: Any = None,
          talk: SmokeTalk | None = None) -> tuple[bool, bool]:
    """(ended in time, stopped by us): SIGTERM once ``stop_when()`` is true; SIGKILL at the deadline."""
    deadline = time.monotonic() + timeout_s
    stopped = False
    while proc.poll() is None:
        if talk is not None:
            talk.poll()
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False, stopped
        if stop_when is not None and not stopped and stop_when():
            os.kill(proc.pid, signal.SIGTERM)  # the wrapper relays it to the trainer, as a stop on a host
            stopped = True
        time.sleep(POLL_S)
    if talk is not None:
        talk.poll()  # a hook that ended with the attempt
    return True, stopped


def _exit_record(host: LocalHost, job_id: str, number: int) -> ExitRecord:
    """The attempt's exit.json, typed at the edge (an empty record when there is none)."""
    path = Path(host.root) / protocol.JOBS_DIR / job_id / protocol.ATTEMPTS_DIR / str(number) / protocol.EXIT_FILE
    try:
        return ExitRecord.model_validate_json(path.read_bytes()[:1 << 20])
    except (OSError, ValidationError):
        return ExitRecord()


def _last_line(host: LocalHost, job_id: str, number: int) -> str:
    """The job log's first error line (else its last line): what a trainer that failed said, bounded."""
    path = Path(host.root) / protocol.JOBS_DIR / job_id / protocol.ATTEMPTS_DIR / str(number) / protocol.JOB_LOG
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 16384))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ERROR_LINE.search(ln)]  # the first is the cause; torchrun's report follows
    said = (errors[0] if errors else lines[-1] if lines else "").replace(host.root, "<smoke root>")
    said = re.sub(r"[\x00-\x1f\x7f]", " ", said).strip()
    return f" (its log says: {said[:300]})" if said else ""


class ProbeAnswer(BaseModel):
    """What ``PROBE`` printed: the agent reader's row count and the steps of the longest curve."""

    model_config = ConfigDict(extra="ignore")

    rows: int = Field(default=0, ge=0)
    steps: list[float] = Field(default_factory=list, max_length=100_000)


def _probe(host: LocalHost, job_id: str, sha: str, number: int) -> tuple[int, list[float]]:
    agent_dir = os.path.dirname(client.agent_path(host, sha))
    jdir = os.path.join(host.root, protocol.JOBS_DIR, job_id)
    got = host.run(["python3" if not host.python else host.python, "-I", "-c", PROBE, agent_dir, jdir, str(number)],
                   timeout=120)
    try:
        answer = ProbeAnswer.model_validate_json(got.stdout.strip() or "{}")
    except ValidationError:
        return 0, []
    return answer.rows, [s for s in answer.steps if math.isfinite(s)]


def resumed_from(before: list[float], after: list[float]) -> bool | None:
    """Attempt 2 resumed: the rows it added begin after attempt 1's first row (a trainer that ignores
    its checkpoint starts over at the same step), or it added none (nothing left to train).  None when
    attempt 1 left no row to compare with."""
    added = after[len(before):] if after[:len(before)] == before else after
    if not added:
        return True
    if not before:
        return None
    return added[0] > before[0]


def _smoke_cell(ctx: Context, host: LocalHost, cell_jail: jail.Jail, planned: SubmitResult, spec: JobSpec,
                index: int, timeout_s: float, talk: SmokeTalk) -> SmokeRow:
    row = SmokeRow(cell=re.sub(r"-seed\d+$", "", spec.name))
    started = time.monotonic()
    job_id = f"smoke-{index:03d}"
    sha = planned.bundle.sha256
    first = _documents(ctx, planned, spec, job_id, 1)
    try:
        datasync.sync_data(host, [first.data], ctx.settings.home, record=False)  # [data], as a host gets it
        _run_cell(host, cell_jail, row, first, _documents(ctx, planned, spec, job_id, 2), job_id, sha, spec.gpus,
                  timeout_s, talk)
    finally:
        row.seconds = time.monotonic() - started
    return row


def _run_cell(host: LocalHost, cell_jail: jail.Jail, row: SmokeRow, first: OutboundSpec, second: OutboundSpec,
              job_id: str, sha: str, gpus: int, timeout_s: float, talk: SmokeTalk) -> None:
    proc = _start(host, cell_jail, first, job_id, 1, gpus)
    talk.line("attempt 1 started")
    in_time, stopped = _wait(proc, timeout_s, stop_when=lambda: bool(_checkpoint(host, job_id, first))
                            and _has_rows(host, job_id, first), talk=talk)
    rec = _exit_record(host, job_id, 1)
    talk.line("attempt 1 stopped (SIGTERM) once a checkpoint and a metrics row were written" if stopped
              else f"attempt 1 ended: exit {rec.wrapper_code}" if in_time else "attempt 1 timed out")
    row.started = rec.phase not in (None, "setup", "gate")
    row.checkpoint = _checkpoint(host, job_id, first)
    row.metrics, before = _probe(host, job_id, sha, 1)
    code = rec.wrapper_code
    if not in_time:
        row.problem = f"attempt 1 did not end within {timeout_s:.0f} s"
        return
    if not stopped and code != 0:
        row.exit_code = code
        row.problem = (f"attempt 1 failed: {(rec.message or 'no exit record')[:300]}"
                       + _last_line(host, job_id, 1))
        return
    if not row.checkpoint:
        row.problem = "no checkpoint matched [run] checkpoint after the run"
        return
    proc = _start(host, cell_jail, second, job_id, 2, gpus)
    talk.line(f"attempt 2 started: the resume from {row.checkpoint}")
    in_time, _ = _wait(proc, timeout_s, talk=talk)
    rec = _exit_record(host, job_id, 2)
    code = rec.wrapper_code
    talk.line(f"attempt 2 ended: exit {code}" if in_time else "attempt 2 timed out")
    row.exit_code = code
    row.metrics, after = _probe(host, job_id, sha, 2)
    row.resumed = resumed_from(before, after)
    if not in_time:
        row.problem = f"the resumed attempt did not end within {timeout_s:.0f} s"
    elif code != 0:
        row.problem = (f"the resumed attempt failed: {(rec.message or 'no exit record')[:300]}"
                       + _last_line(host, job_id, 2))
    elif not row.metrics:
        row.problem = "no metrics gpuq can read ([run] metrics)"
    elif row.resumed is False:
        row.problem = (f"the trainer started over instead of resuming from {row.checkpoint} "
                       "(check [run] resume_args and that the trainer loads it)")
