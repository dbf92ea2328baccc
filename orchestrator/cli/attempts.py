"""A job's attempts: ``gpuq logs JOB`` (the latest attempt's log, ``--attempt N`` another's,
``--attempts`` the list of them) and ``gpuq explain JOB`` (each attempt's class, evidence, fix and
saved stacks); docs/cli.md, docs/health.md."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import click

from orchestrator.cli import complete
from orchestrator.cli.ctx import echo, open_ctx

if TYPE_CHECKING:
    from orchestrator.api.explaining import AttemptStory

REASON_WIDTH = 100


def _when(ts: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%SZ", time.gmtime(ts)) if ts is not None else "-"


def _state(story: AttemptStory) -> str:
    return f"{story.state}/{story.klass}" if story.klass else story.state


def print_attempts(stories: Sequence[AttemptStory]) -> None:
    """One line per attempt: number, host, start, end, state/class, exit, why it ended."""
    from orchestrator.views.text import one_line

    header = ("attempt", "host", "started", "ended", "state/class", "exit", "reason")
    rows = [(str(s.number), one_line(s.host), _when(s.started_at), _when(s.ended_at), _state(s),
             "-" if s.exit_code is None else str(s.exit_code), one_line(s.reason, REASON_WIDTH) or "-")
            for s in stories]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        echo("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]))


def _explained(job_id: str, story: AttemptStory, show_stacks: bool) -> list[str]:
    from orchestrator.views.text import one_line

    exit_ = f", exit {story.exit_code}" if story.exit_code is not None else ""
    klass = f", class {story.klass}" if story.klass else ""
    lines = [f"attempt {story.number} on {story.host}: {story.state}{exit_}{klass}",
             f"  started {_when(story.started_at)}, ended {_when(story.ended_at)}"]
    if story.message:
        lines.append(f"  ended: {one_line(story.message)}")
    if story.evidence:
        lines.append("  evidence:")
        for found in story.evidence:
            action = f"  ({one_line(found.action)})" if found.action else ""
            lines.append(f"    [{found.severity} {found.rule}] {one_line(found.message)}{action}")
    if story.decision:
        lines.append(f"  decision: {one_line(story.decision)}")
    if story.hint:
        lines.append(f"  hint: {story.hint}")
    if story.stacks:
        more = "" if show_stacks else f" (`gpuq explain {job_id} --attempt {story.number} --stacks` prints them)"
        lines.append(f"  stacks: {story.stacks}{more}")
        if show_stacks:
            lines += [f"    {line}" for line in story.stacks_text.splitlines()]
    elif story.stacks_note:
        lines.append(f"  stacks: {one_line(story.stacks_note)}")
    where = f" (a copy at home: {story.log_home})" if story.log_home else ""
    lines.append(f"  log: gpuq logs {job_id} --attempt {story.number}{where}")
    return lines


@click.command()
@click.argument("job", shell_complete=complete.jobs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--raw", is_flag=True,
              help="Print the log as the host wrote it, terminal control sequences included "
                   "(default: colours and cursor moves dropped, other controls shown escaped, e.g. \\x1b).")
@click.option("--attempt", "attempt", type=click.IntRange(min=1), metavar="N",
              help="Attempt N's log (from its copy at home when it was brought home, else its host).")
@click.option("--attempts", "list_attempts", is_flag=True,
              help="List the attempts instead: host, start, end, state/class, exit and why each ended.")
def logs(job: str, follow: bool, raw: bool, attempt: int | None, list_attempts: bool) -> None:
    """Print the log of JOB's latest attempt (a name, id, prefix >= 4, or SWEEP:NAME).

    A bare name means that job of the newest sweep that has one.  Colours, cursor moves and erases are
    dropped and of a line rewritten with carriage returns (a progress bar) its last state is kept; any
    other control character is shown escaped (\\x1b), so nothing in a log acts on the terminal; --raw
    prints the bytes as written.
    Forwarded secret values are redacted ([redacted:NAME]), with --raw too.
    `gpuq explain JOB` says why each attempt ended."""
    from orchestrator import api
    from orchestrator.views.text import readable_log

    if list_attempts and (attempt is not None or follow or raw):
        raise click.UsageError("--attempts lists the attempts: give it without --attempt, --follow or --raw")
    ctx = open_ctx()
    found = ctx.ledger.resolve_job_ref(job)
    if found.note:
        click.echo(f"gpuq: {found.note}", err=True)
    if list_attempts:
        from orchestrator.api.explaining import stories

        told = stories(ctx, found.job)
        if not told:
            click.echo(f"job {found.job.id} ({found.job.name}) has not started yet: no attempt", err=True)
            return
        print_attempts(told)
        return
    chunks = api.logs(ctx, found.job, follow=follow, attempt=attempt)
    if raw:  # color=True: click would strip some escape sequences on a pipe; --raw means every byte as written
        for chunk in chunks:
            click.echo(chunk, nl=False, color=True)
        return
    for text in whole_lines(chunks):
        click.echo(readable_log(text), nl=False)


def whole_lines(chunks: Iterator[str], limit: int = 1 << 16) -> Iterator[str]:
    """The chunks re-cut at line ends, so a carriage return or an escape sequence split across two reads
    is read whole (a line longer than ``limit`` goes out as it is); what is left at the end goes out last."""
    pending = ""
    for chunk in chunks:
        pending += chunk
        cut = pending.rfind("\n") + 1
        if cut == 0 and len(pending) > limit:
            cut = len(pending)
        if cut:
            yield pending[:cut]
            pending = pending[cut:]
    if pending:
        yield pending


@click.command()
@click.argument("job", shell_complete=complete.jobs)
@click.option("--attempt", "number", type=click.IntRange(min=1), metavar="N", help="Only attempt N.")
@click.option("--stacks", "show_stacks", is_flag=True,
              help="Print the saved stacks (where each process waited before a stall kill), not just their path.")
def explain(job: str, number: int | None, show_stacks: bool) -> None:
    """Why each attempt of JOB ended as it did (a name, id, prefix >= 4, or SWEEP:NAME).

    For each attempt: its failure class, the evidence the patrol recorded (crash lines, findings, the
    exit), what gpuq did about it, the fix for its class, and the stacks saved before a stall kill
    (their path; --stacks prints them).  Host text is redacted and shown without control characters."""
    from orchestrator.api import explaining
    from orchestrator.core.states import JobState

    ctx = open_ctx()
    found = ctx.ledger.resolve_job_ref(job)
    if found.note:
        click.echo(f"gpuq: {found.note}", err=True)
    row = found.job
    if number is not None:
        explaining.attempt_or_error(ctx, row, number)
    told = [s for s in explaining.explain(ctx, row, stacks=show_stacks) if number is None or s.number == number]
    count = f"{row.attempt_count} attempt{'s' if row.attempt_count != 1 else ''}"
    echo(f"job {row.name} ({row.id}) of sweep {row.sweep_id}: {row.state}, {count}")
    for line in explaining.waits_of(ctx, row):  # after=, and why a job that never started ended
        echo(line)
    why = explaining.stopped(ctx, row)
    if why:
        echo(why)
    if not told and not JobState(row.state).terminal:
        echo("it has not started yet: nothing to explain")
    for story in told:
        for line in _explained(row.id, story, show_stacks):
            echo(line)
