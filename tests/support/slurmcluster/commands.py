"""Slurm's commands (sbatch, squeue, scontrol, scancel, sinfo) run on the login node over SSH, parsed."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# squeue's fields, in order ("|" separated; the name last, it may hold anything)
SQUEUE_FORMAT = "%i|%T|%r|%N|%M|%l|%j"
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})


@dataclass
class Job:
    """One line of ``squeue --states=all``."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, NODE_FAIL, ... (squeue's %T)
    reason: str  # squeue's %r: "None", "Resources", "BeginTime", "NodeDown", ...
    nodes: str  # %N: the node list ("" while pending)
    time_used: str  # %M
    time_limit: str  # %l
    name: str  # %j

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


class SlurmCommands:
    """``SlurmCluster``'s commands on the login node, and the waits on what they show."""

    def ssh(self, i: int, cmd: str | Sequence[str], *, timeout: float = 30,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on farm host i over SSH (a string: through ``sh -c``); SLURM_CONF is set there."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self.farm.ssh(i, *argv, timeout=timeout, input=input)

    def ssh_login(self, cmd: str | Sequence[str], *, timeout: float = 30,
                  input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on the login node over SSH, as gpuq would (never raises on failure)."""
        return self.ssh(self.login, cmd, timeout=timeout, input=input)

    def check_login(self, cmd: str | Sequence[str], *, timeout: float = 30, input: str | None = None) -> str:
        """``ssh_login`` that raises (with the daemons' log tails) unless the command exits 0; its stdout."""
        res = self.ssh_login(cmd, timeout=timeout, input=input)
        if res.returncode != 0:
            raise RuntimeError(f"on the login node: {cmd!r} failed ({res.returncode}):\n{res.stdout}{res.stderr}\n"
                               f"{self.log_tails()}")
        return res.stdout

    def sbatch(self, *args: str, wrap: str | None = None, script: str | None = None) -> str:
        """Submit a batch job from the login node; returns its job id.  The job runs in ``shared_dir``
        (``--chdir``) unless ``args`` say otherwise, so ``slurm-<id>.out`` lands there."""
        argv = ["sbatch", "--parsable"]
        if not any(a == "-D" or a.startswith("--chdir") for a in args):
            argv.append(f"--chdir={self.shared_dir}")
        argv += args
        if wrap is not None:
            argv.append(f"--wrap={wrap}")
        out = self.check_login(argv, input=script)
        return out.strip().split(";")[0]

    def squeue(self, *job_ids: str | int, states: str = "all") -> list[Job]:
        """``squeue --states=<states>`` (all: ended jobs too, until MinJobAge) parsed.  Asking for job ids
        of which none is known fails (see ``job``)."""
        argv = ["squeue", "-h", f"--states={states}", "-o", SQUEUE_FORMAT]
        if job_ids:
            argv.append("--jobs=" + ",".join(str(j) for j in job_ids))
        jobs = []
        for line in self.check_login(argv).splitlines():
            if line.strip():
                f = line.split("|", 6)
                jobs.append(Job(*f))
        return jobs

    def job(self, job_id: str | int) -> Job | None:
        """The job as squeue shows it, or None when squeue no longer knows it."""
        res = self.ssh_login(["squeue", "-h", "--states=all", "-o", SQUEUE_FORMAT, f"--jobs={job_id}"])
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return None
            raise RuntimeError(f"squeue failed ({res.returncode}): {res.stderr}\n{self.log_tails()}")
        for line in res.stdout.splitlines():
            f = line.split("|", 6)
            if f[0] == str(job_id):
                return Job(*f)
        return None

    def squeue_json(self) -> list[dict[str, Any]]:
        """``squeue --json``'s ``jobs`` (22.05: openapi/v0.0.38 objects; every job slurmctld still knows,
        ended ones included: ``job_state``, ``state_reason``, ``exit_code``, ``restart_cnt``, ...)."""
        jobs: list[dict[str, Any]] = json.loads(self.check_login(["squeue", "--json"]))["jobs"]
        return jobs

    def show_job(self, job_id: str | int) -> dict[str, str]:
        """``scontrol show job -o`` as key -> value (Restarts, BatchHost, ExitCode, Reason, ...)."""
        out = self.check_login(["scontrol", "show", "job", "-o", str(job_id)])
        fields: dict[str, str] = {}
        for tok in shlex.split(out.strip()):
            key, sep, value = tok.partition("=")
            if sep:
                fields[key] = value
        return fields

    def wait_job(self, job_id: str | int, states: Iterable[str], timeout: float = 30) -> Job:
        """Wait until the job's state is one of ``states``; raises (with log tails) after ``timeout``."""
        wanted = set(states)
        last: list[Job | None] = [None]

        def check() -> Job | None:
            last[0] = self.job(job_id)
            return last[0] if last[0] is not None and last[0].state in wanted else None

        job = self.wait_for(check, timeout)
        if job is None:
            raise TimeoutError(f"job {job_id}: not {sorted(wanted)} after {timeout}s (last: {last[0]})\n"
                               f"{self.log_tails()}")
        return job

    def scancel(self, job_id: str | int, *args: str) -> None:
        self.check_login(["scancel", *args, str(job_id)])

    def requeue(self, job_id: str | int) -> None:
        """``scontrol requeue``: the job goes back to PENDING and runs again from the start."""
        self.check_login(["scontrol", "requeue", str(job_id)])

    def node_states(self) -> dict[str, str]:
        """``sinfo -N``: node name -> state (idle, alloc, mix, down*, idle*, drain, ...)."""
        out = self.check_login(["sinfo", "-h", "-N", "-o", "%N %t"])
        states = {}
        for line in out.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def wait_nodes(self, nodes: Iterable[str | int], state: str, timeout: float = 30) -> None:
        """Wait until ``sinfo`` shows each node in ``state`` (e.g. "idle", "down", "down*")."""
        names = [n if isinstance(n, str) else self.node_name(n) for n in nodes]
        seen: dict[str, str] = {}

        def check() -> bool:
            res = self.ssh_login(["sinfo", "-h", "-N", "-o", "%N %t"])
            if res.returncode != 0:
                seen["sinfo"] = (res.stderr or res.stdout).strip()
                return False
            seen.clear()
            for line in res.stdout.splitlines():
                name, _, st = line.partition(" ")
                seen[name] = st.strip()
            return all(seen.get(n) == state for n in names)

        if not self.wait_for(check, timeout, interval=0.2):
            raise TimeoutError(f"nodes {names} not {state} after {timeout}s (sinfo: {seen})\n{self.log_tails()}")

    @staticmethod
    def wait_for(pred: Callable[[], T], timeout: float = 30, interval: float = 0.2) -> T | None:
        """Poll ``pred`` until it returns something truthy (returned); None/falsy after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() >= deadline:
                return value
            time.sleep(interval)
