"""The teardown gate of a rented host, and its termination (docs/providers.md).

``gpuq down`` (``api/cloud.py``), the tick's down-when-done stage (``tick/billing.py``) and ``gpuq up``, for a
machine it will not use (``api/renting.py``), all end a machine through here (:func:`end_instance`).  ``down``
and down-when-done pass the gate first: never while a job there runs, never while a job there has results
that are not pulled and verified at home (unless the user forces it); and a termination counts only once the
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
from orchestrator.providers.base import Provider
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
    """Terminate ``row``'s instance and wait until its provider says it is gone (:func:`end_instance`: then its
    SSH identity is forgotten and its lease marked terminated with ``reason``).  Returns (outcome, the time it
    stopped billing): ("terminated", t), or ("terminate failed: ...", None) with the failure recorded as an
    event."""
    prov = provider_for(ctx, row.provider)
    try:
        gone = end_instance(ctx, prov, row.name, row.instance_id, reason=reason,
                            event=f"{row.provider} {row.instance_id} terminated (gone)")
    except ProviderError as exc:
        ctx.ledger.record_event("host", row.name, f"terminate of {row.instance_id} failed: {exc}")
        return f"terminate failed: {exc}", None
    return "terminated", gone


def end_instance(ctx: Context, prov: Provider, host: str, instance_id: str, *, reason: str, event: str) -> float:
    """The one way gpuq ends a machine it rented (``gpuq down``, down-when-done, and ``gpuq up`` for a machine it
    will not use): terminate ``instance_id`` and wait until ``prov`` says it is gone (an acknowledgement is not
    proof); only then forget ``host``'s cached connection and, where it was registered with an address, its SSH
    identity (the provider may hand that IP:port to the next machine), mark its lease terminated with ``reason``
    and record ``event``.  Returns when it stopped billing.  A failing terminate or wait raises the provider's
    error with nothing written: the caller records what it means for its row."""
    prov.terminate(instance_id)
    prov.wait_gone(instance_id)
    gone = time.time()
    row = ctx.ledger.host(host)
    ctx.fleet.drop(host)
    if row is not None and row.target:  # the provider may hand this IP:port to the next machine
        host_keys.forget_row_keys(ctx.settings, row)
    ctx.ledger.lease_transition(host, LeaseState.TERMINATED, reason, at=gone, hold=HoldChange(HoldKind.TERMINATED))
    ctx.ledger.record_event("host", host, event)
    return gone
