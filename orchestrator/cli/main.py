"""``gpuq`` entry point.  Errors are caught once, here.

Exit codes: ``orchestrator/core/exitcodes.py`` (0 ok, 1 a job or host failed, 2 usage/config/queue
error, 3 health check failed, 4 timeout, 130 interrupted).
Heavy modules (sqlmodel, rich) are imported inside commands so that ``gpuq --help`` stays fast.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli import complete, flags
from orchestrator.cli.ctx import open_ctx, open_reader, read_through, warn
from orchestrator.core import exitcodes

if TYPE_CHECKING:
    from orchestrator.api import Snapshot
    from orchestrator.context import Context


class _State:
    debug = False


def version() -> str:
    """The installed distribution's version; from a checkout, pyproject.toml's (else __version__)."""
    from importlib import metadata

    try:
        return metadata.version("gpuq")
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        from orchestrator.core.config import tomllib

        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, ValueError):
        from orchestrator import __version__

        return __version__


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"gpuq {version()}")
        ctx.exit()


EXIT_CODES = "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in exitcodes.TABLE.items())


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.option("--debug", is_flag=True, help="Show tracebacks for gpuq errors.")
@click.option("-v", "--verbose", count=True,
              help="Log retries, backoff and rate-limit waits on stderr (-vv: every request).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
def cli(debug: bool, verbose: int) -> None:
    """gpuq: run ablation queues on GPU hosts, detached, checkpointed, verified."""
    _State.debug = debug
    from orchestrator.cli.progressbars import install_if_terminal

    install_if_terminal()  # bars for bundle pushes, checkpoint copies and pulls (stderr, terminals only)
    if verbose:
        from orchestrator.cli.verbose import configure

        configure(verbose)


@cli.command()
@click.argument("queue", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--host", "hosts", metavar="NAME", multiple=True,
              help="Use only this host (repeatable). Default: every registered remote host, else local.")
@click.option("--dry-run", is_flag=True, help="Validate and plan; write nothing.")
@click.option("--smoke", is_flag=True, help="Run every distinct cell briefly on this machine (start, metrics, "
              "checkpoint, resume); exit 1 on any failure; record nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Return only when every job has ended.")
@click.option("--budget", "budget_usd", type=click.FloatRange(min=0, min_open=True, max=1e9), metavar="USD",
              help="Cap what the sweep may spend: its jobs start only while spent + committed fits (default: the "
                   "budget_usd setting; none). With --dry-run: whether the projected cost fits.")
@flags.stop_option()
@flags.rerun_option()
@flags.into_option()
@click.option("--json", "as_json", is_flag=True,
              help="Print the sweep id and its jobs as JSON (docs/schemas/submit.schema.json), like sbatch "
                   "--parsable; with --dry-run: one JSON document of every expanded job and its argv.")
def submit(queue: Path, hosts: tuple[str, ...], dry_run: bool, smoke: bool, wait_: bool, budget_usd: float | None,
           stop: str | None, rerun: bool, into: str | None, as_json: bool) -> None:
    """Validate QUEUE, record it in the ledger and start its jobs."""
    from orchestrator import api
    from orchestrator.cli import emit, render
    from orchestrator.core.errors import UsageError

    ctx = open_ctx(queue.parent)
    if smoke:
        from orchestrator.api.smoke import smoke as run_smoke
        from orchestrator.cli.dryrun import print_smoke
        smoked = run_smoke(ctx, queue, say=lambda line: click.echo(f"gpuq: {line}", err=True))
        print_smoke(smoked)
        sys.exit(0 if smoked.ok else exitcodes.FAILED)
    try:
        result = api.submit(ctx, queue, hosts=hosts, dry_run=dry_run, budget_usd=budget_usd, stop=stop, rerun=rerun) \
            if into is None else api.submit_into(ctx, queue, into, hosts=hosts, dry_run=dry_run, rerun=rerun,
                                                 budget_usd=budget_usd, stop=stop)
    except PermissionError as exc:  # reading the project (a directory gpuq.toml or the bundle walk reaches)
        raise UsageError(f"{exc.filename or queue}: permission denied while reading the project; make it "
                         "readable to you, or leave it out ([run] project, .gpuqignore)") from exc
    if dry_run:
        from orchestrator.cli.dryrun import print_dry_run
        print_dry_run(api.dry_run(ctx, result), as_json=as_json)
        return
    if as_json:
        emit.submitted(result)
    else:
        render.submitted(result)
    if result.launch_error:
        sys.exit(exitcodes.FAILED)
    if wait_ and not dry_run:
        from orchestrator.cli import statelines
        snap = statelines.wait(ctx, result.sweep_id, as_json=as_json)
        _say_budget_stop(ctx, result.sweep_id)
        if any(j.state != "SUCCEEDED" for j in snap.jobs):
            sys.exit(exitcodes.FAILED)


def _dashboard() -> Any:
    from orchestrator.cli import dashboard  # rich.live, rich.layout: only for the live view

    return dashboard


def _states(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...]:
    from orchestrator.core.states import JobState

    if not value:
        return ()
    names = [v.strip().upper() for v in value.split(",") if v.strip()]
    known = [st.value for st in JobState]
    bad = [n for n in names if n not in known]
    if bad:
        raise click.BadParameter(f"unknown state {', '.join(bad)}; one or more of {','.join(known)}")
    return tuple(names)


@cli.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit (what a non-terminal stdout always gets).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one machine-readable snapshot (docs/schemas/status.schema.json).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=1.0), default=5.0, show_default=True,
              metavar="SECONDS", help="Live view: seconds between probes of every host.")
@click.option("--sweep", metavar="SWEEP", shell_complete=complete.sweeps, help="Only this sweep (id or prefix).")
@click.option("--all", "all_jobs", is_flag=True, help="Every job of every sweep, finished ones too.")
@click.option("--no-probe", is_flag=True, help="Answer from the ledger alone: contact no host.")
@click.option("--state", "states", metavar="STATE[,STATE...]", callback=_states,
              help="Only jobs in these states, e.g. RUNNING,FAILED.")
def status(once: bool, as_json: bool, interval_s: float, sweep: str | None, all_jobs: bool, no_probe: bool,
           states: tuple[str, ...]) -> None:
    """Probe every host, reconcile the ledger and show hosts, jobs and alerts.

    In a terminal: a live view, probing every --interval seconds (q quits, arrow keys scroll the
    jobs).  With --once or --json, or when stdout is not a terminal: one snapshot.  Without --sweep
    or --all, jobs of unfinished sweeps are listed (or of the newest sweep).  --no-probe answers
    from the ledger alone, as it was after the last probe.
    """
    from orchestrator import api
    from orchestrator.context import gc_paused
    from orchestrator.core.states import JobState

    wanted = [JobState(s) for s in states]
    live = not (once or as_json) and sys.stdout.isatty() and sys.stdin.isatty() and _dashboard().interactive()
    reader = open_reader() if no_probe and not live else None  # the ledger alone: no ORM (ledger/reader.py)
    if reader is not None:
        with gc_paused():
            try:
                snap = api.ledger_status(reader, sweep=sweep, all_jobs=all_jobs, states=wanted)
            finally:
                reader.close()
            _show_status(snap, as_json)
        return
    ctx = open_ctx()
    if live:
        from orchestrator.cli import dashboard
        code = dashboard.run(ctx, sweep=sweep, all_jobs=all_jobs, interval_s=interval_s, probe=not no_probe,
                             states=wanted)
        if code:
            sys.exit(code)
        return
    with gc_paused():  # one snapshot of up to every job: the live rows are read, drawn, and the process ends
        _show_status(api.status(ctx, sweep=sweep, all_jobs=all_jobs, probe=not no_probe, states=wanted), as_json)


def _show_status(snap: Snapshot, as_json: bool) -> None:
    if as_json:
        from orchestrator.cli.statusjson import status_json

        status_json(snap)
    else:
        from orchestrator.cli import render

        render.status_table(snap)


@cli.command()
@click.option("--sweep", metavar="SWEEP", shell_complete=complete.sweeps,
              help="Sweep id or prefix (default: the newest).")
@click.option("--timeout", "timeout_s", type=float, help="Give up after this many seconds (exit 4).")
@click.option("--json", "as_json", is_flag=True, help="How the sweep ended, as JSON (docs/schemas/wait.schema.json).")
def wait(sweep: str | None, timeout_s: float | None, as_json: bool) -> None:
    """Block until every job of the sweep has ended; exit 1 if any did not succeed, 4 on --timeout."""
    from orchestrator.cli import emit, render

    ctx = open_ctx()
    sweep_id = ctx.ledger.resolve_sweep(sweep).id
    snap = emit.wait(ctx, sweep_id, timeout_s, as_json=as_json)
    if as_json:
        emit.waited(snap, sweep_id)
    else:
        render.status_table(snap)
    _say_budget_stop(ctx, sweep_id)
    if any(j.state != "SUCCEEDED" for j in snap.jobs):
        sys.exit(exitcodes.FAILED)


def _say_budget_stop(ctx: Context, sweep_id: str) -> None:
    """A wait that ended on the sweep's budget says so (stderr), with what to do."""
    from orchestrator.api import budgeting

    for line in budgeting.stopped(ctx, sweep_id).values():
        click.echo(f"gpuq: {line}", err=True)


