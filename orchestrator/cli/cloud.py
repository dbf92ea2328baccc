"""``gpuq up | down | resume``: rent GPU machines, give them back behind the teardown gate, and
continue preempted or lost jobs from their last checkpoints."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from orchestrator import exitcodes
from orchestrator.cli.ctx import echo, open_ctx
from orchestrator.errors import UsageError
from orchestrator.views.text import duration, printable

if TYPE_CHECKING:
    from orchestrator.api import Context, UpResult
    from orchestrator.api.orphans import Orphan


class ProviderChoice(click.Choice[str]):
    """The providers of the registry (orchestrator/providers/registry.py), read when the option is parsed or
    its help is shown: one a plugin added is a choice too."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        from orchestrator.providers import registry

        return registry.names()

    @choices.setter
    def choices(self, value: object) -> None:
        pass


@click.command()
@click.option("--provider", type=ProviderChoice(), help="Who rents the machines (with --for: only this one).")
@click.option("--gpu", "gpu_type", metavar="TYPE",
              help='RunPod GPU type id ("NVIDIA A100 80GB PCIe"), Lambda instance type ("gpu_1x_a100") or vast.ai '
                   'GPU name ("RTX 4090"); `gpuq offers` lists them.')
@click.option("--for", "for_queue", metavar="QUEUE",
              help="Rent what this queue's lines need (their gpus=, gpu=, gpu_mem=) from the cheapest offers of "
                   "the configured providers, one machine per distinct need; needs --max-price.")
@click.option("--max-price", "max_price", metavar="USD",
              help="The most one machine may cost per hour (spot: its current minimum bid); dearer: nothing rented.")
@click.option("--retry-until", "retry_until", metavar="DURATION",
              help="With --for: while offers are short, poll again (backoff) until this long has passed "
                   "(90s, 30m, 2h).")
@click.option("--dry-run", is_flag=True, help="With --for: show the plan and its hourly total; rent nothing.")
@click.option("--count", type=int, default=1, show_default=True, help="How many machines.")
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs per machine (RunPod).")
@click.option("--spot", is_flag=True, help="Interruptible (vast.ai; RunPod and Lambda have none): cheaper, preempted "
                                           "when outbid.")
@click.option("--bid", type=float, metavar="USD",
              help="The most to pay per GPU-hour for spot (default: just over the current minimum; re-bid with it "
                   "on resume).")
@click.option("--region", metavar="R", help="RunPod data centre or Lambda region.")
@click.option("--key", default="", metavar="FILE", help="Private SSH key (its .pub is registered with the machines).")
@click.option("--profile", default="", help="Platform profile (default: the provider's).")
@click.option("--prefix", default="", help="Host name prefix (default: the provider's name).")
@click.option("--down-when-done/--keep-when-done", "down_when_done", default=None,
              help="Terminate each machine once no work is left for it and every result from it is home and "
                   "verified (the tick does it; default: the auto_down setting).")
def up(provider: str | None, gpu_type: str | None, for_queue: str | None, max_price: str | None,
       retry_until: str | None, dry_run: bool, count: int, gpus: int, spot: bool, bid: float | None,
       region: str | None, key: str, profile: str, prefix: str, down_when_done: bool | None) -> None:
    """Rent machines, wait until each answers SSH, register them with their price and preflight them.

    Each machine is in the ledger (`gpuq hosts list`: PROVISIONING) before its create call; one that
    never becomes usable, and any not yet registered when this is interrupted, is terminated.
    The API key comes from the environment (RUNPOD_API_KEY / LAMBDA_API_KEY / VAST_API_KEY) or
    $GPUQ_HOME/keys.toml (mode 0600), never from the command line.  --for QUEUE --max-price USD rents
    what a queue needs instead of --gpu (docs/providers.md, "Renting for a queue").
    """
    from orchestrator import api

    if for_queue is not None:
        given = [flag for flag, on in (("--gpu", gpu_type), ("--count", count != 1), ("--gpus", gpus != 1),
                                       ("--bid", bid is not None), ("--region", region)) if on]
        if given:
            raise UsageError(f"--for QUEUE works out the machines itself: drop {', '.join(given)}")
        from orchestrator.cli.offers import up_for

        up_for(for_queue, max_price=max_price, retry_until=retry_until, spot=spot, dry_run=dry_run,
               provider=provider, key=key, profile=profile, prefix=prefix, down_when_done=down_when_done)
        return
    if retry_until is not None or dry_run:
        raise UsageError("--retry-until and --dry-run go with --for QUEUE")
    if provider is None or gpu_type is None:
        raise UsageError("give --provider and --gpu TYPE (`gpuq offers` lists them), or --for QUEUE --max-price USD")

    from orchestrator.cli.offers import number

    try:
        result = api.up(open_ctx(), provider=provider, gpu_type=gpu_type, count=count, gpus=gpus, spot=spot,
                        bid=bid, region=region, key=key, profile=profile, prefix=prefix,
                        down_when_done=down_when_done, say=lambda line: echo(line, err=True),
                        max_price=number("--max-price", max_price))
    except api.UpInterrupted as stopped:
        up_report(stopped.result)
        raise
    up_report(result)
    if not result.ok:
        sys.exit(exitcodes.FAILED)


def up_report(result: UpResult) -> None:
    for old, new in result.replaced.items():
        echo(f"{old}: failed its GPU preflight; gpuq terminated it and rented {new} in its place")
    for row in result.hosts:
        price = f"${row.price_per_hour:.2f}/h" if row.price_per_hour is not None else "price unknown"
        verdict = result.verdicts.get(row.name)
        health = verdict.verdict.upper() if verdict else "not checked"
        echo(f"{row.name}: {row.provider} {row.instance_id} {row.gpu_count}x {row.gpu_type}"
                   f"{' spot' if row.spot else ''} at {row.target}:{row.port}  {price}  preflight {health}")
        if verdict and verdict.verdict != "pass":
            echo(f"  {verdict.detail}")
    for line in result.problems():
        echo(f"gpuq: {line}", err=True)
    if result.hosts and not result.ok:
        echo(f"gpuq: rented and registered: {', '.join(r.name for r in result.hosts)} (they bill; `gpuq down "
             f"{' '.join(r.name for r in result.hosts)}` ends them)", err=True)


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
    if not scan.orphans:
        echo("no orphaned instances")
        sys.exit(exitcodes.FAILED if scan.skipped else exitcodes.OK)
    for orphan in scan.orphans:
        echo(f"{_orphan_line(orphan)}: {orphan.why}")
    echo(f"keeping them costs ${scan.hourly:.2f} per hour; terminating deletes their disks")
    _confirm(yes, f"terminate {len(scan.orphans)} orphaned instance(s)?")
    outcomes = api.end_orphans(ctx, scan.orphans)
    for orphan in scan.orphans:
        echo(f"{orphan.provider} {orphan.instance.id}: {outcomes[orphan.instance.id]}")
    if scan.skipped or any(o != "terminated" for o in outcomes.values()):
        sys.exit(exitcodes.FAILED)


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
