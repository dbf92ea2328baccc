"""Rented hosts: ``down`` (terminate behind the teardown gate) and ``resume``; ``up`` lives in
``api/renting.py``, ``down --orphans`` in ``api/orphans.py``, preemption detection in ``tick/leases.py``,
checkpoint shipping in ``tick/checkpoints.py`` (docs/checkpoints.md, docs/providers.md).

The provider adapters (``orchestrator.providers``) speak the vendor APIs; this module decides.  ``down``
terminates only when the user asked, and never while a job on the host has results that are not pulled
and verified (unless forced).  It also ends a machine whose row `gpuq up` wrote before a create call
that never answered (gpuq was killed): the instance is found by the name the row recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from orchestrator.api.budgeting import resume_refusals
from orchestrator.api.renting import checked_endpoint, up
from orchestrator.context import Context, verified_ids
from orchestrator.core.errors import GpuqError, HostError, ProviderError, UsageError
from orchestrator.core.states import (
    ANY_HOLD,
    LEASE_DOWN,
    LEASE_REVIVABLE,
    AttemptState,
    HoldChange,
    HoldKind,
    JobState,
    LeaseState,
)
from orchestrator.fleet import host_keys
from orchestrator.ledger import HostRow
from orchestrator.providers import registry
from orchestrator.providers.base import Provider
from orchestrator.tick import ACTIVE, teardown
from orchestrator.tick.leases import own_stop_record, provider_for, self_stopped
from orchestrator.tick.loop import run_tick

# --- down --------------------------------------------------------------------------------------


@dataclass
class DownPlan:
    hosts: list[HostRow]
    refused: dict[str, str]  # host -> why not (unverified results, running jobs, not rented)
    hourly: float  # what the hosts cost per hour while kept


def down_plan(ctx: Context, names: Sequence[str] = (), *, sweep: str | None = None, force: bool = False) -> DownPlan:
    """Which rented hosts a ``down`` would terminate, and which it refuses and why."""
    if not names and sweep is None:
        raise UsageError("name the hosts to terminate, or --sweep SWEEP for every rented host it used")
    rows: list[HostRow] = []
    if sweep is not None:
        sweep_id = ctx.ledger.resolve_sweep(sweep).id
        jobs = ctx.ledger.jobs(sweep_id=sweep_id)  # every host an attempt ran on: a lost one may still bill
        used = {j.host for j in jobs if j.host} | {a.host for a in ctx.ledger.attempts_of(j.id for j in jobs)}
        rows += [r for r in ctx.ledger.hosts() if r.name in (used | _replacements_of(ctx, used)) and r.provider]
    for name in names:
        row = ctx.ledger.host(name)
        if row is None:
            raise UsageError(f'unknown host "{name}"; `gpuq hosts list` shows the registered ones')
        if row not in rows:
            rows.append(row)
    verified = verified_ids(ctx)
    jobs = ctx.ledger.jobs()
    refused: dict[str, str] = {}
    for row in rows:
        why = teardown.refusal(row, jobs, verified, force=force)
        if why is not None:
            refused[row.name] = why
    keep = [r for r in rows if r.name not in refused]
    return DownPlan(keep, refused, sum(r.price_per_hour or 0.0 for r in keep))


def _replacements_of(ctx: Context, names: set[str]) -> set[str]:
    """Every host rented to replace one of ``names`` (and their replacements in turn): `gpuq resume`
    rents one for a sweep's lost host, and it bills even when the sweep's jobs ran elsewhere."""
    replaced_by: dict[str, list[str]] = {}
    for row in ctx.ledger.hosts():
        if row.replaces:
            replaced_by.setdefault(row.replaces, []).append(row.name)
    found: set[str] = set()
    todo = list(names)
    while todo:
        for new in replaced_by.get(todo.pop(), []):
            if new not in found and new not in names:
                found.add(new)
                todo.append(new)
    return found


def down(ctx: Context, plan: DownPlan) -> dict[str, str]:
    """Terminate the planned hosts and wait until the provider says they are gone (an
    acknowledgement is not proof).  Returns {host: outcome}."""
    out: dict[str, str] = {}
    for row in plan.hosts:
        if not row.instance_id:
            try:
                instance_id = _by_name(ctx, provider_for(ctx, row.provider), row)
            except ProviderError as exc:
                out[row.name] = f"terminate failed: {exc}"
                ctx.ledger.record_event("host", row.name, f"looking up {row.instance_name} failed: {exc}")
                continue
            if not instance_id:  # gpuq was killed before this create answered, and it made nothing
                ctx.ledger.remove_host(row.name, f"not created: no {row.provider} instance is named "
                                                 f"{row.instance_name}")
                out[row.name] = NEVER_CREATED
                continue
            found = ctx.ledger.host(row.name)  # _by_name recorded the id
            assert found is not None and found.instance_id == instance_id
            row = found
        out[row.name], _gone = teardown.terminate(ctx, row, reason="terminated by the user")
    return out


TERMINATED = "terminated"
NEVER_CREATED = "never created (no instance has its name): forgotten"


def _by_name(ctx: Context, prov: Provider, row: HostRow) -> str:
    """The id of the live instance named ``row.instance_name`` ("" if none), recorded in the row."""
    found = [i for i in prov.list_instances() if i.name == row.instance_name and not i.gone
             and i.state != "terminating"]
    if not found:
        return ""
    ctx.ledger.update_host(row.name, instance_id=found[0].id)
    ctx.ledger.record_event("host", row.name, f"{row.provider} {found[0].id} found by its name {row.instance_name}")
    return found[0].id


# --- resume ------------------------------------------------------------------------------------


@dataclass
class ResumeResult:
    requeued: list[str] = field(default_factory=list)  # job ids
    revived: dict[str, str] = field(default_factory=dict)  # host -> how (re-bid, replacement)
    failed: dict[str, str] = field(default_factory=dict)  # host -> why it could not be brought back
    skipped: list[str] = field(default_factory=list)  # jobs left alone (running, or over max_preemptions)
    refused: dict[str, str] = field(default_factory=dict)  # job -> why its sweep's budget keeps it (api/budgeting.py)


_STAYS_DOWN = frozenset({HoldKind.TERMINATED, HoldKind.REPLACED})  # the user (or gpuq) ended it, or it was replaced


def resume(ctx: Context, *, sweep: str | None = None, provision: bool = True, tick: bool = True) -> ResumeResult:
    """Continue every PREEMPTED or LOST job (and any job whose host is gone) from its newest verified
    checkpoint: re-bid the same spot pod when possible, else rent a replacement of the same shape
    (``provision``), else any healthy registered host.  Idempotent: jobs that run are left alone, a
    second run changes nothing.  A capped sweep's jobs resume only while it is under its cap (``refused``
    says why not; api/budgeting.py), and then start only as its budget fits them, as any queued job."""
    if tick:
        run_tick(ctx)  # probe: a mere SSH drop is not a loss; detect what the providers say
    sweep_id = ctx.ledger.resolve_sweep(sweep).id if sweep is not None else None
    stranded = [j for j in ctx.ledger.jobs(sweep_id=sweep_id, states=[JobState.PREEMPTED, JobState.LOST])]
    out = ResumeResult(refused=resume_refusals(ctx, stranded))  # a resume is a new attempt: only under the cap
    for job_id, why in out.refused.items():
        ctx.ledger.record_event("job", job_id, why, unless_repeated=True)
    stranded = [j for j in stranded if j.id not in out.refused]  # nor is a machine rented for them
    hosts_down = {j.host for j in stranded if j.host}
    for name in sorted(hosts_down):
        row = ctx.ledger.host(name)
        if row is None or not row.provider or row.lease not in LEASE_DOWN or row.hold in _STAYS_DOWN:
            continue  # a host the user terminated, or one already replaced, stays down
        how = _revive(ctx, row, provision)
        if how.startswith("failed"):
            out.failed[name] = how
        else:
            out.revived[name] = how
    held = _stopped_holding_results(ctx, sweep_id) - hosts_down
    for name in sorted(held):  # the same machine only: its disk holds their results (never a replacement)
        row = ctx.ledger.host(name)
        how = _revive(ctx, row, provision=False) if row is not None else "failed: no such host"
        (out.failed if how.startswith("failed") else out.revived)[name] = how
        back = ctx.ledger.host(name)
        if row is not None and back is not None and not how.startswith("failed"):
            own_stop_record(ctx, row, back)  # what it wrote before it stopped, now readable: kept as its claim
    for job in stranded:
        preemptions = sum(a.state == AttemptState.PREEMPTED.value for a in ctx.ledger.attempts(job.id))
        if preemptions > ctx.settings.max_preemptions:
            out.skipped.append(job.id)
            ctx.ledger.record_event("job", job.id, f"not resumed: {preemptions} preemptions (max_preemptions "
                                    f"{ctx.settings.max_preemptions})", unless_repeated=True)
            continue
        ctx.ledger.requeue(job.id, message="gpuq resume: from the newest verified checkpoint", via=None)
        out.requeued.append(job.id)
    if out.requeued or held & set(out.revived):
        run_tick(ctx)  # places them (the host holding their checkpoint first), pushes checkpoints, reads the
        # exit records of the jobs a host that stopped itself ended while no gpuq command ran
    return out


def _stopped_holding_results(ctx: Context, sweep_id: str | None) -> set[str]:
    """Rented hosts that stopped their own billing (tick/leases.py) while the ledger shows jobs live there:
    those jobs ended before the stop, unseen; their exit records and results are on the stopped disk."""
    hosts = {j.host for j in ctx.ledger.jobs(sweep_id=sweep_id, states=ACTIVE) if j.host}
    rows = [ctx.ledger.host(name) for name in sorted(hosts)]
    return {row.name for row in rows if row is not None and row.hold not in _STAYS_DOWN and self_stopped(ctx, row)}


def _revive(ctx: Context, row: HostRow, provision: bool) -> str:
    """Bring a rented host back: the same pod (re-bid or resume), else a replacement."""
    prov = provider_for(ctx, row.provider)
    if row.spot and not registry.entry(row.provider).capabilities().rebid:  # a RunPod spot pod of the v1 era
        ctx.ledger.record_event("host", row.name, f"{row.instance_id} is a spot machine and {row.provider} takes no "
                                "new bid now: not resuming it", unless_repeated=True)
    elif prov.supports_stop and row.lease in LEASE_REVIVABLE:
        try:
            bid = Decimal(str(row.bid_per_gpu)) if row.spot and row.bid_per_gpu is not None else None
            if row.spot and bid is None:
                bid = Decimal(str((row.price_per_hour or 0) / max(1, row.gpu_count)))
            prov.resume(row.instance_id, gpu_count=max(1, row.gpu_count), bid_per_gpu=bid)
            inst = prov.wait_ready(row.instance_id)
            if inst.gpu_count == 0:
                raise ProviderError(row.provider, "came back with zero GPUs", code="host_failure")
            host, port = checked_endpoint(row.provider, inst)
            user = row.target.split("@", 1)[0] if "@" in row.target else "root"
            ctx.fleet.drop(row.name)
            host_keys.move_endpoint(ctx.ledger, ctx.settings, row.name, f"{user}@{host}", port)
            ctx.ledger.lease_transition(row.name, LeaseState.RUNNING, "", unreachable_since=None, probe_failures=0,
                                        next_probe_at=None, hold=HoldChange(HoldKind.NONE,
                                                                            over=ANY_HOLD - {HoldKind.UNHEALTHY}))
            ctx.ledger.record_finding("host", row.name, severity="info", rule="spot_preemption",
                                      message=f"{row.instance_id} {'re-bid' if row.spot else 'resumed'}: back at "
                                              f"{inst.ssh_host}:{inst.ssh_port}")
            return "re-bid the same pod" if row.spot else "resumed the same machine"
        except (ProviderError, HostError) as exc:
            ctx.ledger.record_event("host", row.name, f"could not bring {row.instance_id} back: {exc}")
            if not provision:
                return f"failed: {exc}"
    if not provision:
        return "failed: the machine cannot be brought back and --no-provision was given"
    # a replacement rented earlier: running (a resume killed before it said so), or provisioning with no
    # hold (a `gpuq up` for it under way, or killed); one gpuq gave up on carries a hold
    earlier = [r for r in ctx.ledger.hosts() if r.replaces == row.name and (
        (r.lease is LeaseState.RUNNING and r.hold not in _STAYS_DOWN)
        or (r.lease is LeaseState.PROVISIONING and r.hold is HoldKind.NONE))]
    if earlier and earlier[0].lease is LeaseState.PROVISIONING:
        return (f"failed: its replacement {earlier[0].name} is still provisioning; if no gpuq is renting it, "
                f"`gpuq down {earlier[0].name}` and resume again")
    if earlier:  # rented by a resume killed before it said so: adopt it rather than rent a second one
        new = earlier[0]
    else:
        # gpuq never connects to the replaced machine again, and the provider may hand its IP:port to the
        # replacement (RunPod does): its pinned key must not be taken for the new machine's, changed
        host_keys.forget_row_keys(ctx.settings, row)
        try:  # the replacement's row names the host it replaces from before its create call
            made = up(ctx, provider=row.provider, gpu_type=row.gpu_type, count=1, gpus=max(1, row.gpu_count),
                      spot=row.spot, bid=row.bid_per_gpu, region=row.region or None, key=row.key_path,
                      profile=row.profile, prefix=row.name.split("-")[0][:12], replaces=row.name,
                      down_when_done=row.down_when_done)
        except GpuqError as exc:
            return f"failed: no replacement: {exc}"
        if not made.hosts:
            return f"failed: the replacement never became usable: {'; '.join(made.problems())}"
        new = made.hosts[0]
    _allow_replacement(ctx, row.name, new.name)
    ctx.ledger.change_hold(row.name, HoldChange(HoldKind.REPLACED, f"lease {row.lease.value}, by {new.name}"))
    return f"replaced by {new.name} ({new.instance_id})"


def _allow_replacement(ctx: Context, old: str, new: str) -> None:
    """Sweeps restricted to the lost host may use its replacement."""
    for sweep in ctx.ledger.sweeps():
        hosts = sweep.host_set()
        if old in hosts and new not in hosts:
            ctx.ledger.set_sweep_hosts(sweep.id, sorted(hosts | {new}))
