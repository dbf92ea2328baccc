"""The start of one attempt by the serving agent (gpuq_serve.py): its launch.json, its wrapper spawned in
a session of its own (output to the attempt's job.log), the group record, and a free MASTER_PORT.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from typing import Any, Iterable

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write_json, read_json
from gpuq_base.gpuq_jobspec import JobSpec
from gpuq_base.gpuq_procs import boot_id, start_ticks

# the wrapper is spawned as `python gpuq_agent.py --root R wrap JOB N`: cancel and restart
# recovery recognise it by that argv
AGENT_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpuq_agent.py")


class StartFailed(Exception):
    """The wrapper could not be started (the message says why): the attempt fails in setup."""


def start_wrapper(lay: Layout, job_id: str, n: int, spec: JobSpec,
                  launch: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Write attempt ``n``'s launch.json (``launch``) and start its wrapper: (pid, group record)."""
    adir = lay.attempt(job_id, n)
    atomic_write_json(os.path.join(adir, P.LAUNCH_FILE), launch)
    python = spec.python or sys.executable
    argv = [python, wrapper_file(lay, spec), "--root", lay.root, "wrap", job_id, str(n)]
    try:
        logf = open(os.path.join(adir, P.JOB_LOG), "ab")  # noqa: SIM115 (handed to the child)
    except OSError as e:
        raise StartFailed(f"cannot open job.log: {e}") from e
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                cwd=lay.root, start_new_session=True, close_fds=True)
    except OSError as e:
        logf.close()
        raise StartFailed(f"cannot start wrapper with {python}: {e}") from e
    logf.close()
    proc.returncode = 0  # we reap with os.waitpid; keep Popen.__del__ from touching it
    rec = {"pgid": proc.pid, "start_ticks": start_ticks(proc.pid), "boot_id": boot_id()}
    if rec["start_ticks"] is not None and not os.path.exists(os.path.join(adir, P.PGID_FILE)):
        with contextlib.suppress(OSError):
            atomic_write_json(os.path.join(adir, P.PGID_FILE), rec)
    return proc.pid, rec


def wrapper_file(lay: Layout, spec: JobSpec) -> str:
    """The wrapper comes from the job's own bundle: a fix shipped in a new bundle applies to the
    jobs of that bundle even while an agent started from an older bundle keeps serving."""
    sha = spec.bundle_sha
    own = lay.p(P.BUNDLES_DIR, sha, P.AGENT_ENTRY) if sha and "/" not in sha and not sha.startswith(".") else ""
    return own if own and os.path.isfile(own) else AGENT_FILE


def free_port(lay: Layout, live: Iterable[tuple[str, int]]) -> int:
    """A free TCP port for MASTER_PORT that no ``live`` attempt (job id, attempt) of this root holds."""
    taken = set()
    for job_id, n in live:
        launch = read_json(lay.attempt(job_id, n, P.LAUNCH_FILE))
        if isinstance(launch, dict) and isinstance(launch.get("master_port"), int):
            taken.add(launch["master_port"])
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port
    return port
