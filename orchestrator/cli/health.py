"""``gpuq patrol | watch | doctor | reap``: the health patrol, GPU preflight and VRAM-zombie reaping."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli import complete
from orchestrator.cli.ctx import echo, open_ctx
from orchestrator.core import exitcodes

if TYPE_CHECKING:
    from orchestrator.api import ReapReport, TickReport


def _stamp(t: float | None = None) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(t))


def _print_tick(report: TickReport, *, stamp: bool = False) -> None:
    prefix = f"{_stamp()} " if stamp else ""
    for line in report.lines:
        echo(prefix + line)
    for f in report.findings:
        subject = f"{f.host}/{f.job}" if f.job else f.host
        action = f" -> {f.action}" if f.action else ""
        echo(f"{prefix}{f.severity.value.upper():8} {f.rule:12} {subject}: {f.message}{action}")
        if f.rule == "crash" and len(f.evidence) > 1:  # the first traceback, up to 50 lines
            for line in f.evidence:
                echo(f"{prefix}    | {line}")
    for action in report.actions:
        echo(f"{prefix}ACTION   {action}")


def _tick_doc(report: TickReport) -> dict[str, Any]:
    return {
        "schema": "gpuq.patrol/1",
        "time": time.time(),
        "lines": report.lines,
        "round_trips": report.round_trips,
        "probe_s": {name: round(p.duration_s, 3) for name, p in report.probes.items()},
        "findings": [{"rule": f.rule, "severity": f.severity.value, "host": f.host, "job": f.job,
                      "message": f.message, "action": f.action, "evidence": list(f.evidence)}
                     for f in report.findings],
        "actions": report.actions,
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document (schema gpuq.patrol/1).")
def patrol(as_json: bool) -> None:
    """Run one patrol tick: probe every host once, apply the rules, print one line per host.

    Suitable for cron: findings are stored in the ledger (see `gpuq status`) and escalations go
    to the webhook when one is configured.
    """
    from orchestrator import api

    report = api.run_tick(open_ctx())
    if as_json:
        sys.stdout.write(json.dumps(_tick_doc(report), indent=2, sort_keys=True) + "\n")
    else:
        _print_tick(report)


@click.command()
@click.option("--sweep", metavar="SWEEP", help="Sweep id or prefix (default: every unfinished sweep, and those "
                                               "submitted while it watches).")
@click.option("--interval", "interval_s", type=float, metavar="S",
              help="Seconds between ticks (default: patrol_interval_s while jobs run, patrol_idle_interval_s "
                   "otherwise; never below patrol_min_interval_s).")
@click.option("--max-hours", type=float, default=6.0, show_default=True,
              help="Give up after this long and ask for a manual check.")
@click.option("--auto-resume", is_flag=True,
              help="Continue preempted or lost jobs from their checkpoints as `gpuq resume` would (it may rent "
                   "replacements, which bills).")
def watch(sweep: str | None, interval_s: float | None, max_hours: float, auto_resume: bool) -> None:
    """Patrol until the sweep (default: every sweep) is done, one line per host per tick, backing off
    unreachable hosts."""
    from orchestrator import api

    result = api.watch(open_ctx(), sweep=sweep, interval_s=interval_s, max_hours=max_hours,
                       on_tick=lambda r: _print_tick(r, stamp=True), auto_resume=auto_resume)
    echo(f"watch: {result.reason} after {result.ticks} tick(s)")


@click.command()
@click.argument("hosts", nargs=-1, shell_complete=complete.hosts)
@click.option("--json", "as_json", is_flag=True, help="The verdicts as JSON.")
def doctor(hosts: tuple[str, ...], as_json: bool) -> None:
    """GPU preflight of HOSTS (default: every registered host): Xids, throttling, heat, ECC, busy
    GPUs, torch/CUDA, disk, /dev/shm.  A FAIL holds the host (no new jobs) until a later pass."""
    from orchestrator import api

    verdicts = api.doctor(open_ctx(), hosts)
    if as_json:
        doc = [{"host": v.host, "verdict": v.verdict, "detail": v.detail,
                "checks": [c.model_dump(mode="json") for c in v.doc.checks] if v.doc is not None else []}
               for v in verdicts]
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        for v in verdicts:
            echo(f"{v.host}: {v.verdict.upper()}")
            for check in v.doc.checks if v.doc is not None else []:
                echo(f"  {(check.status or '?').upper():5} {check.check}: {check.detail}")
            if v.doc is None:
                echo(f"  {v.detail}")
    if any(v.verdict in ("fail", "unreachable") for v in verdicts):
        sys.exit(exitcodes.HEALTH)


def _print_reap(report: ReapReport) -> None:
    if report.error and not report.doc:
        echo(f"{report.host}: reaper failed: {report.error}", err=True)
        return
    if not report.candidates:
        echo(f"{report.host}: clean (no process holds a GPU device without nvidia-smi and gpuq knowing it)")
        return
    echo(f"{report.host}: {len(report.candidates)} VRAM zombie candidate(s):")
    echo(f"  {'PID':>7}  {'USER':10} {'AGE':>7}  {'COMMAND':16} DEVICES / CMDLINE")
    for c in report.candidates:
        echo(f"  {c.pid!s:>7}  {c.user or '?':10} {c.age_s or 0.0:6.0f}s  "
                   f"{c.comm or '?':16} {','.join(c.devices)}  {c.cmdline}")


@click.command()
@click.argument("host", shell_complete=complete.hosts)
@click.option("--force", is_flag=True, help="Kill the zombies (detected again at that moment).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation with --force.")
def reap(host: str, force: bool, yes: bool) -> None:
    """Find processes that hold a GPU on HOST without nvidia-smi listing them and without being
    gpuq's own live jobs (confirmed over two samples).  Dry run unless --force."""
    from orchestrator import api

    ctx = open_ctx()
    report = api.reap(ctx, host)
    _print_reap(report)
    if report.error and not report.doc:
        sys.exit(exitcodes.FAILED)
    if not force or not report.candidates:
        if report.candidates:
            echo(f"dry run: nothing killed; `gpuq reap {host} --force` kills them after re-checking")
        return
    if not yes:
        if not sys.stdin.isatty():
            echo("gpuq: --force needs confirmation; re-run in a terminal or add --yes", err=True)
            sys.exit(exitcodes.USAGE)
        click.confirm(f"kill these processes on {host}?", abort=True)
    forced = api.reap(ctx, host, force=True)
    killed = forced.doc.killed if forced.doc is not None else []
    if not killed:
        echo("nothing killed: the candidates were gone when re-checked")
    for k in killed:
        echo(f"  {k.pid}: {k.outcome}")
    if forced.exit_code != 0:
        echo(f"gpuq: some kills failed on {host}: {forced.error}", err=True)
        sys.exit(exitcodes.FAILED)
