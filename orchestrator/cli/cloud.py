"""``gpuq up | down | resume``: rent GPU machines, give them back behind the teardown gate, and
continue preempted or lost jobs from their last checkpoints."""

from __future__ import annotations

import sys

import click

from orchestrator import exitcodes
from orchestrator.cli.ctx import echo, open_ctx


@click.command()
@click.option("--provider", required=True, type=click.Choice(["runpod", "lambda"]), help="Who rents the machines.")
@click.option("--gpu", "gpu_type", required=True, metavar="TYPE",
              help='RunPod GPU type id ("NVIDIA A100 80GB PCIe") or Lambda instance type ("gpu_1x_a100").')
@click.option("--count", type=int, default=1, show_default=True, help="How many machines.")
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs per machine (RunPod).")
@click.option("--spot", is_flag=True, help="Interruptible (RunPod): cheaper, preempted when outbid.")
@click.option("--bid", type=float, metavar="USD", help="Spot bid per GPU-hour (default: the current minimum).")
@click.option("--region", metavar="R", help="RunPod data centre or Lambda region.")
@click.option("--key", default="", metavar="FILE", help="Private SSH key (its .pub is registered with the machines).")
@click.option("--profile", default="", help="Platform profile (default: the provider's).")
@click.option("--prefix", default="", help="Host name prefix (default: the provider's name).")
def up(provider: str, gpu_type: str, count: int, gpus: int, spot: bool, bid: float | None, region: str | None,
       key: str, profile: str, prefix: str) -> None:
    """Rent machines, wait until each answers SSH, register them with their price and preflight them.

    The API key comes from the environment (RUNPOD_API_KEY / LAMBDA_API_KEY) or $GPUQ_HOME/keys.toml
    (mode 0600), never from the command line.
    """
    from orchestrator import api

    result = api.up(open_ctx(), provider=provider, gpu_type=gpu_type, count=count, gpus=gpus, spot=spot, bid=bid,
                    region=region, key=key, profile=profile, prefix=prefix)
    for row in result.hosts:
        price = f"${row.price_per_hour:.2f}/h" if row.price_per_hour is not None else "price unknown"
        verdict = result.verdicts.get(row.name)
        health = verdict.verdict.upper() if verdict else "not checked"
        echo(f"{row.name}: {row.provider} {row.instance_id} {row.gpu_count}x {row.gpu_type}"
                   f"{' spot' if row.spot else ''} at {row.target}:{row.port}  {price}  preflight {health}")
        if verdict and verdict.verdict != "pass":
            echo(f"  {verdict.detail}")
    for instance_id, why in result.failed.items():
        echo(f"gpuq: {provider} {instance_id} is not usable: {why}", err=True)
        echo(f"  it may still bill: terminate it in the {provider} console", err=True)
    if result.failed or not result.hosts:
        sys.exit(exitcodes.FAILED)


@click.command()
@click.argument("hosts", nargs=-1)
@click.option("--sweep", metavar="SWEEP", help="Every rented host this sweep used.")
@click.option("--force", is_flag=True, help="Terminate even with running jobs or unverified results (they are lost).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def down(hosts: tuple[str, ...], sweep: str | None, force: bool, yes: bool) -> None:
    """Terminate rented HOSTS (irreversible: their disks go too).  Refused while a job there runs
    or has results not yet pulled and verified, unless --force."""
    from orchestrator import api

    ctx = open_ctx()
    plan = api.down_plan(ctx, hosts, sweep=sweep, force=force)
    for name, why in plan.refused.items():
        echo(f"gpuq: not terminating {name}: {why}", err=True)
    if not plan.hosts:
        sys.exit(exitcodes.FAILED if plan.refused else exitcodes.OK)
    for row in plan.hosts:
        price = f"${row.price_per_hour:.2f}/h" if row.price_per_hour is not None else "an unknown price"
        echo(f"{row.name}: {row.provider} {row.instance_id} costs {price} while kept")
    echo(f"keeping them costs ${plan.hourly:.2f} per hour; terminating deletes their disks")
    if not yes:
        if not sys.stdin.isatty():
            echo("gpuq: terminating needs confirmation; re-run in a terminal or add --yes", err=True)
            sys.exit(exitcodes.USAGE)
        click.confirm(f"terminate {len(plan.hosts)} host(s)?", abort=True)
    outcomes = api.down(ctx, plan)
    for name, outcome in outcomes.items():
        echo(f"{name}: {outcome}")
    if plan.refused or any(o != "terminated" for o in outcomes.values()):
        sys.exit(exitcodes.FAILED)


@click.command()
@click.option("--sweep", metavar="SWEEP", help="Only this sweep's jobs (default: every sweep).")
@click.option("--no-provision", is_flag=True, help="Never rent a replacement; use registered hosts only.")
def resume(sweep: str | None, no_provision: bool) -> None:
    """Continue every preempted or lost job from its newest verified checkpoint: the same spot pod
    re-bid when possible, else a replacement of the same shape, else any healthy host.  Running it
    twice never starts a job twice."""
    from orchestrator import api

    result = api.resume(open_ctx(), sweep=sweep, provision=not no_provision)
    for host, how in result.revived.items():
        echo(f"{host}: {how}")
    for host, why in result.failed.items():
        echo(f"gpuq: {host} not brought back: {why}", err=True)
    for job_id in result.skipped:
        echo(f"gpuq: {job_id} not resumed (too many preemptions; see `gpuq status`)", err=True)
    echo(f"resumed {len(result.requeued)} job(s)" if result.requeued else "nothing to resume")
