"""The verbs of gpuq: submit, status, wait, logs, cancel, results, pull, hosts.

Each function does one user-level thing and returns data; the CLI renders it.
Every check that can fail on user input runs before anything is written.
"""

from orchestrator.api.context import Context, host_for, open_context
from orchestrator.api.hosts import HostDetail, hosts_add, hosts_list, hosts_rm, hosts_show, hosts_trust
from orchestrator.api.jobs import CancelOutcome, ResultRow, cancel, logs, results
from orchestrator.api.pull import PullReport, pull
from orchestrator.api.status import Snapshot, status, tick, wait
from orchestrator.api.submit import SubmitResult, submit

__all__ = [
    "CancelOutcome", "Context", "HostDetail", "PullReport", "ResultRow", "Snapshot", "SubmitResult", "cancel",
    "host_for", "hosts_add", "hosts_list", "hosts_rm", "hosts_show", "hosts_trust", "logs", "open_context",
    "pull", "results", "status", "submit", "tick", "wait",
]
