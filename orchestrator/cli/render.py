"""Rendering of api results for people (rich tables) and scripts (JSON, CSV).

``gpuq status --json`` prints one object, schema ``gpuq.cli.status/1``, a pydantic model
(``orchestrator/cli/documents.py``) whose JSON Schema is generated into ``docs/schemas/status.schema.json``::

    {"schema", "generated_at",
     "hosts": [{"name", "kind", "reachable", "error", "unreachable_since", "last_probe_at", "probe_s",
                "agent_alive", "health", "health_detail", "hold_reason", "price_per_hour", "provider",
                "instance_id", "spot", "lease_state", "lease_reason",
                "slots": {"kind", "total", "free"}, "gpus": [...], "disk": {...}, "memory": {...}}],
     "sweeps": [{"id", "queue_path", "created_at", "jobs", "states": {STATE: count}}],
     "jobs": [{"id", "sweep_id", "name", "task", "epochs", "gpus", "state", "host", "host_gpus",
               "attempt", "step", "total_steps", "epoch", "loss", "eta_s", "heartbeat_age_s", "cost",
               "exit_code", "message"}],
     "alerts": [{"time", "severity", "rule", "subject", "message", "action"}]}

The status view model (``job_views``, ``host_state``, ``alert_views``) is shared by the table, the
JSON document and the live dashboard (``orchestrator/cli/dashboard.py``): one place derives what a
job's progress, ETA, slots and cost are.
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator import observed
from orchestrator.cli.dryrun import duration as rough_duration
from orchestrator.host_documents import Disk, JobEntry, StatusDocument
from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.api import PullReport, ResultRow, Snapshot, SubmitResult
    from orchestrator.cli import documents
    from orchestrator.ledger import Attempt, HostRow, Job
    from orchestrator.tick.probe import Probe

STATUS_SCHEMA = "gpuq.cli.status/1"
STATE_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "RUNNING": "cyan", "ASSIGNED": "blue",
               "QUEUED": "white", "LOST": "magenta", "PREEMPTED": "magenta", "CANCELLED": "yellow"}
SEVERITY_STYLE = {"escalate": "bold red", "warn": "yellow", "info": "dim"}
HEALTH_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def _console() -> Console:
    # Not a terminal (a pipe, a CI log): do not squeeze tables to 80 columns and cut job ids.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def submitted(result: SubmitResult) -> None:
    out = _console()
    for warning in result.warnings:
        out.print(f"[yellow]warning:[/] {escape(warning)}")
    if result.dry_run:
        out.print(f"dry run: {len(result.placements)} jobs valid; bundle {result.bundle.sha256[:12]} "
                  f"({result.bundle.files} files, {result.bundle.bytes} bytes); nothing was written")
        for job_id, host in result.placements.items():
            out.print(f"  {job_id} -> {escape(host)}")
        out.print(f"projected makespan {rough_duration(result.makespan_s)} (estimates: est_min=, else history)")
        return
    out.print(f"sweep [bold]{result.sweep_id}[/]: {len(result.jobs)} jobs from {escape(str(result.queue_path))} "
              f"(bundle {result.bundle.sha256[:12]})")
    for job in result.jobs:
        out.print(escape(f"  {job.id}  {job.name:<24} {job.task} {job.epochs}ep gpus={job.gpus} -> "
                         f"{result.placements.get(job.id, '?')}"))
    hosts = sorted(set(result.placements.values()))
    if result.pushed_to:
        out.print(f"bundle pushed to {escape(', '.join(result.pushed_to))} ({result.bundle.bytes / 1e6:.2f} MB each); "
                  f"projected makespan {rough_duration(result.makespan_s)}")
    else:
        out.print(f"bundle already on {escape(', '.join(hosts))}; "
                  f"projected makespan {rough_duration(result.makespan_s)}")
    if result.launch_error:
        out.print(f"[red]launch failed:[/] {escape(result.launch_error)}\n"
                  "the sweep is recorded; `gpuq status` retries the launch")


# --- the status view model ---------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """What a person (or a script) wants to know about one job, derived from a Snapshot at ``now``."""

    job: Job
    attempt: Attempt | None
    host_gpus: list[int]  # slots (GPU indices, or CPU slot ids) the running attempt holds on its host
    fraction: float | None  # share of the steps done, 0..1 (None: no step reported yet)
    eta_s: float | None  # seconds to the last step at the current step rate
    heartbeat_age_s: float | None  # None for finished jobs and jobs without a heartbeat
    cost: float | None  # money spent so far (host price per hour); None: no attempt on a priced host
    note: str = ""  # a trainer without a heartbeat: elapsed time and its last log line (plain text)
    waiting: str = ""  # a job placed but not started: Slurm's state and reason ("Slurm job 41 PENDING (Priority)")
    nodes: str = ""  # the Slurm nodes a running job has ("gpu-[01-02]"), or a multi-node job's other SSH hosts

    @property
    def where(self) -> str:
        """``host:slots`` ("g1:0,1"), the bare host when the slots are unknown, "-" when unplaced."""
        if not self.job.host:
            return "-"
        if not self.host_gpus:
            return f"{self.job.host}:{self.nodes}" if self.nodes else self.job.host
        where = f"{self.job.host}:{','.join(str(i) for i in self.host_gpus)}"
        return f"{where}+{self.nodes}" if self.nodes else where  # a multi-node job's other hosts

    @property
    def progress(self) -> str:
        """``ep 3/6 step 120/240``, or "-" before the first heartbeat."""
        att = self.attempt
        if att is None or att.step is None:
            return "-"
        total = f"/{att.total_steps}" if att.total_steps else ""
        epoch = "?" if att.epoch is None else str(att.epoch)
        return f"ep {epoch}/{self.job.epochs} step {att.step}{total}"


@dataclass(frozen=True)
class AlertView:
    time: float
    severity: str  # "info" | "warn" | "escalate"
    rule: str
    subject: str
    message: str
    action: str


def agent_entries(snap: Snapshot) -> dict[tuple[str, str], JobEntry]:
    """The host agents' job entries by (host, job id), from this tick's status documents."""
    entries: dict[tuple[str, str], JobEntry] = {}
    for name, probe in snap.probes.items():
        if probe.ok and probe.doc is not None:
            for entry in probe.doc.jobs:
                if entry.job_id:
                    entries[(name, entry.job_id)] = entry
    return entries


def slot_jobs(doc: StatusDocument | None) -> dict[int, str]:
    """Slot index -> id of the job whose attempt runs on it, from one host's status document."""
    held: dict[int, str] = {}
    for entry in doc.jobs if doc is not None else []:
        if entry.state == "running":
            for slot in entry.slots or []:
                held[slot] = entry.job_id
    return held


