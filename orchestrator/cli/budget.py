"""``gpuq budget SWEEP [USD]``: a sweep's spending cap, what it spent and commits, or a new cap
(docs/cost.md)."""

from __future__ import annotations

import math

import click

from orchestrator.cli import complete
from orchestrator.cli.ctx import echo, open_ctx

NO_CAP = ("none", "off")


def _usd(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | str | None:
    """A positive number of dollars ("$12.50" too), or "none" (remove the cap); None when not given."""
    if value is None or value.lower() in NO_CAP:
        return value.lower() if value is not None else None
    try:
        dollars = float(value.lstrip("$").replace(",", ""))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number of dollars (or 'none' to remove the cap)") from None
    if not math.isfinite(dollars) or not 0 < dollars <= 1e9:
        raise click.BadParameter(f"{value!r}: a budget is above $0 and at most $1e9 (or 'none' to remove the cap)")
    return dollars


@click.command()
@click.argument("sweep", shell_complete=complete.sweeps)
@click.argument("usd", required=False, metavar="[USD|none]", callback=_usd)
def budget(sweep: str, usd: float | str | None) -> None:
    """Show or set SWEEP's spending cap.

    Shows the cap, what its attempts spent, what its placed and running attempts commit to their
    estimates, and what its jobs not started yet may cost.  With USD: set, raise or lower the cap
    ("none" removes it).  A cap below what is spent and committed stops the sweep's dispatch (running
    jobs finish); a higher one lets its queued jobs start at the next tick."""
    from orchestrator.api import budgeting

    ctx = open_ctx()
    if usd is None:
        view = budgeting.show(ctx, sweep)
    else:
        view = budgeting.set_cap(ctx, sweep, usd if isinstance(usd, float) else None)
    for line in view.lines():
        echo(line)
