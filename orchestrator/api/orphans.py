"""``gpuq down --orphans``: machines gpuq rented that bill with no live ledger row (docs/providers.md).

Every configured provider (an API key is set) is asked for its instances.  An orphan carries the name
gpuq gives (``gpuq-<ledger id>-<lease>[-<i>]``, ``providers/models.py``) and either this ledger's id with
no live row holding it (by instance id or by name), or any gpuq name with a row of this ledger that says
terminated.  Never an orphan: an instance a live row holds, one without gpuq's name, one named by
another ledger.  An instance named by a gpuq older than ledger ids (``gpuq-<lease>[-<i>]``) that no row
holds is listed apart and never terminated here: no name says which ledger rented it.  Also listed: the
rows still ``provisioning`` past the readiness window (tick/provisioning.py), which the tick settles too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from orchestrator.api.renting import ledger_id
from orchestrator.context import Context
from orchestrator.core.errors import GpuqError, ProviderAuthError
from orchestrator.core.states import LeaseState
from orchestrator.ledger import HostRow
from orchestrator.providers import registry
from orchestrator.providers.models import Instance, ledger_of
from orchestrator.tick.leases import provider_for
from orchestrator.tick.provisioning import settle, stuck, window_s


@dataclass
class Orphan:
    provider: str
    instance: Instance
    why: str  # "no ledger row holds it" | "its row HOST says terminated"
    host: str = ""  # the row of this ledger that names it, if any

    @property
    def hourly(self) -> float:
        return float(self.instance.price_per_hour) if self.instance.price_per_hour is not None else 0.0


@dataclass
class OrphanScan:
    orphans: list[Orphan] = field(default_factory=list)
    older: list[Orphan] = field(default_factory=list)  # gpuq's older names, held by no row: listed, never ended
    others: int = 0  # instances of other ledgers, left alone
    skipped: dict[str, str] = field(default_factory=dict)  # provider -> why it was not asked
    # rows still provisioning past the readiness window (their `gpuq up` is gone): they may bill
    stuck: list[HostRow] = field(default_factory=list)

    @property
    def hourly(self) -> float:
        return sum(o.hourly for o in self.orphans)


def find_orphans(ctx: Context) -> OrphanScan:
    """Ask every configured provider for gpuq's instances that no live row of this ledger holds."""
    me = ledger_id(ctx.settings)
    rows = ctx.ledger.hosts()
    now, window = time.time(), window_s(ctx.settings)
    out = OrphanScan(stuck=[r for r in rows if stuck(r, now, window)])
    for provider in registry.names():
        try:
            instances = provider_for(ctx, provider).list_instances()
        except ProviderAuthError as exc:
            if exc.code != "no-api-key":
                out.skipped[provider] = str(exc)
            continue  # no key anywhere: a provider this user does not use
        except GpuqError as exc:
            out.skipped[provider] = str(exc)
            continue
        mine = [r for r in rows if r.provider == provider]
        for inst in instances:
            if inst.state in ("terminating", "terminated"):
                continue
            owner = ledger_of(inst.name)
            if owner is None:
                continue  # not a name gpuq gives: never gpuq's to touch
            row = _holder(mine, inst)
            if row is not None and row.lease is not LeaseState.TERMINATED:
                continue  # the ledger holds it live: `gpuq down HOST` is the way to end it
            if row is not None:
                out.orphans.append(Orphan(provider, inst, f"its row {row.name} says terminated", row.name))
            elif owner == me:
                out.orphans.append(Orphan(provider, inst, "no ledger row holds it"))
            elif owner == "":
                out.older.append(Orphan(provider, inst, "named by an older gpuq; no row of this ledger holds it"))
            else:
                out.others += 1
    return out


def _holder(rows: list[HostRow], inst: Instance) -> HostRow | None:
    """The row of this ledger that holds ``inst``: by its id, else (a create that never answered) by its name;
    a live row before a terminated one."""
    found = [r for r in rows if (r.instance_id and r.instance_id == inst.id)
             or (not r.instance_id and r.instance_name and r.instance_name == inst.name)]
    found.sort(key=lambda r: r.lease is LeaseState.TERMINATED)
    return found[0] if found else None


def end_orphans(ctx: Context, orphans: list[Orphan]) -> dict[str, str]:
    """Terminate each orphan and wait until it is gone.  Returns {instance id: outcome}."""
    out: dict[str, str] = {}
    for orphan in orphans:
        inst = orphan.instance
        subject = orphan.host or inst.name
        prov = provider_for(ctx, orphan.provider)
        try:
            prov.terminate(inst.id)
            prov.wait_gone(inst.id)
        except GpuqError as exc:
            out[inst.id] = f"terminate failed: {exc}"
            ctx.ledger.record_event("host", subject, f"orphan {orphan.provider} {inst.id} ({inst.name}): terminate "
                                                     f"failed: {exc}")
            continue
        if orphan.host:
            ctx.ledger.lease_transition(orphan.host, LeaseState.TERMINATED, "its orphaned instance was terminated by "
                                        "`gpuq down --orphans`")
        ctx.ledger.record_event("host", subject, f"orphan {orphan.provider} {inst.id} ({inst.name}) terminated by "
                                                 "`gpuq down --orphans` (gone)")
        out[inst.id] = "terminated"
    return out


def end_stuck(ctx: Context, row: HostRow) -> str:
    """End the machine of a row stuck provisioning, or remove the row when no machine has its name (what the tick
    does too: tick/provisioning.settle); what was done, in words.  Raises the provider's error, nothing written."""
    return settle(ctx, row)