def eta_seconds(att: Attempt | None, steps_per_s: float | None) -> float | None:
    """Seconds to the last step at ``steps_per_s`` (the trainer's recent rate), else at the
    attempt's mean rate when it started from step 0; None when neither is known."""
    if att is None or att.step is None or not att.total_steps:
        return None
    rate = steps_per_s if steps_per_s and steps_per_s > 0 else None
    if rate is None and not att.resume_from and att.started_at and att.heartbeat_at and att.step > 0:
        elapsed = att.heartbeat_at - att.started_at
        rate = att.step / elapsed if elapsed > 0 else None
    if rate is None:
        return None
    return max(0.0, (att.total_steps - att.step) / rate)


def job_cost(job: Job, attempts: Sequence[Attempt], hosts: dict[str, HostRow], now: float) -> float | None:
    """Sum over the attempts of hours run x the host's price per hour x the job's share of its slots.

    None when no attempt ran on a host with a price (the local host, a box you own)."""
    total: float | None = None
    for att in attempts:
        if att.started_at is None:
            continue
        hours = max(0.0, (att.ended_at or now) - att.started_at) / 3600
        for name in att.node_hosts() or [att.host]:  # a multi-node job pays for every node's host
            row = hosts.get(name)
            if row is None or row.price_per_hour is None:
                continue
            share = min(1.0, job.gpus / row.slots_total) if row.slots_total > 0 else 1.0
            total = (total or 0.0) + hours * row.price_per_hour * share
    return total


