"""Rented hosts: ``up`` (provision, wait for SSH, register, preflight), ``down`` (terminate behind the
teardown gate) and ``resume``; preemption detection lives in ``tick/leases.py``, checkpoint shipping in
``tick/checkpoints.py`` (docs/checkpoints.md, docs/providers.md).

The provider adapters (``orchestrator.providers``) speak the vendor APIs; this module decides.  gpuq
never destroys anything on its own: only ``down`` terminates, only when the user asked, and never
while a job on the host has results that are not pulled and verified (unless forced).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from orchestrator import fleet
from orchestrator.config import Settings, load_profile
from orchestrator.context import Context, verified_ids
from orchestrator.errors import GpuqError, HostError, ProviderError, UsageError
from orchestrator.ledger import HostRow
from orchestrator.providers.base import Instance, ProvisionRequest
from orchestrator.states import AttemptState, JobState
from orchestrator.tick.leases import PROVIDERS, provider_for
from orchestrator.tick.loop import run_tick
from orchestrator.tick.preflight import HealthVerdict

LEASE_GONE = ("terminated",)
LEASE_DOWN = ("preempted", "stopped", "failed", "terminated")


def _key_pair(settings: Settings, key: str) -> tuple[str, str]:
    """(private key path, public key text) for the machines gpuq rents."""
    candidates = [key or settings.ssh_key] if (key or settings.ssh_key) else [
        str(Path.home() / ".ssh" / "id_ed25519"), str(Path.home() / ".ssh" / "id_rsa")]
    for path in candidates:
        private = Path(path).expanduser()
        public = private.with_name(private.name + ".pub")
        if private.is_file() and public.is_file():
            return str(private), public.read_text(encoding="utf-8").strip()
    raise UsageError(f"no SSH key pair found ({', '.join(candidates)} with a .pub next to it); "
                     "pass --key PATH or set ssh_key in $GPUQ_HOME/config.toml")


# --- up ----------------------------------------------------------------------------------------


@dataclass
class UpResult:
    provider: str
    lease: str
    hosts: list[HostRow] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    verdicts: dict[str, HealthVerdict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # instance id -> why it is not a usable host


def up(ctx: Context, *, provider: str, gpu_type: str, count: int = 1, gpus: int = 1, spot: bool = False,
       bid: float | None = None, region: str | None = None, key: str = "", profile: str = "",
       prefix: str = "") -> UpResult:
    """Rent ``count`` machines, wait until each answers SSH, register them with their price, and run
    the GPU preflight.  A machine that never becomes usable is reported with its instance id (it may
    bill: `gpuq down` it or terminate it in the console); nothing is destroyed here."""
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r} (known: {', '.join(PROVIDERS)})")
    if count < 1 or gpus < 1:
        raise UsageError("--count and --gpus must be at least 1")
    if bid is not None and not spot:
        raise UsageError("--bid is a spot bid: add --spot")
    prof = load_profile(profile or provider)
    private, public = _key_pair(ctx.settings, key)
    prov = provider_for(ctx, provider)
    lease = secrets.token_hex(3)
    base = prefix or provider[:6]
    names = [f"{base}-{lease}-{i}" for i in range(count)]
    taken = [n for n in names if ctx.ledger.host(n) is not None]
    if taken:
        raise UsageError(f'host "{taken[0]}" is already registered; pick another --prefix')
    request = ProvisionRequest(name=f"gpuq-{lease}", gpu_type=gpu_type, gpu_count=gpus, count=count, spot=spot,
                               bid_per_gpu=Decimal(str(bid)) if bid is not None else None, region=region,
                               ssh_public_key=public)
    instances = prov.provision(request)
    out = UpResult(provider, lease, instances=list(instances))
    for name, inst in zip(names, instances, strict=False):
        try:
            ready = prov.wait_ready(inst.id)
            row = _register(ctx, name, ready, prof.name, private, provider, spot, bid, gpus, gpu_type, region,
                            str(prof.connect.get("user") or "root"))
            out.hosts.append(row)
        except GpuqError as exc:
            out.failed[inst.id] = str(exc)
            ctx.ledger.record_event("host", name, f"rented {provider} {inst.id} not usable: {exc}")
    if out.hosts:
        from orchestrator.api.health import doctor

        out.verdicts = {v.host: v for v in doctor(ctx, [h.name for h in out.hosts])}
    return out


def _register(ctx: Context, name: str, inst: Instance, profile: str, key: str, provider: str, spot: bool,
              bid: float | None, gpus: int, gpu_type: str, region: str | None, user: str) -> HostRow:
    if not inst.ssh_host or inst.ssh_port is None:
        raise GpuqError(f"{provider} {inst.id} is ready without an SSH endpoint")
    # a machine gpuq rented itself has no out-of-band host key: its first key is trusted and pinned
    # (a later change is refused like on any host)
    fleet.register(ctx.ledger, ctx.settings, name, f"{user}@{inst.ssh_host}", port=inst.ssh_port, key=key,
                   profile=profile, trust_new_host_key=True)
    price = inst.price_per_hour
    if price is None and bid is not None:
        price = Decimal(str(bid)) * gpus
    ctx.ledger.update_host(name, provider=provider, instance_id=inst.id, spot=spot, bid_per_gpu=bid,
                           # the id gpuq rented it by (a replacement is rented by it), not the provider's
                           # display name for it (RunPod: "RTX A6000" for the id "NVIDIA RTX A6000")
                           gpu_type=gpu_type or inst.gpu_type or "", gpu_count=inst.gpu_count or gpus,
                           region=inst.region or region or "",
                           price_per_hour=float(price) if price is not None else None,
                           lease_state="running", lease_reason="", lease_changed_at=time.time())
    ctx.ledger.record_event("host", name, f"rented {provider} {inst.id} ({gpus}x {gpu_type}"
                                          f"{', spot' if spot else ''}) at {inst.ssh_host}:{inst.ssh_port}")
    row = ctx.ledger.host(name)
    assert row is not None
    return row


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
    refused: dict[str, str] = {}
    for row in rows:
        if not row.provider or not row.instance_id:
            refused[row.name] = "not rented by gpuq (no provider instance): release it yourself"
            continue
        if row.lease_state in LEASE_GONE:
            refused[row.name] = "already terminated"
            continue
        mine = [j for j in ctx.ledger.jobs() if j.host == row.name]
        active = [j for j in mine if j.state in (JobState.ASSIGNED.value, JobState.RUNNING.value)]
        unverified = [j for j in mine if j.state == JobState.SUCCEEDED.value and j.id not in verified]
        if active and not force:
            refused[row.name] = (f"{len(active)} job(s) still run there ({', '.join(j.name for j in active[:3])}); "
                                 "cancel them or pass --force")
        elif unverified and not force:
            refused[row.name] = (f"{len(unverified)} job(s) with results not pulled and verified "
                                 f"({', '.join(j.name for j in unverified[:3])}); `gpuq pull` first, or --force "
                                 "to lose them")
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
        prov = provider_for(ctx, row.provider)
        try:
            prov.terminate(row.instance_id)
            prov.wait_gone(row.instance_id)
        except ProviderError as exc:
            out[row.name] = f"terminate failed: {exc}"
            ctx.ledger.record_event("host", row.name, f"terminate of {row.instance_id} failed: {exc}")
            continue
        ctx.fleet.drop(row.name)
        fleet.forget_row_keys(ctx.settings, row)  # the provider may hand this IP:port to the next machine
        ctx.ledger.update_host(row.name, lease_state="terminated", lease_reason="terminated by the user",
                               lease_changed_at=time.time(), hold_reason="terminated")
        ctx.ledger.record_event("host", row.name, f"{row.provider} {row.instance_id} terminated (gone)")
        out[row.name] = "terminated"
    return out


# --- resume ------------------------------------------------------------------------------------


@dataclass
class ResumeResult:
    requeued: list[str] = field(default_factory=list)  # job ids
    revived: dict[str, str] = field(default_factory=dict)  # host -> how (re-bid, replacement)
    failed: dict[str, str] = field(default_factory=dict)  # host -> why it could not be brought back
    skipped: list[str] = field(default_factory=list)  # jobs left alone (running, or over max_preemptions)


def resume(ctx: Context, *, sweep: str | None = None, provision: bool = True, tick: bool = True) -> ResumeResult:
    """Continue every PREEMPTED or LOST job (and any job whose host is gone) from its newest verified
    checkpoint: re-bid the same spot pod when possible, else rent a replacement of the same shape
    (``provision``), else any healthy registered host.  Idempotent: jobs that run are left alone, a
    second run changes nothing."""
    if tick:
        run_tick(ctx)  # probe: a mere SSH drop is not a loss; detect what the providers say
    sweep_id = ctx.ledger.resolve_sweep(sweep).id if sweep is not None else None
    stranded = [j for j in ctx.ledger.jobs(sweep_id=sweep_id, states=[JobState.PREEMPTED, JobState.LOST])]
    out = ResumeResult()
    hosts_down = {j.host for j in stranded if j.host}
    for name in sorted(hosts_down):
        row = ctx.ledger.host(name)
        if row is None or not row.provider or row.lease_state not in LEASE_DOWN or row.hold_reason.startswith(
                ("terminated", "lease ")):
            continue  # a host the user terminated, or one already replaced, stays down
        how = _revive(ctx, row, provision)
        if how.startswith("failed"):
            out.failed[name] = how
        else:
            out.revived[name] = how
    for job in stranded:
        preemptions = sum(a.state == AttemptState.PREEMPTED.value for a in ctx.ledger.attempts(job.id))
        if preemptions > ctx.settings.max_preemptions:
            out.skipped.append(job.id)
            ctx.ledger.record_event("job", job.id, f"not resumed: {preemptions} preemptions (max_preemptions "
                                    f"{ctx.settings.max_preemptions})", unless_repeated=True)
            continue
        ctx.ledger.requeue(job.id, message="gpuq resume: from the newest verified checkpoint", via=None)
        out.requeued.append(job.id)
    if out.requeued:
        run_tick(ctx)  # places them (the host holding their checkpoint first) and pushes checkpoints
    return out


def _revive(ctx: Context, row: HostRow, provision: bool) -> str:
    """Bring a rented host back: the same pod (re-bid or resume), else a replacement."""
    prov = provider_for(ctx, row.provider)
    if prov.supports_stop and row.lease_state in ("preempted", "stopped"):
        try:
            bid = Decimal(str(row.bid_per_gpu)) if row.spot and row.bid_per_gpu is not None else None
            if row.spot and bid is None:
                bid = Decimal(str((row.price_per_hour or 0) / max(1, row.gpu_count)))
            prov.resume(row.instance_id, gpu_count=max(1, row.gpu_count), bid_per_gpu=bid)
            inst = prov.wait_ready(row.instance_id)
            if inst.gpu_count == 0:
                raise ProviderError(row.provider, "came back with zero GPUs", code="host_failure")
            assert inst.ssh_host and inst.ssh_port is not None
            user = row.target.split("@", 1)[0] if "@" in row.target else "root"
            ctx.fleet.drop(row.name)
            fleet.move_endpoint(ctx.ledger, ctx.settings, row.name, f"{user}@{inst.ssh_host}", inst.ssh_port)
            ctx.ledger.update_host(row.name, lease_state="running", lease_reason="", lease_changed_at=time.time(),
                                   unreachable_since=None, probe_failures=0, next_probe_at=None,
                                   hold_reason="" if not row.hold_reason.startswith("unhealthy") else row.hold_reason)
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
    ctx.ledger.update_host(row.name, hold_reason=f"lease {row.lease_state}: replaced")
    # gpuq never connects to the replaced machine again, and the provider may hand its IP:port to the
    # replacement (RunPod does): its pinned key must not be taken for the new machine's, changed
    fleet.forget_row_keys(ctx.settings, row)
    try:
        made = up(ctx, provider=row.provider, gpu_type=row.gpu_type, count=1, gpus=max(1, row.gpu_count),
                  spot=row.spot, bid=row.bid_per_gpu, region=row.region or None, key=row.key_path,
                  profile=row.profile, prefix=row.name.split("-")[0][:12])
    except GpuqError as exc:
        return f"failed: no replacement: {exc}"
    if not made.hosts:
        return f"failed: the replacement never became usable: {'; '.join(made.failed.values())}"
    ctx.ledger.update_host(made.hosts[0].name, replaces=row.name)
    _allow_replacement(ctx, row.name, made.hosts[0].name)
    return f"replaced by {made.hosts[0].name} ({made.instances[0].id})"


def _allow_replacement(ctx: Context, old: str, new: str) -> None:
    """Sweeps restricted to the lost host may use its replacement."""
    for sweep in ctx.ledger.sweeps():
        hosts = sweep.host_set()
        if old in hosts and new not in hosts:
            ctx.ledger.set_sweep_hosts(sweep.id, sorted(hosts | {new}))
