"""The verbs of gpuq: submit, status, wait, logs, cancel, results, pull, hosts, up/down/resume, watch.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.

Plain re-exports.  No verb shares its name with a module of this package (``status`` and ``wait``
live in ``snapshot.py``, ``pull`` in ``pulling.py``), except ``submit`` (``submit.py``): these imports
run before any caller can import that module, so ``api.submit`` is the function.
"""

from __future__ import annotations

from orchestrator.api.cloud import DownPlan, ResumeResult, UpResult, down, down_plan, resume, up
from orchestrator.api.dryrun import DryRun, dry_run
from orchestrator.api.health import ReapReport, WatchResult, doctor, reap, watch
from orchestrator.api.hosts import (
    HostDetail,
    hosts_add,
    hosts_add_slurm,
    hosts_list,
    hosts_release,
    hosts_rm,
    hosts_show,
    hosts_stop_agent,
    hosts_trust,
)
from orchestrator.api.jobs import CancelOutcome, ResultRow, cancel, cancel_targets, logs, results
from orchestrator.api.pulling import PullReport, pull
from orchestrator.api.snapshot import Snapshot, status, wait
from orchestrator.api.submit import SubmitResult, submit
from orchestrator.context import Context, host_for, open_context
from orchestrator.tick.findings import TickReport
from orchestrator.tick.loop import run_tick

__all__ = [
    "CancelOutcome",
    "Context",
    "DownPlan",
    "DryRun",
    "HostDetail",
    "PullReport",
    "ReapReport",
    "ResultRow",
    "ResumeResult",
    "Snapshot",
    "SubmitResult",
    "TickReport",
    "UpResult",
    "WatchResult",
    "cancel",
    "cancel_targets",
    "doctor",
    "down",
    "down_plan",
    "dry_run",
    "host_for",
    "hosts_add",
    "hosts_add_slurm",
    "hosts_list",
    "hosts_release",
    "hosts_rm",
    "hosts_show",
    "hosts_stop_agent",
    "hosts_trust",
    "logs",
    "open_context",
    "pull",
    "reap",
    "results",
    "resume",
    "run_tick",
    "status",
    "submit",
    "up",
    "wait",
    "watch",
]