def job_views(snap: Snapshot, now: float | None = None) -> list[JobView]:
    now = snap.generated_at if now is None else now
    entries = agent_entries(snap)
    hosts = {row.name: row for row in snap.hosts}
    # every attempt of each job when the snapshot carries them (cost adds them up); else the latest
    history: dict[str, list[Attempt]] = snap.attempt_history
    views = []
    for job in snap.jobs:
        att = snap.attempts.get(job.id)
        entry = entries.get((job.host or "", job.id)) or JobEntry(job_id=job.id)
        slots = list(entry.slots or []) if entry.state == "running" else []
        fraction = None
        if job.state == JobState.SUCCEEDED.value:
            fraction = 1.0
        elif att is not None and att.step is not None and att.total_steps:
            fraction = min(1.0, max(0.0, att.step / att.total_steps))
        heartbeat = entry.beat
        rate = heartbeat.steps_per_s if heartbeat is not None else None
        running = job.state == JobState.RUNNING.value
        note = ""
        if running and not heartbeat:  # a project's own trainer: what its log says
            fraction = fraction if fraction is not None else observed.progress_fraction(entry)
            since = observed.elapsed_s(entry, att.started_at if att is not None else None, now)
            note = " ".join(x for x in (duration(since) if since is not None else "", observed.last_line(entry)) if x)
        waiting = observed.slurm_wait(entry) if job.state == JobState.ASSIGNED.value else ""
        nodes = entry.slurm.nodes if entry.slurm is not None and running else ""
        nodes = "".join(c for c in nodes if c.isprintable())[:60]  # the host's text: printable, bounded
        if att is not None and att.nodes and not JobState(job.state).terminal:  # a multi-node job over SSH hosts
            nodes = "+".join(att.node_hosts()[1:])
        note = waiting or note  # waiting in a Slurm queue: Slurm's state and reason
        terminal = JobState(job.state).terminal
        hb_age = None if terminal or att is None or att.heartbeat_at is None else max(0.0, now - att.heartbeat_at)
        attempts = history.get(job.id) or ([att] if att is not None else [])
        views.append(JobView(
            job=job, attempt=att, host_gpus=slots, fraction=fraction,
            eta_s=eta_seconds(att, rate if isinstance(rate, int | float) else None) if running else None,
            heartbeat_age_s=hb_age, cost=job_cost(job, attempts, hosts, now), note=note, waiting=waiting, nodes=nodes,
        ))
    return views


def host_state(row: HostRow, probe: Probe | None) -> tuple[str, str]:
    """(text, style) of a host's reachability: ok; unreachable since T (never "dead": a transport
    failure says nothing about the jobs); reachable without an agent answer; not probed this tick."""
    if probe is not None and probe.ok:
        return "ok", "green"
    if probe is not None and probe.reachable and probe.error.startswith("protocol error"):
        return one_line(probe.error, 100), "bold red"  # the host answered with no valid document
    if probe is not None and probe.reachable:
        return f"reachable ({one_line(probe.error, 100)})", "yellow"
    if probe is None and not row.unreachable_since:
        return "not probed", "dim"
    since = clock(row.unreachable_since) if row.unreachable_since else "now"
    notes = [f"{row.probe_failures} failures"] if row.probe_failures > 1 else []
    if row.next_probe_at:
        notes.append(f"next try {clock(row.next_probe_at)}")
    text = f"unreachable since {since}" + (f" ({', '.join(notes)})" if notes else "")
    return (f"{text}: {one_line(probe.error, 100)}" if probe is not None and probe.error else text), "red"


def host_flags(row: HostRow) -> list[tuple[str, str]]:
    """(text, style) flags a person must not miss: an unhealthy verdict, a hold on new jobs."""
    flags = []
    detail = f": {one_line(row.health_detail, 80)}" if row.health_detail else ""
    if row.health == "fail":
        flags.append((f"UNHEALTHY{detail}", HEALTH_STYLE["fail"]))
    elif row.health == "warn":
        flags.append((f"health warn{detail}", HEALTH_STYLE["warn"]))
    if row.hold_reason:
        flags.append((f"HELD: {one_line(row.hold_reason, 80)}", "bold yellow"))
    if row.provider and row.lease_state and row.lease_state != "running":
        why = f": {one_line(row.lease_reason, 60)}" if row.lease_reason else ""
        flags.append((f"{row.lease_state.upper()}{why}", "bold red"))
    if row.provider and row.price_per_hour is not None:
        flags.append((f"{row.provider}{' spot' if row.spot else ''} ${row.price_per_hour:.2f}/h", "dim"))
    return flags


def alert_views(snap: Snapshot) -> list[AlertView]:
    """The latest findings, newest first (``Snapshot.alerts``: ledger events with a severity)."""
    return [AlertView(time=e.time, severity=e.severity or "info", rule=e.rule, subject=e.subject,
                      message=e.message, action=e.action) for e in snap.alerts]


