"""``gpuq up``: rent machines by provider and GPU type, or ``--for QUEUE`` what a queue needs; what each one became."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from orchestrator.cli.ctx import echo, open_ctx
from orchestrator.cli.flags import number, seconds
from orchestrator.core import exitcodes
from orchestrator.core.errors import UsageError
from orchestrator.money.selfstop import can_stop_itself

if TYPE_CHECKING:
    from orchestrator.api import UpResult


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
        up_for(for_queue, max_price=max_price, retry_until=retry_until, spot=spot, dry_run=dry_run,
               provider=provider, key=key, profile=profile, prefix=prefix, down_when_done=down_when_done)
        return
    if retry_until is not None or dry_run:
        raise UsageError("--retry-until and --dry-run go with --for QUEUE")
    if provider is None or gpu_type is None:
        raise UsageError("give --provider and --gpu TYPE (`gpuq offers` lists them), or --for QUEUE --max-price USD")

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
    cannot = sorted({row.provider for row in result.hosts if not can_stop_itself(row.provider)})
    for provider in cannot:  # docs/providers.md, "When no gpuq command runs: the host stops itself"
        told = any(r.name in result.noticed for r in result.hosts if r.provider == provider)
        notice = ("; with no gpuq command for lease_timeout_min each POSTs a notice to your webhook_url" if told
                  else "; set webhook_url in your config.toml to be told when one sits idle")
        echo(f"gpuq: {provider} machines cannot stop their own billing: while no gpuq command runs they bill until "
             f"`gpuq down` (run `gpuq watch` on a machine that stays on){notice}", err=True)
    for line in result.problems():
        echo(f"gpuq: {line}", err=True)
    if result.hosts and not result.ok:
        echo(f"gpuq: rented and registered: {', '.join(r.name for r in result.hosts)} (they bill; `gpuq down "
             f"{' '.join(r.name for r in result.hosts)}` ends them)", err=True)


def up_for(queue: str, *, max_price: str | None, retry_until: str | None, spot: bool, dry_run: bool,
           provider: str | None, key: str, profile: str, prefix: str, down_when_done: bool | None) -> None:
    """``gpuq up --for QUEUE``: plan, wait for offers when told to, then rent through ``gpuq up``."""
    from pathlib import Path

    from orchestrator.api import renting_for

    cap = number("--max-price", max_price)
    if cap is None:
        raise UsageError("--for needs --max-price USD (the most one machine may cost per hour)")
    ctx = open_ctx()
    plan = renting_for.plan_for(ctx, Path(queue), max_price=cap, spot=spot, providers=(provider,) if provider else (),
                                retry_until_s=seconds("--retry-until", retry_until),
                                say=lambda line: echo(line, err=True))
    for name, why in plan.scan.skipped.items():
        echo(f"gpuq: {name} skipped: {why}", err=True)
    for name, why in plan.scan.failed.items():
        echo(f"gpuq: {name} failed: {why}", err=True)
    for line in plan.lines():
        echo(line)
    if not plan.plan.complete:
        waited = f" after {plan.polls} polls over {plan.waited_s:.0f} s" if retry_until else ""
        echo(f"gpuq: nothing rented{waited}: {plan.missing()}", err=True)
        sys.exit(exitcodes.FAILED)
    if dry_run:
        echo("dry run: nothing rented")
        return
    result = renting_for.up_for(ctx, plan, key=key, profile=profile, prefix=prefix, down_when_done=down_when_done,
                                say=lambda line: echo(line, err=True))
    for rental in result.rentals:
        up_report(rental)
    for need, why in result.failed.items():
        echo(f"gpuq: {need} not rented: {why}", err=True)
    if not result.ok:
        sys.exit(exitcodes.FAILED)
