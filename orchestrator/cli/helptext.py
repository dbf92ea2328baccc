"""``gpuq --help``'s text, printed by ``cli/entry.py`` without importing click (generated; do not edit).

Regenerate after changing a command's docstring or the group's options, the exit codes or the commands:
``python -m orchestrator.cli.helptext > orchestrator/cli/helptext.py.new`` and move it over this file.
tests/unit/test_help_static.py fails, saying so, while this text and click's differ.
"""

TEXT = """\
Usage: gpuq [OPTIONS] COMMAND [ARGS]...

  gpuq: run ablation queues on GPU hosts, detached, checkpointed, verified.

Options:
  --debug        Show tracebacks for gpuq errors.
  -v, --verbose  Log retries, backoff and rate-limit waits on stderr (-vv: every
                 request).
  --version      Show the version and exit.
  -h, --help     Show this message and exit.

Commands:
  budget      Show or set SWEEP's spending cap.
  cancel      Cancel JOBs (names, ids, prefixes or SWEEP:NAME), every...
  completion  Print the shell completion script for SHELL; job, sweep and...
  doctor      GPU preflight of HOSTS (default: every registered host):...
  down        Terminate rented HOSTS (irreversible: their disks go too).
  explain     Why each attempt of JOB ended as it did (a name, id, prefix...
  hosts       Register, list, inspect and forget SSH hosts.
  logs        Print the log of JOB's latest attempt (a name, id, prefix >=...
  offers      List what the configured providers (those with an API key)...
  patrol      Run one patrol tick: probe every host once, apply the rules,...
  pull        Bring finished jobs' results home to...
  reap        Find processes that hold a GPU on HOST without nvidia-smi...
  report      Per cell (jobs that differ only by seed): mean, std and 95 %...
  results     One row per job: state, final and best metrics.
  resume      Continue every preempted or lost job from its newest verified...
  status      Probe every host, reconcile the ledger and show hosts, jobs...
  submit      Validate QUEUE, record it in the ledger and start its jobs.
  up          Rent machines, wait until each answers SSH, register them...
  wait        Block until every job of the sweep has ended; exit 1 if any...
  watch       Patrol until the sweep (default: every sweep) is done, one...

  Exit codes:
      0  ok
      1  a job or host failed
      2  usage, config or queue error (nothing was written)
      3  health check failed (doctor)
      4  timeout (wait --timeout)
    130  interrupted
"""


def render() -> str:
    """The help text click prints today for ``gpuq --help`` on an 80-column terminal."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    return str(CliRunner().invoke(cli, ["--help"], prog_name="gpuq", env={"COLUMNS": "80"}).output)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    text = Path(__file__).read_text()
    head, _, tail = text.partition('TEXT = """\\\n')
    _, _, tail = tail.partition('"""\n')
    sys.stdout.write(head + 'TEXT = """\\\n' + render() + '"""\n' + tail)