def one_line(text: str, limit: int = 0) -> str:
    """``text`` on one line (a remote error may span many), cut to ``limit`` characters when given."""
    flat = " ".join(text.split())
    return flat if not limit or len(flat) <= limit else flat[:limit - 1] + "…"


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def duration(seconds: float | None) -> str:
    """Short duration for tables: 45s, 12m, 3h05m, 2d4h; "-" for None."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def pct(value: object) -> str:
    return f"{value:.0f}%" if isinstance(value, int | float) else "?"


RICH_ROWS = 60  # more jobs than this (or than a terminal shows) are printed as a plain aligned table


def status_table(snap: Snapshot) -> None:
    """``gpuq status --once`` (and any non-terminal stdout): hosts, jobs, latest alerts, sweep counts.

    Jobs that fit on the screen get a rich table; more (``status --all`` on a long history) get a
    plain aligned table, written at once: the same columns, no boxes, no wrapping."""
    out = _console()
    out.print(hosts_table(snap))
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
    hidden = [s for s in snap.sweeps if s.id not in listed]
    for sweep in snap.sweeps[-5:]:
        states = snap.counts.get(sweep.id, {})
        summary = "  ".join(f"{state}={n}" for state, n in sorted(states.items()))
        out.print(f"sweep {sweep.id}  {sweep.job_count} jobs  {summary}  ({sweep.queue_path})", markup=False)
    if hidden:
        out.print(f"{len(hidden)} finished sweep(s) not listed; `gpuq status --all` or `--sweep ID` shows them")


JOB_COLUMNS = ("job", "sweep", "name", "state", "host:gpu", "try", "progress", "eta", "loss", "hb", "cost", "exit")


def job_cells(view: JobView) -> list[str]:
    """One job's row of the jobs table (JOB_COLUMNS), as plain text."""
    job, att = view.job, view.attempt
    percent = f" ({view.fraction:.0%})" if view.fraction is not None and view.progress != "-" else ""
    shown = view.progress + percent
    if view.progress == "-" and (view.note or view.fraction is not None):  # no heartbeat: the log's word
        pct = f"{view.fraction:.0%} " if view.fraction is not None else ""
        shown = (pct + view.note).strip() or "-"
    return [
        job.id, job.sweep_id, job.name, job.state, view.where, str(job.attempt_count), shown,
        duration(view.eta_s), f"{att.loss:.4f}" if att is not None and att.loss is not None else "-",
        duration(view.heartbeat_age_s), money(view.cost),
        "-" if att is None or att.exit_code is None else str(att.exit_code),
    ]


