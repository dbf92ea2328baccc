"""``gpuq hosts add|list|show|rm|trust|release|stop-agent``: the SSH hosts gpuq may use."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli import complete
from orchestrator.cli.ctx import echo, open_ctx, warn

if TYPE_CHECKING:
    from orchestrator.api import HostDetail
    from orchestrator.ledger import HostRow


@click.group()
def hosts() -> None:
    """Register, list, inspect and forget SSH hosts."""


@hosts.command("add")
@click.argument("name")
@click.argument("target", required=False, default="")
@click.option("--port", type=int, help="SSH port (default: from ~/.ssh/config, else 22).")
@click.option("--key", default="", metavar="FILE", help="Private key to log in with.")
@click.option("--profile", default="ssh", show_default=True, help="Platform profile (profiles/*.toml).")
@click.option("--root", default="", metavar="DIR",
              help="gpuq's data dir on the host (default: the profile's); on Slurm, one the compute nodes see.")
@click.option("--python", default="", metavar="PATH", help="Interpreter on the host (default: the profile's).")
@click.option("--trust-new-host-key", is_flag=True,
              help="Trust an unknown host key on first use (check its fingerprint first).")
@click.option("--slurm", "slurm_target", default="", metavar="TARGET",
              help="A Slurm cluster: its login node (user@address or an ~/.ssh/config alias), or `local` when "
                   "gpuq runs on the login node.  Each job becomes one Slurm job (docs/slurm.md).")
@click.option("--partition", default="", help="Slurm partition (default: the cluster's default partition).")
@click.option("--account", default="", help="Slurm account to charge.")
@click.option("--qos", default="", help="Slurm QOS.")
@click.option("--time-limit", default="", metavar="TIME",
              help="Slurm time limit per job (MINUTES, H:MM:SS or D-HH:MM:SS); a job stopped by it resumes "
                   "from its checkpoint in a new Slurm job.")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="--OPTION=VALUE",
              help="Another sbatch option for every job (repeatable), e.g. --sbatch-arg=--constraint=a100.")
@click.option("--signal-grace", type=click.IntRange(1, 3600), default=None, metavar="SECONDS",
              help="Slurm: warn a job this long before its time limit (--signal=B:USR1@SECONDS) so it saves a "
                   "checkpoint and continues in a new Slurm job (default: kill_grace_s + 30, at least 60).")
@click.option("--max-jobs", type=click.IntRange(1, 100_000), default=None,
              help="At most this many gpuq jobs in Slurm's queue at once (default 100); the rest wait in gpuq.")
def add(name: str, target: str, port: int | None, key: str, profile: str, root: str, python: str,
        trust_new_host_key: bool, slurm_target: str, partition: str, account: str, qos: str, time_limit: str,
        sbatch_args: tuple[str, ...], max_jobs: int | None, signal_grace: int | None) -> None:
    """Register host NAME reached at TARGET (user@address or an ~/.ssh/config alias), or a Slurm
    cluster with --slurm TARGET."""
    from orchestrator import api
    from orchestrator.core.errors import UsageError
    from orchestrator.fleet.host_keys import key_fingerprint

    slurm_only = {"--partition": partition, "--account": account, "--qos": qos, "--time-limit": time_limit,
                  "--sbatch-arg": sbatch_args, "--max-jobs": max_jobs, "--signal-grace": signal_grace}
    if slurm_target and target:
        raise UsageError(f"give the login node once: `gpuq hosts add {name} --slurm {slurm_target}` (no TARGET)")
    if not slurm_target and not target:
        raise UsageError(f"`gpuq hosts add {name} TARGET` needs TARGET (user@address or an ~/.ssh/config alias), "
                         "or --slurm TARGET for a Slurm cluster")
    used = [flag for flag, value in slurm_only.items() if value]
    if used and not slurm_target:
        raise UsageError(f"{', '.join(used)} only apply to a Slurm host: add --slurm TARGET")
    ctx = open_ctx()
    if slurm_target:
        done = api.hosts_add_slurm(ctx, name, slurm_target, port=port, key=key, root=root, python=python,
                                   profile=profile,
                                   trust_new_host_key=trust_new_host_key, partition=partition, account=account,
                                   qos=qos, time_limit=time_limit, sbatch_args=sbatch_args, max_jobs=max_jobs,
                                   signal_grace_s=signal_grace)
        about = done.slurm
        gpus = about.get("gpus_per_node") or 0
        echo(f"added {name}: Slurm cluster via {slurm_target} ({about.get('version', '?')}), partition "
                   f"{about.get('partition', '?')}, {f'{gpus} GPUs per node' if gpus else 'no GPU GRES'}, "
                   f"root={done.row.root} (shared with the compute nodes: "
                   f"{'yes' if about.get('probe') == 'shared' else 'not confirmed'}), "
                   f"at most {done.row.slots_total} jobs in Slurm's queue")
    else:
        done = api.hosts_add(ctx, name, target, port=port, key=key, profile=profile, root=root, python=python,
                             trust_new_host_key=trust_new_host_key)
        facts = done.facts
        gpus_found = facts.gpus
        kind = f"{len(gpus_found)} GPU ({gpus_found[0].name})" if gpus_found else f"{done.row.slots_total} CPU slots"
        echo(f"added {name}: {target} root={done.row.root} python={done.row.python} "
                   f"(Python {'.'.join(map(str, facts.version))}), {kind}, "
                   f"{(facts.free_bytes or 0) / 1e9:.1f} GB free")
    if done.trusted_key:
        echo(f"trusted new host key {key_fingerprint(done.trusted_key)} (recorded in gpuq's known_hosts)")
    for warning in done.warnings:
        warn(warning)


@hosts.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout (docs/schemas/hosts.schema.json).")
def list_(as_json: bool) -> None:
    """One line per host: reachability, slots, last probe."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from orchestrator import api
    from orchestrator.cli import emit

    rows = api.hosts_list(open_ctx())
    if as_json:
        emit.hosts(rows)
        return
    table = Table(box=None, header_style="bold")
    for col in ("HOST", "KIND", "TARGET", "PROFILE", "SLOTS", "LAST PROBE", "STATE"):
        table.add_column(col)
    now = time.time()
    for row in rows:
        cells = (row.name, row.kind, row.target or "-", row.profile or "-",
                 f"{row.slots_total} {row.slots_kind}".strip() if row.slots_total else "-",
                 _ago(row.last_probe_at, now), _state(row, now))
        table.add_row(*(escape(c) for c in cells))  # host text is never rich markup
    Console().print(table)


