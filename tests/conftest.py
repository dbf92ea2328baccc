"""Shared fixtures: a private GPUQ_HOME per test, and cleanup of every agent a test started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support import bytecode, warmcli

if TYPE_CHECKING:
    from orchestrator.context import Context

pytest_plugins = ["tests.support.pullworld"]  # the `world` fixture of the pull tests


ROOT = Path(__file__).resolve().parents[1]

# The suite starts hundreds of `gpuq` processes.  Where the environment forbids writing bytecode (some CI
# images set PYTHONDONTWRITEBYTECODE), every one of them would compile the controller's modules again
# (about a tenth of each command's CPU).  The suite lets Python cache it, as on a user's machine.  What
# runs from a bundle is unaffected: the agent sets sys.dont_write_bytecode itself and a trainer's
# environment gets PYTHONDONTWRITEBYTECODE=1 from the wrapper (tests/integration/test_agent.py).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The trainers never write bytecode, so the libraries they import beyond what the suite's own processes
# import (torch's dynamo and launcher, sympy, transformers) are compiled once, in the background, before
# the first test: without it, every rank compiled them again (tests/support/bytecode.py).
_WARMER = pytest.StashKey[bytecode.Warmer]()


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's first process: xdist's controller, or the only one
        config.stash[_WARMER] = bytecode.Warmer().start()


def pytest_unconfigure(config: pytest.Config) -> None:
    warmer = config.stash.get(_WARMER, None)
    if warmer is not None:
        problem = warmer.finish()
        if problem:
            print(f"tests/conftest.py: {problem}", file=sys.stderr)


# The suite runs with `-n 4 --dist loadgroup` (README).  Every test is a unit of work of its own: with
# pytest 9.2 xdist's `xdist_group` mark no longer groups anything (its worker stamps the group onto the
# node id the old way, which pytest ignores since node ids are structured: pytest-dev/pytest-xdist#1386),
# so the suite uses none.  A module-scoped fixture is therefore built once per worker that runs one of
# the module's tests: a farm of namespace hosts (about 0.5 s) or a Slurm cluster (about 3.5 s) may be;
# a reference run that costs a minute of CPU is built once per run instead (tests/support/once.py).
# xdist hands each worker the next test in collection order when it has two or fewer left, so the
# slowest tests go first (measured with `--durations`, slowest module first) and the many short unit
# tests fill the end, instead of one worker finishing a long tail while the others idle.
SLOW_FIRST = (
    "tests/integration/test_multinode_ssh.py", "tests/integration/test_example_queue.py",
    "tests/integration/test_ssh_hosts.py", "tests/integration/test_hostile_host.py",
    "tests/integration/test_multihost.py", "tests/integration/test_cli_pull.py",
    "tests/integration/test_cloud.py",
    "tests/integration/test_slurm_backend.py", "tests/integration/test_cli.py",
    "tests/integration/test_dashboard_tmux.py", "tests/integration/test_concurrent_commands.py",
    "tests/integration/test_ssh_work_stealing.py", "tests/integration/test_cli_hosts.py",
    "tests/integration/test_own_project_hosts.py", "tests/integration/test_hf_trainer.py",
    "tests/integration/test_lightning_cli.py", "tests/integration/test_stop_agent.py",
    "tests/integration/test_peer_death.py", "tests/integration/test_trainer_metrics_e2e.py",
    "tests/integration/test_data_sync.py", "tests/integration/test_smoke.py",
    "tests/integration/test_honest_numbers.py", "tests/integration/test_mixed_farm.py",
    "tests/integration/test_patrol.py",
    "tests/integration/test_payload_sigterm.py", "tests/integration/test_payload_resume.py",
    "tests/integration/test_kill_resume.py", "tests/integration/test_cli_cloud_errors.py",
    "tests/integration/test_smoke.py", "tests/integration/test_data_sync.py",
)
SLOW_UNITS_FIRST = ("tests/unit/test_static.py",)  # mypy --strict, ruff, lint-imports, vermin: CPU for minutes


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    grouped = [item.nodeid for item in items if item.get_closest_marker("xdist_group")]
    if grouped:  # it would be silently ignored: say so rather than run "grouped" tests apart
        raise pytest.UsageError(f"xdist_group no longer groups tests (pytest-dev/pytest-xdist#1386); build a "
                                f"costly shared value with tests/support/once.py instead: {grouped[0]}")

    def order(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in SLOW_FIRST:
            return 0, SLOW_FIRST.index(path)
        if path.startswith("tests/integration/"):
            return 1, 0
        return (2, 0) if path in SLOW_UNITS_FIRST else (3, 0)

    items.sort(key=order)  # stable: a module keeps its own order


def kill_recorded_groups(local: Path) -> None:
    """Kill the agent and every attempt group recorded under a host root, by recorded pgid."""
    records: list[dict[str, object]] = []
    pid_file = local / "agent.pid"
    if pid_file.is_file():
        with contextlib.suppress(ValueError):
            records.append(json.loads(pid_file.read_text()))
    for pgid_file in local.glob("jobs/*/attempts/*/pgid"):
        with contextlib.suppress(ValueError):
            records.append(json.loads(pgid_file.read_text()))
    for rec in records:
        pgid = rec.get("pgid") or rec.get("pid")
        if isinstance(pgid, int) and pgid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def gpuq_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    monkeypatch.setenv("GPUQ_HOME", str(home))
    yield home
    kill_recorded_groups(home / "local")


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """A webhook on this machine (GPUQ_WEBHOOK_URL points at it); what it received."""
    from tests.support.webhook import webhook

    with webhook() as (url, received):
        monkeypatch.setenv("GPUQ_WEBHOOK_URL", url)
        yield received


@pytest.fixture
def ctx(gpuq_home: Path) -> Iterator[Context]:
    """The context of a command run with ``gpuq_home`` (a test module may define its own ``ctx``)."""
    from orchestrator.context import open_context

    context = open_context()
    try:
        yield context
    finally:
        context.close()


def run_gpuq(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a process of its own, as a user would: forked from a warm interpreter that has
    imported the controller once (tests/support/warmcli.py), or exec'd with GPUQ_TEST_EXEC_CLI=1."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return warmcli.run(list(args), full_env, cwd or ROOT, timeout)


def wait_for(predicate: object, timeout: float = 60.0, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(interval)
    return False
