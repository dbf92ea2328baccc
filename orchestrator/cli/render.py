"""Rendering of api results for people (rich tables) and scripts (JSON, CSV).

``gpuq status --json`` prints one object (schema ``gpuq.cli.status/1``)::

    {"schema", "generated_at",
     "hosts": [{"name", "kind", "reachable", "error", "unreachable_since", "probe_s",
                "agent_alive", "slots": {"kind", "total", "free"}, "gpus": [...],
                "disk": {...}, "memory": {...}}],
     "sweeps": [{"id", "queue_path", "created_at", "jobs", "states": {STATE: count}}],
     "jobs": [{"id", "sweep_id", "name", "task", "epochs", "gpus", "state", "host", "attempt",
               "step", "total_steps", "epoch", "loss", "heartbeat_age_s", "exit_code", "message"}]}
"""

from __future__ import annotations

import csv
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.api import PullReport, ResultRow, Snapshot, SubmitResult

STATUS_SCHEMA = "gpuq.cli.status/1"
STATE_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "RUNNING": "cyan", "ASSIGNED": "blue",
               "QUEUED": "white", "LOST": "magenta", "PREEMPTED": "magenta", "CANCELLED": "yellow"}


def _console() -> Console:
    # Not a terminal (a pipe, a CI log): do not squeeze tables to 80 columns and cut job ids.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def submitted(result: SubmitResult) -> None:
    out = _console()
    for warning in result.warnings:
        out.print(f"[yellow]warning:[/] {warning}")
    if result.dry_run:
        out.print(f"dry run: {len(result.placements)} jobs valid; bundle {result.bundle.sha256[:12]} "
                  f"({result.bundle.files} files, {result.bundle.bytes} bytes); nothing was written")
        for job_id, host in result.placements.items():
            out.print(f"  {job_id} -> {host}")
        out.print(f"projected makespan {_duration(result.makespan_s)} (estimates: est_min=, else history)")
        return
    out.print(f"sweep [bold]{result.sweep_id}[/]: {len(result.jobs)} jobs from {result.queue_path} "
              f"(bundle {result.bundle.sha256[:12]})")
    for job in result.jobs:
        out.print(f"  {job.id}  {job.name:<24} {job.task} {job.epochs}ep gpus={job.gpus} -> "
                  f"{result.placements.get(job.id, '?')}")
    hosts = sorted(set(result.placements.values()))
    if result.pushed_to:
        out.print(f"bundle pushed to {', '.join(result.pushed_to)} ({result.bundle.bytes / 1e6:.2f} MB each); "
                  f"projected makespan {_duration(result.makespan_s)}")
    else:
        out.print(f"bundle already on {', '.join(hosts)}; projected makespan {_duration(result.makespan_s)}")
    if result.launch_error:
        out.print(f"[red]launch failed:[/] {result.launch_error}\n"
                  "the sweep is recorded; `gpuq status` retries the launch")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _age(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, now - ts)
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def status_table(snap: Snapshot) -> None:
    out = _console()
    now = snap.generated_at
    hosts = Table(title="hosts", title_justify="left")
    for col in ("host", "state", "slots", "gpus", "disk", "inodes", "memory"):
        hosts.add_column(col)
    for row in snap.hosts:
        probe = snap.probes.get(row.name)
        doc = probe.doc if probe and probe.ok else {}
        slots = doc.get("slots", {})
        disk = doc.get("disk", {})
        mem = doc.get("memory", {})
        if probe is None:
            state = "not probed"
        elif probe.ok:
            state = "ok"
        elif probe.reachable:
            state = f"reachable ({probe.error})"
        else:
            since = time.strftime("%H:%M:%SZ", time.gmtime(row.unreachable_since)) if row.unreachable_since else "now"
            state = f"[red]unreachable since {since}[/]: {probe.error}"
        hosts.add_row(
            row.name, state,
            f"{slots.get('free', '?')}/{slots.get('total', '?')} {slots.get('kind', '')}",
            str(len(doc.get("gpus", []))),
            f"{disk.get('used_pct', '?')}%", f"{disk.get('inodes_used_pct', '?')}%",
            f"{mem.get('used_pct', '?')}%",
        )
    out.print(hosts)
    jobs = Table(title="jobs", title_justify="left")
    for col in ("job", "sweep", "name", "state", "host", "try", "progress", "loss", "hb", "exit"):
        jobs.add_column(col, no_wrap=col in ("job", "sweep", "state"))
    for job in snap.jobs:
        att = snap.attempts.get(job.id)
        progress = "-"
        if att is not None and att.step is not None:
            total = f"/{att.total_steps}" if att.total_steps else ""
            progress = f"ep {att.epoch}/{job.epochs} step {att.step}{total}"
        style = STATE_STYLE.get(job.state, "")
        jobs.add_row(
            job.id, job.sweep_id, job.name, f"[{style}]{job.state}[/]", job.host or "-",
            str(job.attempt_count), progress,
            f"{att.loss:.4f}" if att is not None and att.loss is not None else "-",
            "-" if JobState(job.state).terminal else _age(att.heartbeat_at if att else None, now),
            "-" if att is None or att.exit_code is None else str(att.exit_code),
        )
    out.print(jobs)
    listed = {j.sweep_id for j in snap.jobs}
    hidden = [s for s in snap.sweeps if s.id not in listed]
    for sweep in snap.sweeps[-5:]:
        states = snap.counts.get(sweep.id, {})
        summary = "  ".join(f"{state}={n}" for state, n in sorted(states.items()))
        out.print(f"sweep {sweep.id}  {sweep.job_count} jobs  {summary}  ({sweep.queue_path})")
    if hidden:
        out.print(f"{len(hidden)} finished sweep(s) not listed; `gpuq status --all` or `--sweep ID` shows them")


