"""Host verbs: register, list, show, forget SSH hosts, accept a checked host key, stop an idle agent."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.agent import client
from orchestrator.agent.bundle import build_bundle
from orchestrator.agent.launcher import ensure_bundle
from orchestrator.context import Context, verified_ids
from orchestrator.core import protocol
from orchestrator.core.config import LOCAL_HOST
from orchestrator.core.errors import GpuqError, HostError, UsageError
from orchestrator.core.states import JobState, LeaseState
from orchestrator.fleet import host_keys, registering
from orchestrator.fleet import slurm as slurm_hosts
from orchestrator.health import setup_holds
from orchestrator.host_documents import AgentStop, Provenance
from orchestrator.ledger import HostRow, Job
from orchestrator.tick import ACTIVE


def hosts_add(ctx: Context, name: str, target: str, *, port: int | None = None, key: str = "",
              profile: str = registering.DEFAULT_SSH_PROFILE, root: str = "", python: str = "",
              trust_new_host_key: bool = False) -> registering.Registered:
    """Register an SSH host after a strictly verified connection and a one-round-trip audit."""
    return registering.register(ctx.ledger, ctx.settings, name, target, port=port, key=key, profile=profile, root=root,
                          python=python, trust_new_host_key=trust_new_host_key)


def hosts_add_slurm(ctx: Context, name: str, target: str, *, port: int | None = None, key: str = "", root: str = "",
                    python: str = "", profile: str = registering.DEFAULT_SSH_PROFILE, trust_new_host_key: bool = False,
                    partition: str = "", account: str = "",
                    qos: str = "", time_limit: str = "", sbatch_args: Sequence[str] = (),
                    max_jobs: int | None = None, signal_grace_s: int | None = None,
                    probe_wait_s: float = slurm_hosts.PROBE_WAIT_S) -> registering.Registered:
    """Register a Slurm cluster's login node (docs/slurm.md): the host audit, then Slurm's."""
    fields: dict[str, Any] = {"partition": partition, "account": account, "qos": qos, "time_limit": time_limit,
                              "sbatch_args": tuple(sbatch_args)}
    if max_jobs is not None:
        fields["max_jobs"] = max_jobs
    if signal_grace_s is not None:
        fields["signal_grace_s"] = signal_grace_s
    try:
        wanted = slurm_hosts.SlurmSettings(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "--" + str(first["loc"][0]).replace("_", "-") if first.get("loc") else "option"
        raise UsageError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
    return slurm_hosts.register(ctx.ledger, ctx.settings, name, target, wanted, port=port, key=key, root=root,
                                python=python, profile=profile, trust_new_host_key=trust_new_host_key,
                                probe_wait_s=probe_wait_s)


UNREGISTERED_LOCAL = "not registered yet (the first submit)"


def hosts_list(ctx: Context) -> list[HostRow]:
    """The registered hosts; on a ledger without the local host (a fresh ``$GPUQ_HOME``), ``local`` too,
    as the first ``gpuq submit`` will register it (a row of this answer only: nothing is written)."""
    rows = ctx.ledger.hosts()
    if not any(row.kind == "local" for row in rows):
        rows.insert(0, HostRow(name=LOCAL_HOST, kind="local", root=str(ctx.settings.local_host_root),
                               created_at=0.0))
    return rows


def unregistered(row: HostRow) -> bool:
    """The ``local`` row ``hosts_list`` adds on a ledger that has none (its ``created_at`` is 0)."""
    return row.kind == "local" and row.created_at == 0.0


@dataclass
class HostDetail:
    row: HostRow
    active: list[Job]
    unverified: list[Job]
    fingerprint: str
    events: list[Any]
    ran_with: Provenance | None = None  # what the newest attempt there ran with (GPUs, driver, versions)


def hosts_show(ctx: Context, name: str) -> HostDetail:
    row = ctx.ledger.host(name)
    if row is None:
        raise UsageError(f'unknown host "{name}"; `gpuq hosts list` shows the registered ones')
    active = [j for j in ctx.ledger.jobs(states=ACTIVE) if j.host == name]
    newest = ctx.ledger.newest_provenance(name)
    return HostDetail(row, active, _unverified_on(ctx, name), host_keys.key_fingerprint(row.host_key),
                      ctx.ledger.events(subject=name, limit=10, exact=True),
                      Provenance.from_stored(newest.provenance) if newest is not None else None)


def _unverified_on(ctx: Context, name: str) -> list[Job]:
    """Succeeded jobs whose results on ``name`` have not been pulled and verified."""
    verified = verified_ids(ctx)
    return [j for j in ctx.ledger.jobs(states=[JobState.SUCCEEDED]) if j.host == name and j.id not in verified]


def hosts_rm(ctx: Context, name: str, *, force: bool = False) -> None:
    """Forget a host.  Refused while jobs run there or its results are unverified (unless forced)."""
    detail = hosts_show(ctx, name)
    if detail.row.kind == "local":
        raise UsageError(f'"{name}" is the embedded local host; it cannot be removed')
    if detail.active:
        raise UsageError(f"host {name} has {len(detail.active)} unfinished jobs "
                         f"({', '.join(j.name for j in detail.active[:5])}); `gpuq cancel` them first")
    row = detail.row
    if row.provider and row.lease is not LeaseState.TERMINATED and not force:
        instance = row.instance_id or row.instance_name
        raise UsageError(f"host {name} is a {row.provider} machine gpuq rented ({instance}) "
                         f"and may still bill: `gpuq down {name}` ends it and keeps its record; --force forgets it "
                         "anyway (`gpuq down --orphans` finds it later)")
    if detail.unverified and not force:
        raise UsageError(f"host {name} holds unverified results of {len(detail.unverified)} jobs "
                         f"({', '.join(j.name for j in detail.unverified[:5])}); `gpuq pull` first, "
                         "or --force to forget them")
    host_keys.forget_host(ctx.ledger, ctx.settings, detail.row)


def hosts_trust(ctx: Context, name: str, fingerprint: str) -> str:
    """Replace a host's known key by the one it offers now, if it has the fingerprint the user checked."""
    return host_keys.trust(ctx.ledger, ctx.settings, name, fingerprint)


