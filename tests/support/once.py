"""A costly, read-only fixture value computed once per test run, however many xdist workers need it.

The suite runs in several pytest-xdist workers, and every test is a unit of work of its own (README), so
the tests of one module land on different workers and a module-scoped fixture would be built once on
each of them.  That is harmless for a farm of namespace hosts (about half a second) or a Slurm cluster
(a few seconds), but a *reference run* (a whole sweep or a training run whose weights later runs must
match) costs a minute of CPU, and the workers would compute the same one side by side.

``once(tmp_path_factory, name, build)`` runs ``build(directory)`` in the first worker that asks, under
an exclusive lock on a file in the run's shared base temp directory; the workers that ask meanwhile
wait on the lock (idle, no CPU), then get the value that worker recorded.  ``build`` writes what it
makes under ``directory`` and returns a JSON value; the tests must only read what lies there.  A build
that raises records nothing: the next worker that asks builds it again (and fails the same way).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DONE = "value.json"


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every worker of this run shares: the parent of the workers' own base temp dirs
    under xdist (``pytest-N/popen-gwK``), the base temp dir itself without it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]) -> Any:
    """The value ``build(directory)`` returned in whichever worker of this run built ``name`` first."""
    return once_in(shared_dir(tmp_path_factory) / "once", name, build)


def once_in(root: Path, name: str, build: Callable[[Path], Any]) -> Any:
    """``once`` with the shared directory given: ``root/name/`` holds what ``build`` made."""
    root.mkdir(parents=True, exist_ok=True)
    directory = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        done = directory / DONE
        if done.is_file():
            return json.loads(done.read_text())["value"]
        shutil.rmtree(directory, ignore_errors=True)  # what a failed build left
        directory.mkdir()
        value = build(directory)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps({"value": value}))
        tmp.replace(done)
        return value