@hosts.command("show")
@click.argument("name", shell_complete=complete.hosts)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout (docs/schemas/host.schema.json).")
def show(name: str, as_json: bool) -> None:
    """Everything gpuq knows about host NAME."""
    from orchestrator import api
    from orchestrator.cli import emit

    ctx = open_ctx()
    detail = api.hosts_show(ctx, name)
    if as_json:
        emit.host(detail)
    else:
        from orchestrator.transfer.datasync import held

        _print_detail(detail, held(ctx.settings.home, name))


@hosts.command("rm")
@click.argument("name", shell_complete=complete.hosts)
@click.option("--force", is_flag=True, help="Forget it even though results there are not pulled yet, or it is a "
                                           "rented machine that may still bill.")
def rm(name: str, force: bool) -> None:
    """Forget host NAME (refused while jobs run there, results are unverified, or it is a rented machine
    not yet terminated: `gpuq down` ends those)."""
    from orchestrator import api

    api.hosts_rm(open_ctx(), name, force=force)
    echo(f"removed {name} (nothing on the machine was touched)")


@hosts.command("trust")
@click.argument("name", shell_complete=complete.hosts)
@click.option("--fingerprint", required=True, metavar="SHA256:...",
              help="The fingerprint you checked with the machine's provider or console.")
def trust(name: str, fingerprint: str) -> None:
    """Accept host NAME's new SSH key, only if it has the FINGERPRINT you checked out of band."""
    from orchestrator import api

    accepted = api.hosts_trust(open_ctx(), name, fingerprint)
    echo(f"{name}: host key replaced; now trusting {accepted}")


@hosts.command("release")
@click.argument("name")
def release(name: str) -> None:
    """Lift the setup holds of host NAME: jobs of a project whose setup failed there may go back to it,
    and the next one runs the setup again (after a transient failure, e.g. a package index outage)."""
    from orchestrator import api

    released = api.hosts_release(open_ctx(), name)
    echo(f"{name}: released the setup hold of bundle {', '.join(released)}" if released
               else f"{name}: no setup hold to release")