def hosts_release(ctx: Context, name: str) -> list[str]:
    """Lift the setup holds of host ``name`` (docs/your-project.md): the failed-setup records on the host
    go, so the next job of that bundle runs the project's setup there again.  Returns the bundles."""
    row = ctx.ledger.host(name)
    if row is None and name != LOCAL_HOST:
        raise UsageError(f'unknown host "{name}"; `gpuq hosts list` shows the registered ones')
    host = ctx.fleet.named(name)
    result = host.run(["sh", "-c", 'rm -f "$1"/*/failed.json', "sh", host.path(protocol.SETUP_DIR)], timeout=60)
    if result.exit_code != 0:
        raise HostError(name, f"could not clear the failed-setup records: {result.stderr.strip()[:200]}")
    return setup_holds.release(ctx.ledger, name)


def hosts_stop_agent(ctx: Context, name: str, *, force: bool = False) -> AgentStop:
    """Stop the agent of host ``name`` now instead of after its idle timeout (docs/cli.md).  The host's
    own agent code decides (payload/agent/gpuq_verbs/gpuq_stopagent.py): refused while it has work unless ``force``;
    forced, its running attempts keep running and the next agent adopts them.  Runs the agent of a bare
    bundle of this gpuq (pushed once, content-addressed) so an older bundle on the host never answers."""
    if name != LOCAL_HOST and ctx.ledger.host(name) is None:
        raise UsageError(f'unknown host "{name}"; `gpuq hosts list` shows the registered ones')
    host = ctx.fleet.named(name)
    with tempfile.TemporaryDirectory(prefix="gpuq-stop-agent-") as empty:
        bundle = build_bundle(Path(empty), ctx.settings.bundle_cache)
    try:
        ensure_bundle(host, bundle)
        done = client.stop_agent(host, bundle.sha256, force=force)
    except client.AgentRefused:
        raise
    except HostError as exc:
        raise GpuqError(f"host {name}: {exc}") from exc
    if done.outcome == "stopped":
        ctx.ledger.record_event("host", name, f"agent {done.pid} stopped on request"
                                + (f" with {len(done.running)} running jobs" if done.running else ""))
    return done
