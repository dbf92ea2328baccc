"""What ``gpuq status`` (table, ``--json``, live dashboard) and ``gpuq wait --json`` show, as view models
computed once from an ``api.Snapshot``: jobs (``JobView``), hosts (``HostView``), alerts and sweeps.

Costs come from ``orchestrator/cost.py`` (the one cost policy, shared with ``results`` and ``report``);
every string from a host is printable (``views/text.py``).  ``orchestrator/cli/`` draws these into
tables, panels and documents.  Pure: no I/O, no rich.
"""

from __future__ import annotations

from orchestrator.views.hosts import HEALTH_STYLE, GpuView, HostView, host_flags, host_state, host_view, host_views
from orchestrator.views.jobs import JobView, agent_entries, eta_seconds, job_views, slot_jobs
from orchestrator.views.summary import AlertView, SweepView, alert_views, sweep_views

__all__ = [
    "HEALTH_STYLE", "AlertView", "GpuView", "HostView", "JobView", "SweepView", "agent_entries", "alert_views",
    "eta_seconds", "host_flags", "host_state", "host_view", "host_views", "job_views", "slot_jobs", "sweep_views",
]
