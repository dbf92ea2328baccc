"""``gpuq submit --wait``: one line per job state change while it waits, instead of a long silence.

``StateLines`` is given each tick's snapshot (``api.wait(seen=...)``) and prints, for every job whose
state differs from the last one it printed, ``12:04:05Z baseline-seed0 (c1a2b3c4) RUNNING on local``.
At the end ``summary`` is one line: the states counted and the command that shows the numbers (the
README's next command, ``gpuq results``, prints the tables, so they are not printed here too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.views.text import clock, printable

if TYPE_CHECKING:
    from orchestrator.api import Context, Snapshot


def wait(ctx: Context, sweep_id: str, *, as_json: bool) -> Snapshot:
    """``api.wait`` with a line per state change and the summary (on stderr under ``--json``: stdout is
    the document)."""
    import click

    from orchestrator import api

    def say(line: str) -> None:
        click.echo(line, err=as_json)

    snap = api.wait(ctx, sweep=sweep_id, seen=StateLines(say))
    say(summary(snap, sweep_id))
    return snap


class StateLines:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.states: dict[str, str] = {}

    def __call__(self, snap: Snapshot) -> None:
        for job in snap.jobs:
            if self.states.get(job.id) == job.state:
                continue
            self.states[job.id] = job.state
            where = f" on {printable(job.host)}" if job.host and job.state != "QUEUED" else ""
            self.say(f"{clock(time.time())} {printable(job.name)} ({job.id[:8]}) {job.state}{where}")


def summary(snap: Snapshot, sweep_id: str) -> str:
    counts: dict[str, int] = {}
    for job in snap.jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return (f"sweep {sweep_id} ended: {states}; `gpuq results --sweep {sweep_id}` shows the numbers, "
            f"`gpuq status --sweep {sweep_id}` the table")