@hosts.command("stop-agent")
@click.argument("name", shell_complete=complete.hosts)
@click.option("--force", is_flag=True,
              help="Stop it even with work: running jobs keep running and the next agent adopts them.")
def stop_agent(name: str, force: bool) -> None:
    """Stop the agent of host NAME (or `local`) now, instead of after its 10 idle minutes.  Refused while
    it has running or waiting jobs, unless --force."""
    from orchestrator import api
    from orchestrator.core.errors import GpuqError, UsageError

    ctx = open_ctx()
    done = api.hosts_stop_agent(ctx, name, force=force)
    known = {j.id: j.name for j in ctx.ledger.jobs()}
    names = [known.get(j, j) for j in done.running]
    jobs = f"{len(names)} running jobs ({', '.join(names[:5])})" if names else ""
    queued = f"{done.queued} waiting jobs" if done.queued else ""
    work = " and ".join(p for p in (jobs, queued) if p)
    if done.outcome == "none":
        echo(f"{name}: no agent running; nothing to stop")
    elif done.outcome == "busy":
        raise UsageError(f"{name}: agent {done.pid} has {work}; not stopped (--force stops it anyway: running "
                         "jobs keep running and the next agent adopts them)")
    elif done.outcome == "timeout":
        raise GpuqError(f"{name}: agent {done.pid} was asked to stop and still runs after 15 s")
    else:
        echo(f"{name}: agent {done.pid} stopped" + (f" (forced: {work}; running jobs keep running, the next agent "
                                                     "adopts them)" if work else ""))


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    secs = max(0, int(now - ts))
    return f"{secs}s ago" if secs < 120 else f"{secs // 60}m ago" if secs < 7200 else f"{secs // 3600}h ago"


def _state(row: HostRow, now: float) -> str:
    from orchestrator.api import hosts as api_hosts
    from orchestrator.core.states import LEASE_REVIVABLE, LeaseState
    from orchestrator.views import lease_text
    from orchestrator.views.hosts import disk_bills

    if row.provider and row.lease is LeaseState.PROVISIONING:  # rented, not up yet: never probed, and it may bill
        return "PROVISIONING" + lease_text(row, now).removeprefix("provisioning")
    if row.provider and row.lease in LEASE_REVIVABLE:  # gone from the jobs' view, maybe not the bill's
        return row.lease.value.upper() + disk_bills(row)
    if api_hosts.unregistered(row):
        return api_hosts.UNREGISTERED_LOCAL
    if row.unreachable_since is not None:
        return f"unreachable since {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(row.unreachable_since))}"
    return "ok" if row.last_probe_at else "not probed yet"


def _print_detail(d: HostDetail, data: list[dict[str, Any]] | None = None) -> None:
    row = d.row
    now = time.time()
    lines = [
        f"host        {row.name} ({row.kind}, profile {row.profile or '-'})",
        f"target      {row.target or '-'}" + (f" port {row.port}" if row.port else ""),
        f"root        {row.root}",
        f"python      {row.python or '-'}",
        f"host key    {d.fingerprint or '-'}",
        f"slots       {row.slots_total} {row.slots_kind}" + ("  (training on CPU: rehearsal)"
                                                           if row.train_device == "cpu" else ""),
        f"state       {_state(row, now)}; last probe {_ago(row.last_probe_at, now)}",
        f"bundle      {row.agent_bundle[:12] or '-'}",
        f"jobs        {len(d.active)} unfinished, {len(d.unverified)} with unverified results",
        f"ran with    {d.ran_with.line() if d.ran_with is not None else '- (no attempt has said yet)'}",
    ]
    lines += [f"data        {h.get('name')}: {int(h.get('files') or 0)} file(s), "
              f"{int(h.get('bytes') or 0) / 1e6:.1f} MB (tree {str(h.get('tree'))[:12]}, [data] synced by gpuq)"
              for h in data or []]
    for line in lines:
        echo(line)
    for event in d.events:
        echo(f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(event.time))}  {event.new or ''} "
                   f"{event.message}")
