"""The tick's watch over rented machines that never got registered (docs/providers.md, "Stuck provisioning").

A row stays ``provisioning`` while its ``gpuq up`` creates the machine and waits for it; a ``gpuq up`` that was
killed (kill -9, a closed laptop) or whose create's answer was lost (an **unknown** row: no instance id) leaves
it there, billing unseen.  Past the readiness window (:func:`window_s`: the name lookup after an ambiguous
create and twice the readiness timeout, counted from the row's last lease change) no ``gpuq up`` still works
on it, so the tick settles it: a row without an instance id is looked up by the name gpuq gave it; a machine
found is terminated and waited for (``teardown.end_instance``: gpuq never uses a machine it did not register);
no machine of that name means nothing was created, and the row goes.  What it cannot settle (the provider
refuses or does not answer) is an escalation, sent once (notify and the webhook, as the idle alert is), and
tried again at every tick.
"""

from __future__ import annotations

import time

from orchestrator.context import Context
from orchestrator.core.config import Settings
from orchestrator.core.errors import GpuqError
from orchestrator.core.states import LeaseState
from orchestrator.ledger import HostRow
from orchestrator.tick import notify, teardown
from orchestrator.tick.findings import TickReport
from orchestrator.tick.leases import provider_for

RULE_STUCK = "provisioning_stuck"


def window_s(settings: Settings) -> float:
    """How long after its last lease change a ``provisioning`` row may still be ``gpuq up``'s own: the name lookup
    after an ambiguous create, the readiness wait, and as long again for the SSH audit before it registers."""
    return settings.create_lookup_s + 2 * settings.provider_ready_timeout_s


def stuck(row: HostRow, now: float, window: float) -> bool:
    """A machine gpuq rented, still ``provisioning`` more than ``window`` seconds after its last lease change."""
    changed = row.lease_changed_at if row.lease_changed_at is not None else row.created_at
    return bool(row.provider) and row.lease is LeaseState.PROVISIONING and now - changed > window


def watch_provisioning(ctx: Context, report: TickReport, now: float | None = None) -> None:
    """The stage: settle every row stuck ``provisioning``; alert on what cannot be settled."""
    now = time.time() if now is None else now
    window = window_s(ctx.settings)
    for row in ctx.ledger.hosts():
        if not stuck(row, now, window):
            continue
        try:
            report.actions.append(f"{row.name}: {settle(ctx, row)}")
        except GpuqError as exc:  # one machine's trouble never stops the tick
            _alert(ctx, row, str(exc), report)


def settle(ctx: Context, row: HostRow) -> str:
    """End a stuck row's machine, or remove the row when no machine has its name; what was done, in words.
    Raises the provider's error with nothing written when it cannot (the tick and `gpuq down --orphans`)."""
    prov = provider_for(ctx, row.provider)
    instance_id = row.instance_id
    if not instance_id:
        named = [i for i in prov.list_instances()
                 if i.name == row.instance_name and not i.gone and i.state != "terminating"]
        if not named:
            message = (f"not created: no {row.provider} instance is named {row.instance_name} past the readiness "
                       "window")
            ctx.ledger.remove_host(row.name, message)
            return f"{message}; its row is removed"
        instance_id = named[0].id
        ctx.ledger.lease_transition(row.name, LeaseState.PROVISIONING, "found by its name by the tick",
                                    at=row.lease_changed_at, instance_id=instance_id)
    message = f"{row.provider} {instance_id} was still provisioning past the readiness window, never registered"
    teardown.end_instance(ctx, prov, row.name, instance_id, reason=f"{message}; terminated by the tick",
                          event=f"{message}: terminated by the tick (gone)")
    ctx.ledger.record_finding("host", row.name, severity="info", rule=RULE_STUCK,
                              message=f"{message}: terminated by the tick")
    return f"{message}: terminated (gone)"


def _alert(ctx: Context, row: HostRow, why: str, report: TickReport) -> None:
    """Escalate once (then the tick keeps trying, quietly) that a stuck machine may bill."""
    last = ctx.ledger.latest_finding(row.name, RULE_STUCK)
    report.teardown_pending.append(row.name)
    if last is not None and last.severity == "escalate":
        return
    what = f"{row.provider} {row.instance_id}" if row.instance_id else f"{row.provider} {row.instance_name} (no id)"
    message = f"{row.name} is still provisioning past the readiness window and gpuq could not end it: {why}"
    action = f"it may bill ({what}): `gpuq down {row.name}` ends it, else the provider's console"
    ctx.ledger.record_finding("host", row.name, severity="escalate", rule=RULE_STUCK, message=message, action=action)
    notify.send(ctx.settings, ctx.ledger, notify.Notice(
        "escalation", notify.line(message, host=row.name, next_step=f"gpuq down {row.name}"),
        {"rule": RULE_STUCK, "host": row.name, "job": None, "message": message, "action": action},
        title=f"{row.name} stuck provisioning, may bill", severity="escalate"))
    report.actions.append(f"{row.name}: {message}; {action}")
