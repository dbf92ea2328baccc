"""Flag values as numbers and durations: one line and exit 2 for anything else (``--max-price``, ``--retry-until``);
shared options (``--stop``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import click

from orchestrator.core.errors import UsageError

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def number(flag: str, text: str | None, *, most: float = 1e6) -> float | None:
    """A flag's positive number, or UsageError (one line, exit 2)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= most):
        raise UsageError(f"{flag} {text!r}: give a number more than 0 and at most {most:g}")
    return value


def seconds(flag: str, text: str | None) -> float | None:
    """``90s``, ``30m``, ``2h``, ``1h30m`` or plain seconds → seconds; UsageError otherwise."""
    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if text.strip().isdigit():
        value = float(text)
    elif match and any(match.groups()):
        h, m, s = (int(g or 0) for g in match.groups())
        value = float(h * 3600 + m * 60 + s)
    else:
        raise UsageError(f"{flag} {text!r}: give a duration such as 90s, 30m, 2h or 1h30m")
    if not 0 < value <= 7 * 86400:
        raise UsageError(f"{flag} {text!r}: give a duration more than 0 and at most a week")
    return value


def rerun_option() -> Callable[[Any], Any]:
    """``submit --rerun``: run every job, even one whose verified success the result cache holds."""
    return click.option(
        "--rerun",
        is_flag=True,
        help="Run every job, even one identical to a job that already "
        "succeeded with verified results (default: that one is recorded reused, not run).",
    )


def into_option() -> Callable[[Any], Any]:
    """``submit --into SWEEP``: the queue's new cells (and new seeds) join that sweep as its next part."""
    from orchestrator.cli import complete

    return click.option(
        "--into", metavar="SWEEP", shell_complete=complete.sweeps,
        help="Add the queue's new cells and seeds to this sweep (running or finished: same baseline, one report, "
        "one budget); a line identical to one of its jobs is not added, a changed line is a new cell.",
    )


def stop_option() -> Callable[[Any], Any]:
    """``submit --stop RULE``: the sweep's early stopping over the project's ``[stop]`` table (docs/stopping.md)."""
    return click.option(
        "--stop",
        type=click.Choice(["baseline", "halving", "off"]),
        default=None,
        metavar="RULE",
        help="Stop cells early: baseline (worse than the baseline at a rung, wrong stops <= alpha), halving "
        "(successive halving, no error bound) or off; default: gpuq.toml [stop], else off (docs/stopping.md).",
    )
