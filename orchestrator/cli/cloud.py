"""``gpuq up | down | resume``: rent GPU machines, give them back behind the teardown gate, and
continue preempted or lost jobs from their last checkpoints."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

from orchestrator.cli.ctx import echo, open_ctx
from orchestrator.core import exitcodes
from orchestrator.core.errors import GpuqError, UsageError
from orchestrator.views.text import duration, printable

if TYPE_CHECKING:
    from orchestrator.api import Context
    from orchestrator.api.orphans import Orphan
    from orchestrator.ledger import HostRow


@click.command()
@click.argument("hosts", nargs=-1)
@click.option("--sweep", metavar="SWEEP", help="Every rented host this sweep used.")
@click.option("--orphans", is_flag=True,
              help="Instances gpuq rented for this ledger that no live host holds (every configured provider).")
@click.option("--force", is_flag=True, help="Terminate even with running jobs or unverified results (they are lost).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def down(hosts: tuple[str, ...], sweep: str | None, orphans: bool, force: bool, yes: bool) -> None:
    """Terminate rented HOSTS (irreversible: their disks go too).  Refused while a job there runs
    or has results not yet pulled and verified, unless --force.  A host still PROVISIONING whose
    create never answered is found by the name gpuq gave it."""
    from orchestrator import api
    from orchestrator.api.cloud import NEVER_CREATED, TERMINATED

    ctx = open_ctx()
    if orphans:
        if hosts or sweep or force:
            raise UsageError("--orphans takes no HOSTS, --sweep or --force: it ends only instances no live host holds")
        _down_orphans(ctx, yes)
        return
    plan = api.down_plan(ctx, hosts, sweep=sweep, force=force)
    for name, why in plan.refused.items():
        echo(f"gpuq: not terminating {name}: {why}", err=True)
    if not plan.hosts:
        sys.exit(exitcodes.FAILED if plan.refused else exitcodes.OK)
    for row in plan.hosts:
        price = f"${row.price_per_hour:.2f}/h" if row.price_per_hour is not None else "an unknown price"
        what = row.instance_id or f"(no instance id yet: named {row.instance_name})"
        echo(f"{row.name}: {row.provider} {what} costs {price} while kept")
    echo(f"keeping them costs ${plan.hourly:.2f} per hour; terminating deletes their disks")
    _confirm(yes, f"terminate {len(plan.hosts)} host(s)?")
    outcomes = api.down(ctx, plan)
    for name, outcome in outcomes.items():
        echo(f"{name}: {outcome}")
    if plan.refused or any(o not in (TERMINATED, NEVER_CREATED) for o in outcomes.values()):
        sys.exit(exitcodes.FAILED)


def _confirm(yes: bool, question: str) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        echo("gpuq: terminating needs confirmation; re-run in a terminal or add --yes", err=True)
        sys.exit(exitcodes.USAGE)
    click.confirm(question, abort=True)


def _down_orphans(ctx: Context, yes: bool) -> None:
    from orchestrator import api

    scan = api.find_orphans(ctx)
    for provider, why in scan.skipped.items():
        echo(f"gpuq: {provider} not checked: {why}", err=True)
    for orphan in scan.older:
        echo(f"gpuq: {_orphan_line(orphan)}: {orphan.why}; it may be another ledger's, so gpuq leaves it: if it is "
             f"yours, terminate it in the {orphan.provider} console", err=True)
    if scan.others:
        echo(f"{scan.others} gpuq instance(s) of other ledgers left alone")
    left = _down_stuck(ctx, scan.stuck, yes) if scan.stuck else 0
    if not scan.orphans:
        echo("no orphaned instances")
        sys.exit(exitcodes.FAILED if scan.skipped or left else exitcodes.OK)
    for orphan in scan.orphans:
        echo(f"{_orphan_line(orphan)}: {orphan.why}")
    echo(f"keeping them costs ${scan.hourly:.2f} per hour; terminating deletes their disks")
    _confirm(yes, f"terminate {len(scan.orphans)} orphaned instance(s)?")
    outcomes = api.end_orphans(ctx, scan.orphans)
    for orphan in scan.orphans:
        echo(f"{orphan.provider} {orphan.instance.id}: {outcomes[orphan.instance.id]}")
    if left or scan.skipped or any(o != "terminated" for o in outcomes.values()):
        sys.exit(exitcodes.FAILED)


def _down_stuck(ctx: Context, rows: list[HostRow], yes: bool) -> int:
    """List the rows stuck provisioning and, confirmed, end each (api.end_stuck); how many are left."""
    from orchestrator import api

    for row in rows:
        what = row.instance_id or f"{printable(row.instance_name)} (no instance id: its create never answered)"
        since = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(row.lease_changed_at or row.created_at))
        echo(f"{row.name}: {row.provider} {what} still provisioning since {since}, past the readiness window: "
             "it may bill")
    _confirm(yes, f"end {len(rows)} machine(s) stuck provisioning?")
    left = 0
    for row in rows:
        try:
            echo(f"{row.name}: {api.end_stuck(ctx, row)}")
        except GpuqError as exc:
            echo(f"{row.name}: not ended: {exc}; `gpuq down {row.name}` tries again", err=True)
            left += 1
    return left


def _orphan_line(orphan: Orphan) -> str:
    inst = orphan.instance
    price = f"${inst.price_per_hour:.2f}/h" if inst.price_per_hour is not None else "price unknown"
    age = f"up {duration(inst.uptime_s)}" if inst.uptime_s is not None else "age unknown"
    return f"{orphan.provider} {inst.id} {printable(inst.name)} ({inst.raw_status}, {price}, {age})"


@click.command()
@click.option("--sweep", metavar="SWEEP", help="Only this sweep's jobs (default: every sweep).")
@click.option("--no-provision", is_flag=True, help="Never rent a replacement; use registered hosts only.")
def resume(sweep: str | None, no_provision: bool) -> None:
    """Continue every preempted or lost job from its newest verified checkpoint: the same spot pod
    re-bid when possible, else a replacement of the same shape, else any healthy host.  Running it
    twice never starts a job twice.  A sweep at its budget (`gpuq budget`) is not resumed."""
    from orchestrator import api

    result = api.resume(open_ctx(), sweep=sweep, provision=not no_provision)
    for host, how in result.revived.items():
        echo(f"{host}: {how}")
    for host, why in result.failed.items():
        echo(f"gpuq: {host} not brought back: {why}", err=True)
    for job_id in result.skipped:
        echo(f"gpuq: {job_id} not resumed (too many preemptions; see `gpuq status`)", err=True)
    for job_id, why in result.refused.items():
        echo(f"gpuq: {job_id} {why}", err=True)
    echo(f"resumed {len(result.requeued)} job(s)" if result.requeued else "nothing to resume")
    if result.failed:  # a host not brought back (and maybe a replacement still billing): scripts must see it
        raise SystemExit(1)
