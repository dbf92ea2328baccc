"""The verbs of gpuq: submit, status, wait, logs, cancel, results, pull, hosts.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.

Imports are lazy (PEP 562): ``gpuq status --no-probe`` does not pay for the controller, the
providers and SSH it does not use.  ``api.status``, ``api.submit`` and ``api.pull`` stay the
functions even after their modules of the same name are imported (as eager imports had it).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        hosts_trust,
    )
    from orchestrator.api.jobs import CancelOutcome, ResultRow, cancel, cancel_targets, logs, results
    from orchestrator.api.pull import PullReport, pull
    from orchestrator.api.status import Snapshot, status, tick, wait
    from orchestrator.api.submit import SubmitResult, submit
    from orchestrator.context import Context, host_for, open_context
    from orchestrator.tick.findings import TickReport
    from orchestrator.tick.loop import run_tick

_WHERE = {
    "CancelOutcome": "orchestrator.api.jobs",
    "Context": "orchestrator.context",
    "DownPlan": "orchestrator.api.cloud",
    "DryRun": "orchestrator.api.dryrun",
    "HostDetail": "orchestrator.api.hosts",
    "PullReport": "orchestrator.api.pull",
    "ReapReport": "orchestrator.api.health",
    "ResultRow": "orchestrator.api.jobs",
    "ResumeResult": "orchestrator.api.cloud",
    "Snapshot": "orchestrator.api.status",
    "SubmitResult": "orchestrator.api.submit",
    "TickReport": "orchestrator.tick.findings",
    "UpResult": "orchestrator.api.cloud",
    "WatchResult": "orchestrator.api.health",
    "cancel": "orchestrator.api.jobs",
    "cancel_targets": "orchestrator.api.jobs",
    "doctor": "orchestrator.api.health",
    "down": "orchestrator.api.cloud",
    "down_plan": "orchestrator.api.cloud",
    "dry_run": "orchestrator.api.dryrun",
    "host_for": "orchestrator.context",
    "hosts_add": "orchestrator.api.hosts",
    "hosts_add_slurm": "orchestrator.api.hosts",
    "hosts_list": "orchestrator.api.hosts",
    "hosts_release": "orchestrator.api.hosts",
    "hosts_rm": "orchestrator.api.hosts",
    "hosts_show": "orchestrator.api.hosts",
    "hosts_trust": "orchestrator.api.hosts",
    "logs": "orchestrator.api.jobs",
    "open_context": "orchestrator.context",
    "pull": "orchestrator.api.pull",
    "reap": "orchestrator.api.health",
    "results": "orchestrator.api.jobs",
    "resume": "orchestrator.api.cloud",
    "run_tick": "orchestrator.tick.loop",
    "status": "orchestrator.api.status",
    "submit": "orchestrator.api.submit",
    "tick": "orchestrator.api.status",
    "up": "orchestrator.api.cloud",
    "wait": "orchestrator.api.status",
    "watch": "orchestrator.api.health",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Api(types.ModuleType):
    """Importing ``orchestrator.api.status`` binds the package's ``status`` to that module: keep the verb."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Api

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
    "tick",
    "up",
    "wait",
    "watch",
]
