"""``gpuq hosts add|list|show|rm|trust``: the SSH hosts gpuq may use."""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

import click

from orchestrator.cli import complete

if TYPE_CHECKING:
    from orchestrator.api import Context, HostDetail
    from orchestrator.ledger import Host as HostRow


def _ctx() -> Context:
    from orchestrator import api

    try:
        return api.open_context()
    finally:
        gc.enable()  # main() turns it off for start-up


@click.group()
def hosts() -> None:
    """Register, list, inspect and forget SSH hosts."""


@hosts.command("add")
@click.argument("name")
@click.argument("target")
@click.option("--port", type=int, help="SSH port (default: from ~/.ssh/config, else 22).")
@click.option("--key", default="", metavar="FILE", help="Private key to log in with.")
@click.option("--profile", default="ssh", show_default=True, help="Platform profile (profiles/*.toml).")
@click.option("--root", default="", metavar="DIR", help="gpuq's data dir on the host (default: the profile's).")
@click.option("--python", default="", metavar="PATH", help="Interpreter on the host (default: the profile's).")
@click.option("--trust-new-host-key", is_flag=True,
              help="Trust an unknown host key on first use (check its fingerprint first).")
def add(name: str, target: str, port: int | None, key: str, profile: str, root: str, python: str,
        trust_new_host_key: bool) -> None:
    """Register host NAME reached at TARGET (user@address or an ~/.ssh/config alias)."""
    from orchestrator import api
    from orchestrator.fleet import key_fingerprint

    done = api.hosts_add(_ctx(), name, target, port=port, key=key, profile=profile, root=root, python=python,
                         trust_new_host_key=trust_new_host_key)
    facts = done.facts
    gpus = facts.get("gpus") or []
    kind = f"{len(gpus)} GPU ({gpus[0]['name']})" if gpus else f"{done.row.slots_total} CPU slots"
    click.echo(f"added {name}: {target} root={done.row.root} python={done.row.python} "
               f"(Python {'.'.join(map(str, facts.get('version', [])))}), {kind}, "
               f"{float(facts.get('free_bytes', 0)) / 1e9:.1f} GB free")
    if done.trusted_key:
        click.echo(f"trusted new host key {key_fingerprint(done.trusted_key)} (recorded in gpuq's known_hosts)")
    for warning in done.warnings:
        click.echo(f"warning: {warning}", err=True)


@hosts.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout (docs/schemas/hosts.schema.json).")
def list_(as_json: bool) -> None:
    """One line per host: reachability, slots, last probe."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from orchestrator import api
    from orchestrator.cli import emit

    rows = api.hosts_list(_ctx())
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

    detail = api.hosts_show(_ctx(), name)
    if as_json:
        emit.host(detail)
    else:
        _print_detail(detail)


@hosts.command("rm")
@click.argument("name", shell_complete=complete.hosts)
@click.option("--force", is_flag=True, help="Forget it even though results there are not pulled yet.")
def rm(name: str, force: bool) -> None:
    """Forget host NAME (refused while jobs run there or results are unverified)."""
    from orchestrator import api

    api.hosts_rm(_ctx(), name, force=force)
    click.echo(f"removed {name} (nothing on the machine was touched)")


@hosts.command("trust")
@click.argument("name", shell_complete=complete.hosts)
@click.option("--fingerprint", required=True, metavar="SHA256:...",
              help="The fingerprint you checked with the machine's provider or console.")
def trust(name: str, fingerprint: str) -> None:
    """Accept host NAME's new SSH key, only if it has the FINGERPRINT you checked out of band."""
    from orchestrator import api

    accepted = api.hosts_trust(_ctx(), name, fingerprint)
    click.echo(f"{name}: host key replaced; now trusting {accepted}")


@hosts.command("release")
@click.argument("name")
def release(name: str) -> None:
    """Lift the setup holds of host NAME: jobs of a project whose setup failed there may go back to it,
    and the next one runs the setup again (after a transient failure, e.g. a package index outage)."""
    from orchestrator import api

    released = api.hosts_release(_ctx(), name)
    click.echo(f"{name}: released the setup hold of bundle {', '.join(released)}" if released
               else f"{name}: no setup hold to release")


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    secs = max(0, int(now - ts))
    return f"{secs}s ago" if secs < 120 else f"{secs // 60}m ago" if secs < 7200 else f"{secs // 3600}h ago"


def _state(row: HostRow, now: float) -> str:
    if row.unreachable_since is not None:
        return f"unreachable since {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(row.unreachable_since))}"
    return "ok" if row.last_probe_at else "not probed yet"


def _print_detail(d: HostDetail) -> None:
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
    ]
    for line in lines:
        click.echo(line)
    for event in d.events:
        click.echo(f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(event.time))}  {event.new or ''} "
                   f"{event.message}")