def plain_jobs_table(views: Sequence[JobView]) -> str:
    """The jobs table as aligned text: a title line, a header, one line per job."""
    rows = [list(JOB_COLUMNS), *(job_cells(v) for v in views)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(JOB_COLUMNS))]
    lines = [f"jobs ({len(views)})"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"


def hosts_table(snap: Snapshot) -> Table:
    table = Table(title="hosts", title_justify="left")
    for col in ("host", "state", "health", "slots", "gpus", "disk", "inodes", "memory", "price"):
        table.add_column(col)
    for row in snap.hosts:
        probe = snap.probes.get(row.name)
        doc = probe.doc if probe and probe.ok else None
        slots, disk = (doc.slots, doc.disk) if doc is not None else (None, Disk())
        text, style = host_state(row, probe)
        health = " ".join(f"[{s}]{escape(t)}[/]" for t, s in host_flags(row)) or escape(row.health or "-")
        gpus = doc.gpus if doc is not None else []
        gpu_cell = str(len(gpus))
        if gpus:
            util = [g.util_pct for g in gpus if g.util_pct is not None]
            gpu_cell += f" ({sum(util) / len(util):.0f}% util)" if util else ""
        table.add_row(
            escape(row.name), f"[{style}]{escape(text)}[/]", health,  # host text is never rich markup
            escape(f"{slots.free}/{slots.total} {slots.kind}" if slots is not None else "?/? "),
            gpu_cell, pct(disk.used_pct), pct(disk.inodes_used_pct),
            pct(doc.memory.used_pct if doc is not None and doc.memory is not None else None),
            "-" if row.price_per_hour is None else f"${row.price_per_hour:.2f}/h",
        )
    return table


def jobs_table(snap: Snapshot, views: Sequence[JobView] | None = None) -> Table:
    table = Table(title="jobs", title_justify="left")
    for col in JOB_COLUMNS:
        table.add_column(col, no_wrap=col in ("job", "sweep", "state", "host:gpu"))
    for view in job_views(snap) if views is None else views:
        cells = [escape(cell) for cell in job_cells(view)]  # a log line in progress is never rich markup
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


def _shown(part: BaseModel | None) -> dict[str, Any]:
    """A part of a host's checked status document, as the host sent it (its unknown fields too)."""
    return {} if part is None else dict(part.model_dump(mode="json", exclude_unset=True))


def status_model(snap: Snapshot) -> documents.StatusDocument:
    """The ``--json`` document (``docs/schemas/status.schema.json``, generated from the model)."""
    from orchestrator.cli import documents  # pydantic models: only for --json

    hosts = []
    for row in snap.hosts:
        probe = snap.probes.get(row.name)
        doc = probe.doc if probe and probe.ok else None
        hosts.append(documents.HostStatus(
            name=row.name, kind=row.kind, reachable=bool(probe and probe.ok),
            error=probe.error if probe and not probe.ok else "",
            unreachable_since=row.unreachable_since, last_probe_at=row.last_probe_at,
            probe_s=probe.duration_s if probe else None,
            agent_alive=doc.agent.alive if doc is not None else None,
            health=row.health, health_detail=row.health_detail, hold_reason=row.hold_reason,
            price_per_hour=row.price_per_hour, provider=row.provider, instance_id=row.instance_id, spot=row.spot,
            lease_state=row.lease_state, lease_reason=row.lease_reason,
            slots=_shown(doc.slots if doc else None), gpus=[_shown(g) for g in (doc.gpus if doc else [])],
            disk=_shown(doc.disk if doc else None), memory=_shown(doc.memory if doc else None),
        ))
    sweeps = [documents.SweepStatus(id=sweep.id, queue_path=sweep.queue_path, created_at=sweep.created_at,
                                    jobs=sweep.job_count, states=snap.counts.get(sweep.id, {}))
              for sweep in snap.sweeps]
    alerts = [documents.Alert(time=a.time, severity=a.severity, rule=a.rule, subject=a.subject, message=a.message,
                              action=a.action) for a in alert_views(snap)]
    return documents.StatusDocument(schema_=STATUS_SCHEMA, generated_at=snap.generated_at, hosts=hosts,
                                    sweeps=sweeps, jobs=[job_model(v) for v in job_views(snap)], alerts=alerts)


def job_model(view: JobView) -> documents.JobStatus:
    from orchestrator.cli import documents

    job, att = view.job, view.attempt
    return documents.JobStatus(
        id=job.id, sweep_id=job.sweep_id, name=job.name, task=job.task, epochs=job.epochs, gpus=job.gpus,
        state=job.state, host=job.host, host_gpus=view.host_gpus, attempt=job.attempt_count,
        step=att.step if att else None, total_steps=att.total_steps if att else None,
        epoch=att.epoch if att else None, loss=att.loss if att else None, eta_s=view.eta_s,
        heartbeat_age_s=view.heartbeat_age_s, cost=view.cost, exit_code=att.exit_code if att else None,
        message=att.message if att else "", waiting=view.waiting, node_hosts=att.node_hosts() if att else [],
    )


def status_doc(snap: Snapshot) -> dict[str, Any]:
    """The ``--json`` document as a dict."""
    return status_model(snap).as_dict()


def status_json(snap: Snapshot) -> None:
    sys.stdout.write(status_model(snap).dump())


def _metric_names(rows: list[ResultRow]) -> list[str]:
    """Every metric a job reported, the sweep's headline metric first (it shows even before any job did)."""
    names: list[str] = [rows[0].metric] if rows and rows[0].metric else []
    for row in rows:
        for name in [*row.final, *row.best]:
            if name not in names:
                names.append(name)
    return names


PULLED_CELL = {"verified": "[green]verified[/]", "missing": "[red]verified, copy missing[/]"}


def results_table(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    table = Table(title=f"results of {rows[0].job.sweep_id}", title_justify="left")
    priced = any(r.cost is not None and r.cost.cost is not None for r in rows)
    lost = any(r.cost is not None and (r.cost.preemptions or r.cost.lost_gpu_hours) for r in rows)
    head = rows[0].metric
    arrow = {"max": " (max)", "min": " (min)"}.get(rows[0].mode, "")
    cols = ["job", "name", "state", *[f"final {n}" for n in names],
            *[f"best {n}{arrow if n == head else ''}" for n in names], "GPU-h"]
    cols += (["cost"] if priced else []) + (["lost GPU-h", "preempted"] if lost else []) + ["pulled"]
    for col in cols:
        table.add_column(col, no_wrap=col in ("job", "state", "pulled"))
    for row in rows:
        style = STATE_STYLE.get(row.job.state, "")
        cells = [row.job.id, escape(row.job.name), f"[{style}]{row.job.state}[/]"]
        cells += [f"{row.final[n]:.4f}" if n in row.final else "-" for n in names]
        cells += [f"{row.best[n]:.4f}" if n in row.best else "-" for n in names]
        c = row.cost
        cells.append(f"{c.gpu_hours:.3f}" if c is not None else "-")
        if priced:
            cells.append(f"${c.cost:.2f}" if c is not None and c.cost is not None else "-")
        if lost:
            cells += [f"{c.lost_gpu_hours:.3f}" if c is not None else "-", str(c.preemptions) if c is not None else "-"]
        cells.append(PULLED_CELL.get(row.pulled, "-"))
        table.add_row(*cells)
    _console().print(table)
    total = [r.cost for r in rows if r.cost is not None]
    if total:
        money = [c.cost for c in total if c.cost is not None]
        spent = f", ${sum(money):.2f}" if money else ""
        wasted = sum(c.lost_gpu_hours for c in total)
        _console().print(f"total {sum(c.gpu_hours for c in total):.3f} GPU-h{spent}"
                         + (f"; {wasted:.3f} GPU-h lost to preemptions and losses" if wasted else ""))


def results_csv(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    writer = csv.writer(sys.stdout)
    writer.writerow(["job_id", "sweep_id", "name", "task", "epochs", "state", "attempts",
                     *[f"final_{n}" for n in names], *[f"best_{n}" for n in names], "gpu_hours", "cost_usd",
                     "lost_gpu_hours", "preemptions", "pulled", "local_dir"])
    for row in rows:
        j = row.job
        c = row.cost
        writer.writerow([j.id, j.sweep_id, j.name, j.task, j.epochs, j.state, j.attempt_count,
                         *[row.final.get(n, "") for n in names], *[row.best.get(n, "") for n in names],
                         f"{c.gpu_hours:.6f}" if c else "", f"{c.cost:.4f}" if c and c.cost is not None else "",
                         f"{c.lost_gpu_hours:.6f}" if c else "", c.preemptions if c else "",
                         row.pulled, row.local_dir])


PULL_STYLE = {"verified": "green", "already verified": "green", "incomplete": "yellow", "quarantined": "red",
              "not pulled": "red"}


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def pulled(report: PullReport) -> None:
    """One row per job (state, files, bytes, local dir), then why each unverified job is not."""
    out = _console()
    table = Table(title=f"pull of {report.sweep_id}", title_justify="left")
    for col in ("job", "name", "state", "files", "bytes", "local dir"):
        table.add_column(col, no_wrap=col in ("job", "state", "local dir"))
    for item in report.outcomes:
        style = PULL_STYLE.get(item.state, "")
        shown = item.local_dir if item.verified else "-"
        table.add_row(escape(item.job_id), escape(item.name), f"[{style}]{escape(item.state)}[/]",
                      str(item.files) if item.files else "-", _size(item.bytes) if item.bytes else "-",
                      escape(str(shown)))
    out.print(table)
    for item in report.outcomes:
        if item.reason:
            out.print(f"{item.job_id} {item.name}: {item.state}: {item.reason}", markup=False)
    verified = report.verified
    fresh = [o for o in verified if o.state == "verified"]
    unverified = [o for o in report.outcomes if not o.verified and o.job_id not in report.written_off]
    retry = [o for o in unverified if o.state in ("incomplete", "quarantined")]
    if not verified:
        out.print("nothing was pulled: no job of this sweep has verified results "
                  "(an empty result set is a failure)", style="red")
    summary = (f"{len(verified)} of {len(report.outcomes)} jobs verified ({len(fresh)} just now, "
               f"{_size(sum(o.transferred for o in fresh))} transferred) in {report.results_dir}")
    if retry:
        summary += f"; {len(retry)} to retry: `gpuq pull --sweep {report.sweep_id}` resumes"
    if len(unverified) > len(retry):
        summary += f"; {len(unverified) - len(retry)} not pulled (reasons above)"
    out.print(summary, markup=False)
