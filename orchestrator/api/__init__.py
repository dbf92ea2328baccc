"""The verbs of gpuq: submit, status, wait, logs, cancel, results, pull, hosts, up/down/resume, watch.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.

Plain re-exports, imported on first use (PEP 562): ``gpuq status`` must not load the cloud
providers, the submit pipeline and the report to read a ledger.  No verb shares its name with a
module of this package (``status`` and ``wait`` live in ``snapshot.py``, ``pull`` in ``pulling.py``,
``submit`` in ``submitting.py``): importing a module sets the package attribute of its name, which
would shadow the verb.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.core.lazyexports import lazy_exports

if TYPE_CHECKING:
    from orchestrator.api.cloud import DownPlan, ResumeResult, down, down_plan, resume
    from orchestrator.api.dryrun import DryRun, dry_run
    from orchestrator.api.health import ReapReport, doctor, reap
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
    from orchestrator.api.jobs import CancelOutcome, cancel, cancel_targets, logs
    from orchestrator.api.joining import submit_into
    from orchestrator.api.orphans import OrphanScan, end_orphans, end_stuck, find_orphans
    from orchestrator.api.pulling import PullReport, pull
    from orchestrator.api.rented import UpInterrupted, UpResult
    from orchestrator.api.renting import up
    from orchestrator.api.resultrows import ResultRow, results
    from orchestrator.api.snapshot import Snapshot, ledger_status, status, wait
    from orchestrator.api.submitting import SubmitResult, submit
    from orchestrator.api.watching import WatchResult, watch
    from orchestrator.context import Context, host_for, open_context
    from orchestrator.tick.findings import TickReport
    from orchestrator.tick.loop import run_tick

_HOME = {
    "CancelOutcome": "orchestrator.api.jobs",
    "Context": "orchestrator.context",
    "DownPlan": "orchestrator.api.cloud",
    "DryRun": "orchestrator.api.dryrun",
    "HostDetail": "orchestrator.api.hosts",
    "OrphanScan": "orchestrator.api.orphans",
    "PullReport": "orchestrator.api.pulling",
    "ReapReport": "orchestrator.api.health",
    "ResultRow": "orchestrator.api.resultrows",
    "ResumeResult": "orchestrator.api.cloud",
    "Snapshot": "orchestrator.api.snapshot",
    "SubmitResult": "orchestrator.api.submitting",
    "TickReport": "orchestrator.tick.findings",
    "UpInterrupted": "orchestrator.api.rented",
    "UpResult": "orchestrator.api.rented",
    "WatchResult": "orchestrator.api.watching",
    "cancel": "orchestrator.api.jobs",
    "cancel_targets": "orchestrator.api.jobs",
    "doctor": "orchestrator.api.health",
    "down": "orchestrator.api.cloud",
    "down_plan": "orchestrator.api.cloud",
    "dry_run": "orchestrator.api.dryrun",
    "end_orphans": "orchestrator.api.orphans",
    "end_stuck": "orchestrator.api.orphans",
    "find_orphans": "orchestrator.api.orphans",
    "host_for": "orchestrator.context",
    "hosts_add": "orchestrator.api.hosts",
    "hosts_add_slurm": "orchestrator.api.hosts",
    "hosts_list": "orchestrator.api.hosts",
    "hosts_release": "orchestrator.api.hosts",
    "hosts_rm": "orchestrator.api.hosts",
    "hosts_show": "orchestrator.api.hosts",
    "hosts_stop_agent": "orchestrator.api.hosts",
    "hosts_trust": "orchestrator.api.hosts",
    "ledger_status": "orchestrator.api.snapshot",
    "logs": "orchestrator.api.jobs",
    "open_context": "orchestrator.context",
    "pull": "orchestrator.api.pulling",
    "reap": "orchestrator.api.health",
    "results": "orchestrator.api.resultrows",
    "resume": "orchestrator.api.cloud",
    "run_tick": "orchestrator.tick.loop",
    "status": "orchestrator.api.snapshot",
    "submit": "orchestrator.api.submitting",
    "submit_into": "orchestrator.api.joining",
    "up": "orchestrator.api.renting",
    "wait": "orchestrator.api.snapshot",
    "watch": "orchestrator.api.watching",
}

__all__ = [
    "CancelOutcome",
    "Context",
    "DownPlan",
    "DryRun",
    "HostDetail",
    "OrphanScan",
    "PullReport",
    "ReapReport",
    "ResultRow",
    "ResumeResult",
    "Snapshot",
    "SubmitResult",
    "TickReport",
    "UpInterrupted",
    "UpResult",
    "WatchResult",
    "cancel",
    "cancel_targets",
    "doctor",
    "down",
    "down_plan",
    "dry_run",
    "end_orphans",
    "end_stuck",
    "find_orphans",
    "host_for",
    "hosts_add",
    "hosts_add_slurm",
    "hosts_list",
    "hosts_release",
    "hosts_rm",
    "hosts_show",
    "hosts_stop_agent",
    "hosts_trust",
    "ledger_status",
    "logs",
    "open_context",
    "pull",
    "reap",
    "results",
    "resume",
    "run_tick",
    "status",
    "submit",
    "submit_into",
    "up",
    "wait",
    "watch",
]


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
