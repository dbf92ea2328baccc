"""Tables for people (rich): what ``gpuq submit`` did, and ``gpuq status --once``'s hosts, jobs and alerts.

``gpuq status --json`` (``orchestrator/cli/statusjson.py``) prints one object, schema ``gpuq.cli.status/1``,
a pydantic model (``orchestrator/cli/documents.py``) whose JSON Schema is generated into
``docs/schemas/status.schema.json``::

    {"schema", "generated_at",
     "hosts": [{"name", "kind", "reachable", "error", "unreachable_since", "last_probe_at", "probe_s",
                "agent_alive", "health", "health_detail", "hold_reason", "price_per_hour", "provider",
                "instance_id", "spot", "lease_state", "lease_reason",
                "slots": {"kind", "total", "free"}, "gpus": [...], "disk": {...}, "memory": {...}}],
     "sweeps": [{"id", "queue_path", "created_at", "jobs", "states": {STATE: count},
                 "budget": {"cap", "spent", "committed"}}],
     "jobs": [{"id", "sweep_id", "name", "task", "epochs", "gpus", "state", "host", "host_gpus",
               "attempt", "step", "total_steps", "epoch", "loss", "eta_s", "heartbeat_age_s", "cost",
               "exit_code", "message"}],
     "alerts": [{"time", "severity", "rule", "subject", "message", "action"}]}

The status view models (``orchestrator/views/``: ``JobView``, ``HostView``, ``AlertView``, ``SweepView``)
are shared by the table, the JSON document and the live dashboard (``orchestrator/cli/panels.py``): one
place derives what a job's progress, ETA, slots and cost are.  Results and pulls are
``orchestrator/cli/resulttables.py``.  Every cell is printable text, never rich markup.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.table import Table

from orchestrator.cli.ctx import warn
from orchestrator.views import AlertView, HostView, JobView, alert_views, host_views, job_views, sweep_views
from orchestrator.views.text import clock, duration, money, one_line, pct, printable, rough_duration

if TYPE_CHECKING:
    from orchestrator.api import Snapshot, SubmitResult

STATE_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "RUNNING": "cyan", "ASSIGNED": "blue",
               "QUEUED": "white", "LOST": "magenta", "PREEMPTED": "magenta", "CANCELLED": "yellow",
               "STOPPED": "cyan"}
SEVERITY_STYLE = {"escalate": "bold red", "warn": "yellow", "info": "dim"}


def escape(text: str) -> str:
    """``text`` as a table cell: printable (no terminal control sequence) and never rich markup."""
    return _markup_escape(printable(text))


def console() -> Console:
    # Not a terminal (a pipe, a CI log): do not squeeze tables to 80 columns and cut job ids.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def _makespan(result: SubmitResult) -> str:
    """The plan's makespan only when every estimate is est_min= or history; never the plan's guess."""
    if not result.makespan_known:
        return "makespan unknown (no est_min= and no history of these jobs)"
    scaled = result.makespan_scaled
    note = (f" ({scaled} of {len(result.placements)} estimates scaled from runs of another shape; `gpuq submit "
            "--dry-run` says which)") if scaled else ""
    return f"projected makespan {rough_duration(result.makespan_s)}{note}"


def submitted(result: SubmitResult) -> None:
    out = console()
    for warning in result.warnings:
        warn(warning)
    if result.dry_run:
        for note in result.joined:
            out.print(escape(note))
        out.print(f"dry run: {len(result.placements)} jobs valid; bundle {result.bundle.sha256[:12]} "
                  f"({result.bundle.files} files, {result.bundle.bytes} bytes); nothing was written")
        for job_id, host in result.placements.items():
            out.print(f"  {job_id} -> {escape(host)}")
        out.print(f"{_makespan(result)} (estimates: est_min=, else history)")
        return
    for note in result.joined:  # --into: what of the queue the sweep already has, and changed lines
        out.print(escape(note))
    if result.part == 0:
        out.print(f"sweep [bold]{result.sweep_id}[/]: nothing joined: every job of {escape(str(result.queue_path))} "
                  "is already in it")
        return
    joined = f"part {result.part} joined: " if result.part > 1 else ""
    out.print(f"sweep [bold]{result.sweep_id}[/]: {joined}{len(result.jobs)} jobs from "
              f"{escape(str(result.queue_path))} (bundle {result.bundle.sha256[:12]})")
    after: dict[str, list[str]] = {}
    for edge in result.edges:
        after.setdefault(edge.job, []).append(edge.needs)
    for job in result.jobs:
        epochs = f"{job.epochs}ep " if job.epochs else ""  # none given: none shown
        where = result.placements.get(job.id) or ("queued (budget)" if job.id in result.budget_held else
                                                  f"queued (after {','.join(after[job.name])})" if job.name in after
                                                  else "?")
        where = f"reused {job.reused_from} (not run)" if job.reused_from else where
        out.print(escape(f"  {job.id}  {job.name:<24} {job.task} {epochs}gpus={job.gpus} -> {where}"))
    hosts = sorted(set(result.placements.values()))
    if not result.placements and result.reused:
        waits = f"; {len(result.budget_held)} queued (budget)" if result.budget_held else ""
        out.print(f"nothing to start: {len(result.reused)} of {len(result.jobs)} jobs reused{waits}")
    elif result.pushed_to:
        out.print(f"bundle pushed to {escape(', '.join(result.pushed_to))} ({result.bundle.bytes / 1e6:.2f} MB each); "
                  f"{_makespan(result)}")
    else:
        out.print(f"bundle already on {escape(', '.join(hosts))}; {_makespan(result)}")
    if result.budget_usd is not None:
        held = result.budget_held
        line = f"budget ${result.budget_usd:,.2f}: {len(result.jobs) - len(held)} of {len(result.jobs)} jobs fit it"
        if held:
            line += f"; {len(held)} stay queued ({next(iter(held.values()))})"
        out.print(escape(line))
    if result.launch_error:
        out.print(f"[red]launch failed:[/] {escape(result.launch_error)}\n"
                  "the sweep is recorded; `gpuq status` retries the launch")


RICH_ROWS = 60  # more jobs than this (or than a terminal shows) are printed as a plain aligned table


def status_table(snap: Snapshot) -> None:
    """``gpuq status --once`` (and any non-terminal stdout): hosts, jobs, latest alerts, sweep counts.

    Jobs that fit on the screen get a rich table; more (``status --all`` on a long history) get a
    plain aligned table, written at once: the same columns, no boxes, no wrapping."""
    out = console()
    out.print(hosts_table(host_views(snap)))
    if not snap.hosts:  # a fresh $GPUQ_HOME: say what fills the table
        out.print(NO_HOSTS, markup=False)
    views = job_views(snap)
    room = out.size.height - 12 if sys.stdout.isatty() else RICH_ROWS
    if len(views) <= max(room, 10):
        out.print(jobs_table(snap, views))
    else:
        out.file.write(plain_jobs_table(views))
        out.file.flush()
    alerts = alert_views(snap)
    if alerts:
        out.print(alerts_table(alerts[:10]))
    listed = {j.sweep_id for j in snap.jobs}
    sweeps = sweep_views(snap)
    lined = sweeps[-5:]
    hidden = [s for s in sweeps if s.id not in listed and s not in lined]  # a sweep with a line is listed
    for sweep in lined:
        out.print(sweep.line, markup=False)
    if hidden:
        out.print(f"{len(hidden)} finished sweep(s) not listed; `gpuq status --all` or `--sweep ID` shows them")
    if not sweeps:
        out.print(NO_SWEEPS, markup=False)


NO_HOSTS = "no hosts yet: this machine (`local`) takes the first `gpuq submit`; `gpuq hosts add` adds SSH hosts"
NO_SWEEPS = "no sweeps yet; `gpuq submit QUEUE` (`gpuq submit --dry-run QUEUE` first shows the plan)"


JOB_COLUMNS = ("job", "sweep", "name", "state", "host:gpu", "try", "progress", "eta", "loss", "hb", "cost", "exit")


def job_cells(view: JobView) -> list[str]:
    """One job's row of the jobs table (JOB_COLUMNS), as plain text."""
    job, att = view.job, view.attempt
    percent = f" ({view.fraction:.0%})" if view.fraction is not None and view.progress != "-" else ""
    shown = view.progress + percent
    if view.progress == "-" and (view.note or view.fraction is not None):  # no heartbeat: the log's word
        pct = f"{view.fraction:.0%} " if view.fraction is not None else ""
        shown = (pct + view.note).strip() or "-"
    return [printable(cell) for cell in (
        job.id, job.sweep_id, job.name, job.state, view.where, str(job.attempt_count), shown,
        duration(view.eta_s), f"{att.loss:.4f}" if att is not None and att.loss is not None else "-",
        duration(view.heartbeat_age_s), money(view.cost),
        "-" if att is None or att.exit_code is None else str(att.exit_code),
    )]


