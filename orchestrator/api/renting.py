"""``gpuq up``: rent machines so that none bills unseen (docs/providers.md).

Every machine is in the ledger before its create call: one host row per requested machine, lease state
``provisioning``, no address, and the provider-side name the create will use
(``gpuq-<ledger id>-<lease>[-<i>]``).  Each create's answer writes the instance id into its row at once
(``Provider.provision``'s ``on_created``), before the next create and before any wait.  Then each
machine waits for readiness, is audited over SSH and registered (address, price, ``running``).

What gpuq will not use (a machine that never became ready or failed its audit, every machine not yet
registered when ``up`` is interrupted) it terminates, waits until it is gone and says so; what it
cannot terminate stays recorded, held, with the command that ends it.  A crash of gpuq itself leaves
the rows: ``gpuq down HOST`` ends an instance whose id never came back by looking it up by name.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from orchestrator.api.rented import Unusable, UpInterrupted, UpResult, replace_unhealthy, send_leases
from orchestrator.context import Context
from orchestrator.core.config import Settings, load_profile
from orchestrator.core.errors import ConfigError, CreateUnknown, GpuqError, NoCapacity, ProviderError, UsageError
from orchestrator.core.states import HoldChange, HoldKind, LeaseState
from orchestrator.fleet import registering
from orchestrator.ledger import HostFields, HostRow
from orchestrator.money import rentplan
from orchestrator.providers import registry
from orchestrator.providers.base import Provider
from orchestrator.providers.models import LEDGER_ID, Instance, ProvisionRequest, instance_name, ssh_address
from orchestrator.tick import teardown
from orchestrator.tick.leases import provider_for

LEDGER_ID_FILE = "ledger-id"


def ledger_id(settings: Settings) -> str:
    """This ledger's id (``$GPUQ_HOME/ledger-id``, 8 hex digits, made on first use).  It is in the name of
    every instance this ledger rents, so `gpuq down --orphans` never takes another ledger's machines
    (another laptop's, a colleague's on the same account) for its own."""
    path = settings.home / LEDGER_ID_FILE
    text = _read_id(path)
    if text is None:
        tmp = path.with_name(f".{LEDGER_ID_FILE}.{os.getpid()}")
        tmp.write_text(secrets.token_hex(4) + "\n", encoding="utf-8")
        try:
            os.link(tmp, path)  # the first writer wins; a racing command reads its id
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        text = _read_id(path)
    if text is None or not LEDGER_ID.match(text):
        raise ConfigError(f"{path}: not a ledger id (8 hex digits); restore it from a copy of $GPUQ_HOME, or "
                          "remove it for a new one (`gpuq down --orphans` then no longer knows instances named "
                          "with the old id)")
    return text


def _read_id(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


def key_pair(settings: Settings, key: str) -> tuple[str, str]:
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


def check_spot(entry: registry.Entry) -> None:
    """UsageError (one line, nothing asked or written) for ``--spot`` with a provider whose adapter rents no
    spot machines (RunPod: its API v2 has none), naming the providers that do."""
    if entry.capabilities().spot:
        return
    markets = " or ".join(f"{e.spec.label} (--provider {e.name} --spot)" for e in registry.entries()
                          if e.capabilities().spot) or "none"
    raise UsageError(f"{entry.spec.label} rents no spot machines: gpuq's spot market is {markets}; "
                     "or rent on demand without --spot")


def up(ctx: Context, *, provider: str, gpu_type: str, count: int = 1, gpus: int = 1, spot: bool = False,
       bid: float | None = None, region: str | None = None, key: str = "", profile: str = "", prefix: str = "",
       replaces: str = "", say: Callable[[str], None] | None = None, down_when_done: bool | None = None,
       max_price: float | None = None) -> UpResult:
    """Rent ``count`` machines, wait until each answers SSH, register them with their price, and run
    the GPU preflight.  Each machine is recorded before its create call (see the module docstring).
    Raises the provider's error when no machine was created at all; otherwise the result says which
    were not created, which gpuq ended and which may still bill.  ``replaces``: the host a replacement
    is rented for (`gpuq resume`).  ``say``: progress lines for people.  ``down_when_done`` (None: the
    ``auto_down`` setting): the tick ends each machine once its work is over (tick/billing.py).
    ``max_price``: the most one machine may cost per hour; the provider is asked for none dearer (its price,
    or for spot its current minimum bid, read before the create: ``NoCapacity`` and nothing rented)."""
    entry = registry.entry(provider)  # UsageError for a provider gpuq does not know
    if spot:
        check_spot(entry)
    if count < 1 or gpus < 1:
        raise UsageError("--count and --gpus must be at least 1")
    if bid is not None and not spot:
        raise UsageError("--bid is a spot bid: add --spot")
    prof = load_profile(profile or provider)
    private, public = key_pair(ctx.settings, key)
    prov = provider_for(ctx, provider)
    lease = secrets.token_hex(3)
    base = prefix or provider[:6]
    names = [f"{base}-{lease}-{i}" for i in range(count)]
    taken = [n for n in names if ctx.ledger.host(n) is not None]
    if taken:
        raise UsageError(f'host "{taken[0]}" is already registered; pick another --prefix')
    request = ProvisionRequest(name=instance_name(ledger_id(ctx.settings), lease), gpu_type=gpu_type, gpu_count=gpus,
                               count=count, spot=spot, bid_per_gpu=Decimal(str(bid)) if bid is not None else None,
                               max_price_per_hour=Decimal(str(max_price)) if max_price is not None else None,
                               region=region, ssh_public_key=public)
    rental = _Rental(ctx, prov, UpResult(provider, lease, wanted=count), dict(zip(request.names(), names, strict=True)),
                     say or (lambda _line: None))
    try:
        rental.record(request, profile=prof.name, key=private, replaces=replaces,
                      down_when_done=ctx.settings.auto_down if down_when_done is None else down_when_done)
        rental.rent(request)
        rental.make_ready(profile=prof.name, key=private, user=str(prof.connect.get("user") or "root"),
                          spot=spot, bid=bid, gpus=gpus, gpu_type=gpu_type, region=region)
    except KeyboardInterrupt as exc:
        rental.say("gpuq: interrupted: ending the machines rented and not yet registered (Ctrl-C again leaves them "
                   "to `gpuq down`)")
        rental.abandon("`gpuq up` was interrupted")
        raise UpInterrupted(rental.out) from exc
    except BaseException:
        rental.abandon("`gpuq up` failed")
        raise
    out = rental.out
    send_leases(ctx, out)  # before the preflight starts the agent: it keeps the notice the lease carries
    if out.hosts:
        from orchestrator.api.health import doctor

        out.verdicts = {v.host: v for v in doctor(ctx, [h.name for h in out.hosts])}
        if not replaces:  # a replacement that fails too is said and held, never replaced in turn: no loop
            replace_unhealthy(ctx, out, lambda old: up(
                ctx, provider=provider, gpu_type=gpu_type, count=1, gpus=gpus, spot=spot, bid=bid, region=region,
                key=key, profile=profile, prefix=prefix, replaces=old, say=say, down_when_done=True), rental.say)
    return out


class _Rental:
    """One ``gpuq up``: its rows, what each create answered, what became of each machine."""

    def __init__(self, ctx: Context, prov: Provider, out: UpResult, hosts: dict[str, str],
                 say: Callable[[str], None]) -> None:
        self.ctx, self.prov, self.out, self.say = ctx, prov, out, say
        self.hosts = hosts  # instance name -> host name, in order
        self.ids: dict[str, str] = {}  # host -> instance id, as each create answered
        self.done: set[str] = set()  # hosts registered, ended or forgotten: nothing left to clean up
        self.creating = False  # inside the create calls: the first host without an id may be in flight
        self.cap: Decimal | None = None  # --max-price: a machine priced above it once created is ended unused

    # -- before any create ----------------------------------------------------------------------------------

    def record(self, request: ProvisionRequest, *, profile: str, key: str, replaces: str,
               down_when_done: bool) -> None:
        """One row per machine, written before the first create call."""
        provider = self.out.provider
        bid = request.bid_per_gpu
        for iname, host in self.hosts.items():
            self.ctx.ledger.add_host(HostRow(
                name=host, kind="ssh", target="", root="", port=0, profile=profile, key_path=key, provider=provider,
                instance_name=iname, spot=request.spot, bid_per_gpu=float(bid) if bid is not None else None,
                gpu_type=request.gpu_type, gpu_count=request.gpu_count, region=request.region or "",
                price_per_hour=float(bid * request.gpu_count) if bid is not None else None,
                lease_state=LeaseState.PROVISIONING.value, lease_reason="recorded before its create call",
                lease_changed_at=time.time(), replaces=replaces, down_when_done=down_when_done, created_at=0.0))
            self.ctx.ledger.record_event("host", host, f"renting {provider} {iname} ({request.gpu_count}x "
                                                       f"{request.gpu_type}{', spot' if request.spot else ''})")

    # -- the creates ------------------------------------------------------------------------------------------

    def created(self, iname: str, instance_id: str) -> None:
        """A create answered (or an instance of that name was adopted): its id goes into its row now."""
        host = self.hosts[iname]
        self.ids[host] = instance_id
        self.ctx.ledger.lease_transition(host, LeaseState.PROVISIONING, "created; not ready yet",
                                         instance_id=instance_id)
        self.ctx.ledger.record_event("host", host, f"{self.out.provider} {instance_id} created as {iname}")
        self.say(f"{host}: {self.out.provider} {instance_id} created; waiting until it is ready")

    def rent(self, request: ProvisionRequest) -> None:
        """The create calls.  A failure part-way keeps what was created; a machine whose create failed
        in a way that may have been applied server-side is looked up by its name."""
        failure: GpuqError | None = None
        self.cap = request.max_price_per_hour
        self.creating = True
        try:
            made = self.prov.provision(request, on_created=self.created)
        except GpuqError as exc:
            failure, made = exc, []
        self.creating = False
        for inst in made:
            host = self.hosts.get(inst.name) or next((h for h, i in self.ids.items() if i == inst.id), "")
            if host and inst.price_per_hour is not None:
                self.ctx.ledger.update_host(host, price_per_hour=float(inst.price_per_hour))
        missing = [h for h in self.hosts.values() if h not in self.ids]
        if not missing:
            return
        why = str(failure) if failure is not None else "the provider returned no instance for it"
        if isinstance(failure, CreateUnknown):  # its machine may exist: never "not created" before it is known
            missing = self._look_up(missing, why)
        elif not isinstance(failure, NoCapacity):  # a capacity error created nothing; anything else may have
            try:
                named = self._named()
            except GpuqError as exc:
                for host in missing:
                    self._unknown(host, f"its create call failed ({why}) and gpuq could not check whether it made "
                                        f"the machine ({exc})")
                missing = []
            else:
                for iname, host in self.hosts.items():
                    if host in missing and iname in named:
                        self.created(iname, named[iname].id)
                        missing.remove(host)
        for host in missing:
            self._forget(host, why)
        self.out.shortfall = why
        if failure is not None and not self.ids and not self.out.unknown:
            raise failure  # nothing was created: the provider's error is the whole story

    def _look_up(self, missing: list[str], why: str) -> list[str]:
        """After a CreateUnknown for ``missing[0]`` (the later ones were never asked for): look the machines up
        by their names for ``create_lookup_s`` (a listing lags behind a create).  One found is created; the
        first, still unseen, stays unknown (its row kept, its name looked up again by the tick and by
        `gpuq down`).  Returns the hosts whose create was never made."""
        settings = self.ctx.settings
        deadline = time.monotonic() + settings.create_lookup_s
        pause = settings.provider_poll_s or 5.0
        left = list(missing)
        while True:
            try:
                named = self._named()
            except GpuqError:
                named = {}
            for iname, host in self.hosts.items():
                if host in left and iname in named:
                    self.created(iname, named[iname].id)
                    left.remove(host)
            now = time.monotonic()
            if missing[0] not in left or now >= deadline:
                break
            time.sleep(min(pause, deadline - now))
        if missing[0] in left:
            self._unknown(missing[0], f"its create call failed ({why}) and no instance had its name "
                                      f"{settings.create_lookup_s:.0f} s later: it may still be made")
            left.remove(missing[0])
        return left

    # -- after the creates --------------------------------------------------------------------------------------

    def make_ready(self, *, profile: str, key: str, user: str, spot: bool, bid: float | None, gpus: int,
                   gpu_type: str, region: str | None) -> None:
        """Wait for each created machine and register it; a machine that never becomes usable is ended."""
        for host in self.hosts.values():
            instance_id = self.ids.get(host)
            if not instance_id or host in self.done:
                continue
            try:
                ready = self.prov.wait_ready(instance_id)
                if ready.price_per_hour is not None:  # known from here on, whatever the audit says
                    self.ctx.ledger.update_host(host, price_per_hour=float(ready.price_per_hour))
                over = rentplan.over_cap(ready.price_per_hour, self.cap)
                if over is not None:
                    raise ProviderError(self.out.provider, over, code="over-price")
                row = _register(self.ctx, host, ready, profile, key, self.out.provider, spot, bid, gpus, gpu_type,
                                region, user)
            except GpuqError as exc:
                self.out.unusable.append(self.end(host, instance_id, f"not usable ({exc})"))
                continue
            self.done.add(host)
            self.out.hosts.append(row)

    def end(self, host: str, instance_id: str, why: str) -> Unusable:
        """Terminate a machine gpuq will not use and wait until it is gone (teardown.end_instance); when that
        fails, the row stays, held, and says how to end it."""
        self.done.add(host)
        ledger, provider = self.ctx.ledger, self.out.provider
        try:
            teardown.end_instance(self.ctx, self.prov, host, instance_id, reason=f"{why}; terminated by gpuq",
                                  event=f"{provider} {instance_id} {why}: terminated by gpuq (gone)")
        except GpuqError as exc:
            row = ledger.host(host)
            # a row without an address stays provisioning: never probed, never given work
            state = LeaseState.FAILED if row is not None and row.target else LeaseState.PROVISIONING
            ledger.lease_transition(host, state, f"{why}; terminating it failed ({exc}): `gpuq down {host}` ends it",
                                    hold=HoldChange(HoldKind.UNUSABLE, why))
            ledger.record_event("host", host, f"{provider} {instance_id} {why}; terminate failed: {exc}")
            return Unusable(host, instance_id, why, ended=False, end_error=str(exc))
        return Unusable(host, instance_id, why, ended=True)

    def abandon(self, why: str) -> None:
        """``up`` stops early (interrupted, or an unexpected error): every machine not yet registered is
        ended; one whose create never answered is looked up by its name first."""
        named: dict[str, Instance] | None = None
        in_flight = self.creating  # the first host without an id: its create may still be made server-side
        for iname, host in self.hosts.items():
            if host in self.done:
                continue
            try:
                row = self.ctx.ledger.host(host)
                if row is None:
                    continue
                instance_id = row.instance_id or self.ids.get(host, "")
                if not instance_id:
                    named = self._named() if named is None else named
                    maybe_in_flight, in_flight = in_flight, False
                    if iname not in named and maybe_in_flight:
                        self._unknown(host, f"{why} during its create call, and no instance has its name yet")
                        continue
                    if iname not in named:
                        self._forget(host, f"{why} before its create call")
                        continue
                    instance_id = named[iname].id
                    self.created(iname, instance_id)
                self.out.unusable.append(self.end(host, instance_id, f"not registered when {why}"))
            except Exception as exc:  # the ledger or the provider failing now: the row says what is known
                self.out.unknown[host] = (f"{why}; gpuq could not end its machine ({exc}): `gpuq down {host}` "
                                          "ends it (by its name if its create never answered)")

    # -- helpers ------------------------------------------------------------------------------------------------

    def _named(self) -> dict[str, Instance]:
        """The account's live instances that carry one of this rental's names."""
        return {i.name: i for i in self.prov.list_instances() if i.name in self.hosts and not i.gone
                and i.state != "terminating"}

    def _forget(self, host: str, why: str) -> None:
        """No machine was created for this row: nothing bills, the row goes."""
        self.ctx.ledger.remove_host(host, f"not created: {why}")
        self.done.add(host)
        self.out.not_created.append(host)

    def _unknown(self, host: str, why: str) -> None:
        self.ctx.ledger.lease_transition(host, LeaseState.PROVISIONING,
                                         f"{why}; `gpuq down {host}` checks by its name and ends it")
        self.done.add(host)
        self.out.unknown[host] = f"{why}; `gpuq down {host}` checks by its name and ends it"


def checked_endpoint(provider: str, inst: Instance) -> tuple[str, int]:
    """The SSH endpoint ``inst`` is ready at, checked once before any row records it (models.ssh_address: an IP
    address, or a host name under a domain the adapter declares); ProviderError for anything else."""
    if not inst.ssh_host or inst.ssh_port is None:
        raise GpuqError(f"{provider} {inst.id} is ready without an SSH endpoint")
    endpoint = ssh_address(inst.ssh_host, inst.ssh_port, registry.ssh_names(provider))
    if endpoint is None:
        raise ProviderError(provider, f"{inst.id} is ready at {inst.ssh_host[:80]!a} port {inst.ssh_port}, "
                            "not an IP address and port: not connecting there", code="bad-address")
    return endpoint


def _register(ctx: Context, name: str, inst: Instance, profile: str, key: str, provider: str, spot: bool,
              bid: float | None, gpus: int, gpu_type: str, region: str | None, user: str) -> HostRow:
    host, port = checked_endpoint(provider, inst)
    inst = dataclasses.replace(inst, ssh_host=host, ssh_port=port)
    price = inst.price_per_hour
    if price is None and bid is not None:
        price = Decimal(str(bid)) * gpus
    lease: HostFields = {
        "provider": provider, "instance_id": inst.id, "spot": spot, "bid_per_gpu": bid,
        # the id gpuq rented it by (a replacement is rented by it), not the provider's display name
        # for it (RunPod: "RTX A6000" for the id "NVIDIA RTX A6000")
        "gpu_type": gpu_type or inst.gpu_type or "", "gpu_count": inst.gpu_count or gpus,
        "region": inst.region or region or "", "price_per_hour": float(price) if price is not None else None}
    # a machine gpuq rented itself has no out-of-band host key: its first key is trusted and pinned
    # (a later change is refused like on any host); the audit and the lease fill in the row written
    # before the create call, in one transaction
    registering.register(ctx.ledger, ctx.settings, name, f"{user}@{inst.ssh_host}", port=inst.ssh_port, key=key,
                   profile=profile, trust_new_host_key=True, rented=lease)
    ctx.ledger.record_event("host", name, f"rented {provider} {inst.id} ({gpus}x {gpu_type}"
                                          f"{', spot' if spot else ''}) at {inst.ssh_host}:{inst.ssh_port}")
    row = ctx.ledger.host(name)
    assert row is not None
    return row
