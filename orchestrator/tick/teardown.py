"""The teardown gate of a rented host, and its termination (docs/providers.md).

``gpuq down`` (``api/cloud.py``) and the tick's down-when-done stage (``tick/billing.py``) both end a
machine through here: never while a job there runs, never while a job there has results that are not
pulled and verified at home (unless the user forces it), and a termination counts only once the
provider says the machine is gone (an acknowledgement is not proof).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from orchestrator.context import Context
from orchestrator.core.errors import ProviderError
from orchestrator.core.states import HoldChange, HoldKind, JobState, LeaseState
from orchestrator.fleet import host_keys
from orchestrator.ledger import HostRow, Job
from orchestrator.tick.leases import provider_for


def refusal(row: HostRow, jobs: Sequence[Job], verified: Collection[str], *, force: bool = False) -> str | None:
    """Why ``row`` may not be terminated now (None: it may).  ``jobs``: the jobs whose host it is (others
    are ignored); ``verified``: ids of jobs whose results are pulled and verified at home."""
    if not row.provider or not (row.instance_id or row.instance_name):
        return "not rented by gpuq (no provider instance): release it yourself"
    if row.lease is LeaseState.TERMINATED:
        return "already terminated"
    mine = [j for j in jobs if j.host == row.name]
    active = [j for j in mine if j.state in (JobState.ASSIGNED.value, JobState.RUNNING.value)]
    unverified = [j for j in mine if j.state == JobState.SUCCEEDED.value and j.id not in verified]
    if active and not force:
        return (f"{len(active)} job(s) still run there ({', '.join(j.name for j in active[:3])}); "
                "cancel them or pass --force")
    if unverified and not force:
        return (f"{len(unverified)} job(s) with results not pulled and verified "
                f"({', '.join(j.name for j in unverified[:3])}); `gpuq pull` first, or --force to lose them")
    return None


def terminate(ctx: Context, row: HostRow, *, reason: str) -> tuple[str, float | None]:
    """Terminate ``row``'s instance and wait until its provider says it is gone; then forget its SSH
    identity (the provider may hand its address to the next machine) and mark the lease terminated
    with ``reason``.  Returns (outcome, the time it stopped billing): ("terminated", t), or
    ("terminate failed: ...", None) with the failure recorded as an event."""
    prov = provider_for(ctx, row.provider)
    try:
        prov.terminate(row.instance_id)
        prov.wait_gone(row.instance_id)
    except ProviderError as exc:
        ctx.ledger.record_event("host", row.name, f"terminate of {row.instance_id} failed: {exc}")
        return f"terminate failed: {exc}", None
    gone = time.time()
    ctx.fleet.drop(row.name)
    if row.target:  # the provider may hand this IP:port to the next machine
        host_keys.forget_row_keys(ctx.settings, row)
    ctx.ledger.lease_transition(row.name, LeaseState.TERMINATED, reason, at=gone,
                                hold=HoldChange(HoldKind.TERMINATED))
    ctx.ledger.record_event("host", row.name, f"{row.provider} {row.instance_id} terminated (gone)")
    return "terminated", gone
