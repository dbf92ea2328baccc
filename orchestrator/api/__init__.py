"""The verbs of gpuq: submit, status, wait, logs, cancel, results, pull, hosts.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.
"""

from orchestrator.api.cloud import DownPlan, ResumeResult, UpResult, down, down_plan, resume, up
from orchestrator.api.context import Context, host_for, open_context
from orchestrator.api.health import ReapReport, WatchResult, doctor, reap, watch
from orchestrator.api.hosts import HostDetail, hosts_add, hosts_list, hosts_release, hosts_rm, hosts_show, hosts_trust
from orchestrator.api.jobs import CancelOutcome, ResultRow, cancel, logs, results
from orchestrator.api.pull import PullReport, pull
from orchestrator.api.status import Snapshot, status, tick, wait
from orchestrator.api.submit import SubmitResult, submit
from orchestrator.api.tick import TickReport, run_tick

__all__ = [
    "CancelOutcome",
    "Context",
    "DownPlan",
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
    "doctor",
    "down",
    "down_plan",
    "host_for",
    "hosts_add",
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
