"""``gpuq`` entry point.  Errors are caught once, here.

Exit codes: 0 ok, 1 failure, 2 usage/config/queue error, 130 interrupted.
Heavy modules (sqlmodel, rich) are imported inside commands so that
``gpuq --help`` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from orchestrator.api import Context


class _State:
    debug = False


def _ctx(project_dir: Path | None = None) -> Context:
    from orchestrator import api

    return api.open_context(project_dir=project_dir)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for gpuq errors.")
@click.version_option(package_name="gpuq")
def cli(debug: bool) -> None:
    """gpuq: run ablation queues on GPU hosts, detached, checkpointed, verified."""
    _State.debug = debug


@cli.command()
@click.argument("queue", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--host", "hosts", metavar="NAME", multiple=True,
              help="Use only this host (repeatable). Default: every registered remote host, else local.")
@click.option("--dry-run", is_flag=True, help="Validate and plan; write nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Return only when every job has ended.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: one JSON document of every expanded job.")
def submit(queue: Path, hosts: tuple[str, ...], dry_run: bool, wait_: bool, as_json: bool) -> None:
    """Validate QUEUE, record it in the ledger and start its jobs."""
    from orchestrator import api
    from orchestrator.cli import render

    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run")
    ctx = _ctx(queue.parent)
    result = api.submit(ctx, queue, hosts=hosts, dry_run=dry_run)
    if dry_run:
        from orchestrator.cli.dryrun import print_dry_run

        print_dry_run(api.dry_run(ctx, result), as_json=as_json)
        return
    render.submitted(result)
    if result.launch_error:
        sys.exit(1)
    if wait_ and not dry_run:
        snap = api.wait(ctx, sweep=result.sweep_id)
        render.status_table(snap)
        if any(j.state != "SUCCEEDED" for j in snap.jobs):
            sys.exit(1)


@cli.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit (what a non-terminal stdout always gets).")
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable snapshot (docs/status.schema.json).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=1.0), default=5.0, show_default=True,
              metavar="SECONDS", help="Live view: seconds between probes of every host.")
@click.option("--sweep", metavar="SWEEP", help="Only this sweep (id or prefix).")
@click.option("--all", "all_jobs", is_flag=True, help="Every job of every sweep, finished ones too.")
def status(once: bool, as_json: bool, interval_s: float, sweep: str | None, all_jobs: bool) -> None:
    """Probe every host, reconcile the ledger and show hosts, jobs and alerts.

    In a terminal: a live view, probing every --interval seconds (q quits, arrow keys scroll the
    jobs).  With --once or --json, or when stdout is not a terminal: one snapshot.  Without --sweep
    or --all, jobs of unfinished sweeps are listed (or of the newest sweep).
    """
    from orchestrator import api
    from orchestrator.cli import dashboard, render

    ctx = _ctx()
    if not (once or as_json) and dashboard.interactive():
        code = dashboard.run(ctx, sweep=sweep, all_jobs=all_jobs, interval_s=interval_s)
        if code:
            sys.exit(code)
        return
    snap = api.status(ctx, sweep=sweep, all_jobs=all_jobs)
    if as_json:
        render.status_json(snap)
    else:
        render.status_table(snap)


@cli.command()
@click.option("--sweep", metavar="SWEEP", help="Sweep id or prefix (default: the newest).")
@click.option("--timeout", "timeout_s", type=float, help="Give up after this many seconds.")
def wait(sweep: str | None, timeout_s: float | None) -> None:
    """Block until every job of the sweep has ended; exit 1 if any did not succeed."""
    from orchestrator import api
    from orchestrator.cli import render

    snap = api.wait(_ctx(), sweep=sweep, timeout_s=timeout_s)
    render.status_table(snap)
    if any(j.state != "SUCCEEDED" for j in snap.jobs):
        sys.exit(1)


@cli.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
def logs(job: str, follow: bool) -> None:
    """Print the log of JOB's latest attempt (id, prefix >= 4, or QUEUE:NAME)."""
    from orchestrator import api

    for chunk in api.logs(_ctx(), job, follow=follow):
        click.echo(chunk, nl=False)


@cli.command()
@click.argument("job", required=False)
@click.option("--sweep", metavar="SWEEP", help="Cancel every unfinished job of this sweep.")
def cancel(job: str | None, sweep: str | None) -> None:
    """Cancel JOB, or every unfinished job of --sweep."""
    from orchestrator import api

    for item in api.cancel(_ctx(), ref=job, sweep=sweep):
        click.echo(f"{item.job.id}  {item.job.name:<24} {item.outcome}")


@cli.command()
@click.option("--sweep", metavar="SWEEP", help="Sweep id or prefix (default: the newest).")
@click.option("--csv", "as_csv", is_flag=True, help="CSV on stdout.")
def results(sweep: str | None, as_csv: bool) -> None:
    """One row per job: state, final and best metrics."""
    from orchestrator import api
    from orchestrator.cli import render

    rows = api.results(_ctx(), sweep=sweep)
    if as_csv:
        render.results_csv(rows)
    else:
        render.results_table(rows)


@cli.command()
@click.option("--sweep", metavar="SWEEP", help="Sweep id or prefix (default: the newest).")
def pull(sweep: str | None) -> None:
    """Bring finished jobs' results home to $GPUQ_HOME/results/SWEEP/JOB/, verified by size and sha256.

    Resumes partial copies; jobs already verified are not fetched again.  Exit 1 when any job is
    not verified (incomplete, quarantined, failed) or nothing could be pulled.
    """
    from orchestrator import api
    from orchestrator.cli import render

    report = api.pull(_ctx(), sweep=sweep)
    render.pulled(report)
    if not report.ok:
        sys.exit(1)


def _register_groups() -> None:
    from orchestrator.cli.cloud import down, resume, up
    from orchestrator.cli.health import doctor, patrol, reap, watch
    from orchestrator.cli.hosts import hosts

    cli.add_command(hosts)
    for command in (patrol, watch, doctor, reap, up, down, resume):
        cli.add_command(command)


_register_groups()


def main(argv: list[str] | None = None) -> Any:
    from orchestrator.errors import GpuqError, QueueParseError

    try:
        return cli.main(args=argv, prog_name="gpuq", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except GpuqError as exc:
        if _State.debug:
            import traceback

            traceback.print_exc()
        prefix = "" if isinstance(exc, QueueParseError) else "gpuq: "
        for line in str(exc).splitlines() or ["error"]:
            click.echo(f"{prefix}{line}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
