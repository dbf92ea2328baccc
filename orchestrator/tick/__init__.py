"""The control loop: one tick is probe → reconcile → patrol → collect → steal → dispatch (docs/health.md).

One module per stage (``run_tick`` in ``tick/loop.py`` strings them together); nothing here imports
``orchestrator.api``, whose verbs call into the tick.
"""

from __future__ import annotations

from orchestrator.core.states import JobState

ACTIVE = (JobState.ASSIGNED, JobState.RUNNING)  # the job states that hold a slot on a host