def plain_jobs_table(views: Sequence[JobView]) -> str:
    """The jobs table as aligned text: a title line, a header, one line per job."""
    rows = [list(JOB_COLUMNS), *(job_cells(v) for v in views)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(JOB_COLUMNS))]
    lines = [f"jobs ({len(views)})"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"


def hosts_table(hosts: Sequence[HostView]) -> Table:
    table = Table(title="hosts", title_justify="left")
    for col in ("host", "state", "health", "slots", "gpus", "disk", "inodes", "memory", "price"):
        table.add_column(col)
    for host in hosts:
        row = host.row
        text, style = host.state
        health = " ".join(f"[{s}]{escape(t)}[/]" for t, s in host.flags) or escape(row.health or "-")
        gpu_cell = str(len(host.gpus))
        util = [g.util_pct for g in host.gpus if g.util_pct is not None]
        gpu_cell += f" ({sum(util) / len(util):.0f}% util)" if util else ""
        table.add_row(
            escape(row.name), f"[{style}]{escape(text)}[/]", health,  # host text is never rich markup
            escape(host.slots), gpu_cell, pct(host.disk_pct), pct(host.inodes_pct), pct(host.mem_pct),
            "-" if row.price_per_hour is None else f"${row.price_per_hour:.2f}/h",
        )
    return table


def jobs_table(snap: Snapshot, views: Sequence[JobView] | None = None) -> Table:
    table = Table(title="jobs", title_justify="left")
    for col in JOB_COLUMNS:
        table.add_column(col, no_wrap=col in ("job", "sweep", "state", "host:gpu"))
    for view in job_views(snap) if views is None else views:
        cells = [_markup_escape(cell) for cell in job_cells(view)]  # a log line in progress is never rich markup
        cells[3] = f"[{STATE_STYLE.get(cells[3], '')}]{cells[3]}[/]"
        table.add_row(*cells)
    return table


def alerts_table(alerts: list[AlertView]) -> Table:
    table = Table(title="alerts (newest first)", title_justify="left")
    for col in ("time", "level", "rule", "subject", "message", "action"):
        table.add_column(col, no_wrap=col in ("time", "level", "rule", "subject"))
    for alert in alerts:
        style = SEVERITY_STYLE.get(alert.severity, "")
        table.add_row(clock(alert.time), f"[{style}]{escape(alert.severity)}[/]", escape(alert.rule),
                      escape(alert.subject), escape(one_line(alert.message, 300)),
                      escape(one_line(alert.action, 200) or "-"))
    return table