def status_doc(snap: Snapshot) -> dict[str, Any]:
    now = snap.generated_at
    hosts = []
    for row in snap.hosts:
        probe = snap.probes.get(row.name)
        doc = probe.doc if probe and probe.ok else {}
        hosts.append({
            "name": row.name, "kind": row.kind, "reachable": bool(probe and probe.ok),
            "error": probe.error if probe and not probe.ok else "",
            "unreachable_since": row.unreachable_since, "probe_s": probe.duration_s if probe else None,
            "agent_alive": bool(doc.get("agent", {}).get("alive")) if doc else None,
            "slots": doc.get("slots", {}), "gpus": doc.get("gpus", []),
            "disk": doc.get("disk", {}), "memory": doc.get("memory", {}),
        })
    jobs = []
    for job in snap.jobs:
        att = snap.attempts.get(job.id)
        jobs.append({
            "id": job.id, "sweep_id": job.sweep_id, "name": job.name, "task": job.task,
            "epochs": job.epochs, "gpus": job.gpus, "state": job.state, "host": job.host,
            "attempt": job.attempt_count,
            "step": att.step if att else None, "total_steps": att.total_steps if att else None,
            "epoch": att.epoch if att else None, "loss": att.loss if att else None,
            "heartbeat_age_s": (now - att.heartbeat_at) if att and att.heartbeat_at else None,
            "exit_code": att.exit_code if att else None, "message": att.message if att else "",
        })
    sweeps = []
    for sweep in snap.sweeps:
        sweeps.append({"id": sweep.id, "queue_path": sweep.queue_path, "created_at": sweep.created_at,
                       "jobs": sweep.job_count, "states": snap.counts.get(sweep.id, {})})
    return {"schema": STATUS_SCHEMA, "generated_at": now, "hosts": hosts, "sweeps": sweeps, "jobs": jobs}


def status_json(snap: Snapshot) -> None:
    sys.stdout.write(json.dumps(status_doc(snap), indent=2, sort_keys=True) + "\n")


def _metric_names(rows: list[ResultRow]) -> list[str]:
    names: list[str] = []
    for row in rows:
        for name in [*row.final, *row.best]:
            if name not in names:
                names.append(name)
    return names


PULLED_CELL = {"verified": "[green]verified[/]", "missing": "[red]verified, copy missing[/]"}


def results_table(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    table = Table(title=f"results of {rows[0].job.sweep_id}", title_justify="left")
    for col in ["job", "name", "state", *[f"final {n}" for n in names], *[f"best {n}" for n in names], "pulled"]:
        table.add_column(col, no_wrap=col in ("job", "state", "pulled"))
    for row in rows:
        style = STATE_STYLE.get(row.job.state, "")
        cells = [row.job.id, row.job.name, f"[{style}]{row.job.state}[/]"]
        cells += [f"{row.final[n]:.4f}" if n in row.final else "-" for n in names]
        cells += [f"{row.best[n]:.4f}" if n in row.best else "-" for n in names]
        cells.append(PULLED_CELL.get(row.pulled, "-"))
        table.add_row(*cells)
    _console().print(table)


def results_csv(rows: list[ResultRow]) -> None:
    names = _metric_names(rows)
    writer = csv.writer(sys.stdout)
    writer.writerow(["job_id", "sweep_id", "name", "task", "epochs", "state", "attempts",
                     *[f"final_{n}" for n in names], *[f"best_{n}" for n in names], "pulled", "local_dir"])
    for row in rows:
        j = row.job
        writer.writerow([j.id, j.sweep_id, j.name, j.task, j.epochs, j.state, j.attempt_count,
                         *[row.final.get(n, "") for n in names], *[row.best.get(n, "") for n in names],
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
        table.add_row(item.job_id, item.name, f"[{style}]{item.state}[/]", str(item.files) if item.files else "-",
                      _size(item.bytes) if item.bytes else "-", shown)
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
