"""What ``gpuq status`` (table, ``--json``, live dashboard) and ``gpuq wait --json`` show, as view models
computed once from an ``api.Snapshot``: jobs (``JobView``), hosts (``HostView``), alerts and sweeps.

Costs come from ``orchestrator/money/cost.py`` (the one cost policy, shared with ``results`` and ``report``);
every string from a host is printable (``views/text.py``).  ``orchestrator/cli/`` draws these into
tables, panels and documents.  Pure: no I/O, no rich.

The package's names are loaded on first use (PEP 562): ``views.text``, which every command's error
printer needs, must not pull in the ledger and the host documents (``gpuq --help`` stays at its floor).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.views.hosts import (
        HEALTH_STYLE,
        GpuView,
        HostView,
        host_flags,
        host_state,
        host_view,
        host_views,
        lease_text,
    )
    from orchestrator.views.jobs import JobView, agent_entries, eta_seconds, job_views, slot_jobs
    from orchestrator.views.summary import AlertView, SweepView, alert_views, sweep_views

_HOME = {
    **dict.fromkeys(("HEALTH_STYLE", "GpuView", "HostView", "host_flags", "host_state", "host_view", "host_views",
                     "lease_text"), "orchestrator.views.hosts"),
    **dict.fromkeys(("JobView", "agent_entries", "eta_seconds", "job_views", "slot_jobs"), "orchestrator.views.jobs"),
    **dict.fromkeys(("AlertView", "SweepView", "alert_views", "sweep_views"), "orchestrator.views.summary"),
}

__all__ = [
    "HEALTH_STYLE", "AlertView", "GpuView", "HostView", "JobView", "SweepView", "agent_entries", "alert_views",
    "eta_seconds", "host_flags", "host_state", "host_view", "host_views", "job_views", "lease_text", "slot_jobs",
    "sweep_views",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