@cli.command()
@click.argument("jobs", nargs=-1, metavar="[JOB]...", shell_complete=complete.jobs)
@click.option("--sweep", "sweeps", metavar="SWEEP", multiple=True, shell_complete=complete.sweeps,
              help="Every unfinished job of this sweep (repeatable).")
@click.option("--all", "all_sweeps", is_flag=True, help="Every unfinished job of every sweep.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
def cancel(jobs: tuple[str, ...], sweeps: tuple[str, ...], all_sweeps: bool, yes: bool) -> None:
    """Cancel JOBs (names, ids, prefixes or SWEEP:NAME), every unfinished job of --sweep, or --all.

    Asks before cancelling more than one job (in a terminal; elsewhere give -y).  One line per job
    says what happened; exit 1 when a job could not be cancelled (its host did not answer)."""
    from orchestrator import api
    from orchestrator.core.states import JobState

    ctx = open_ctx()
    targets, notes = api.cancel_targets(ctx, refs=jobs, sweeps=sweeps, all_sweeps=all_sweeps)
    for note in notes:
        click.echo(f"gpuq: {note}", err=True)
    live = [j for j in targets if not JobState(j.state).terminal]
    if not targets:
        click.echo("nothing to cancel: no unfinished job")
        return
    if len(live) > 1 and not yes:
        if not sys.stdin.isatty():
            click.echo(f"gpuq: this cancels {len(live)} jobs; confirm in a terminal or add -y", err=True)
            sys.exit(exitcodes.USAGE)
        sweeps_hit = sorted({j.sweep_id for j in live})
        if not click.confirm(f"cancel {len(live)} jobs of sweep(s) {', '.join(sweeps_hit)}?"):
            click.echo("nothing was cancelled", err=True)
            sys.exit(exitcodes.INTERRUPTED)
    outcomes = api.cancel(ctx, jobs=targets)
    for item in outcomes:
        click.echo(f"{item.job.id}  {item.job.sweep_id}:{item.job.name:<24} {item.outcome}")
    if not all(item.ok for item in outcomes):
        sys.exit(exitcodes.FAILED)


@cli.command()
@click.option("--sweep", metavar="SWEEP", shell_complete=complete.sweeps,
              help="Sweep id or prefix (default: the newest).")
@click.option("--csv", "as_csv", is_flag=True, help="CSV on stdout.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout (docs/schemas/results.schema.json).")
def results(sweep: str | None, as_csv: bool, as_json: bool) -> None:
    """One row per job: state, final and best metrics."""
    from orchestrator import api
    from orchestrator.cli import resulttables
    if as_csv and as_json:
        raise click.UsageError("give --csv or --json, not both")
    rows = read_through(lambda ctx: api.results(ctx, sweep=sweep))  # the ledger alone unless a job lacks metrics
    from orchestrator.api.resultrows import collect_notes

    for note in collect_notes({row.job.id: row.error for row in rows if row.error}):
        warn(note)  # one host's failure: the other rows stand
    if as_json:
        from orchestrator.cli import emit  # every command's JSON models: only when printing JSON
        emit.results(rows)
    elif as_csv:
        resulttables.results_csv(rows)
    else:
        resulttables.results_table(rows)


@cli.command()
@click.option("--sweep", metavar="SWEEP", shell_complete=complete.sweeps,
              help="Sweep id or prefix (default: the newest).")
@click.option("--json", "as_json", is_flag=True, help="The outcome per job as JSON (docs/schemas/pull.schema.json).")
def pull(sweep: str | None, as_json: bool) -> None:
    """Bring finished jobs' results home to $GPUQ_HOME/results/SWEEP/JOB/, verified by size and sha256.

    Resumes partial copies; jobs already verified are not fetched again.  Exit 1 when any job is
    not verified (incomplete, quarantined, failed) or nothing could be pulled.
    """
    from orchestrator import api
    from orchestrator.cli import emit, resulttables

    report = api.pull(open_ctx(), sweep=sweep)
    if as_json:
        emit.pulled(report)
    else:
        resulttables.pulled(report)
    if not report.ok:
        sys.exit(exitcodes.FAILED)


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL; job, sweep and host names complete from the ledger.

    \b
    bash:  eval "$(gpuq completion bash)"     (in ~/.bashrc)
    zsh:   eval "$(gpuq completion zsh)"      (in ~/.zshrc)
    fish:  gpuq completion fish > ~/.config/fish/completions/gpuq.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # click knows the three shells above
        raise click.BadParameter(f"no completion for {shell}")
    click.echo(cls(cli, {}, "gpuq", "_GPUQ_COMPLETE").source())


def _register_groups() -> None:
    from orchestrator.cli.attempts import explain, logs
    from orchestrator.cli.budget import budget
    from orchestrator.cli.cloud import down, resume
    from orchestrator.cli.health import doctor, patrol, reap, watch
    from orchestrator.cli.hosts import hosts
    from orchestrator.cli.offers import offers
    from orchestrator.cli.report import report
    from orchestrator.cli.up import up

    cli.add_command(hosts)
    for command in (patrol, watch, doctor, reap, up, down, resume, offers, report, budget, logs, explain):
        cli.add_command(command)


_register_groups()


def main(argv: list[str] | None = None) -> Any:
    collecting = gc.isenabled()
    gc.disable()  # importing sqlalchemy, pydantic and rich allocates much and frees little: ~10% of start-up
    try:
        return _main(argv)
    finally:
        if collecting:  # a caller in this process (a test, an embedding) gets its collector back
            gc.enable()


def _main(argv: list[str] | None) -> Any:
    from orchestrator.core.errors import GpuqError, QueueParseError
    from orchestrator.views.text import printable

    try:
        return cli.main(args=argv, prog_name="gpuq", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, EOFError):  # click turns any EOFError into Abort; only a prompt's
            raise exc.__cause__ from None         # is the user's doing, and prompts raise Abort from None
        click.echo("aborted", err=True)
        sys.exit(exitcodes.INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(exitcodes.INTERRUPTED)
    except GpuqError as exc:
        if _State.debug:
            import traceback

            traceback.print_exc()
        prefix = "" if isinstance(exc, QueueParseError) else "gpuq: "
        for line in str(exc).splitlines() or ["error"]:  # may quote a host: no control sequence reaches the terminal
            click.echo(f"{prefix}{printable(line)}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
