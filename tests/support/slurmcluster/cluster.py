"""``SlurmCluster``: a cluster's hosts and node names, its start and teardown, its faults and logs."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.slurmcluster.commands import SlurmCommands
from tests.support.slurmcluster.config import SlurmConfig
from tests.support.slurmcluster.daemons import SlurmDaemons, _Daemon, requirements_problem
from tests.support.testhosts import HostFarm, _kill, _tail, _wait


class SlurmCluster(SlurmCommands, SlurmConfig, SlurmDaemons):
    """slurmctld on farm host ``login``, slurmd on the ``compute`` hosts; see the package docstring.
    Its commands, configuration and daemons come from its bases (commands.py, config.py, daemons.py)."""

    def __init__(self, farm: HostFarm, *, login: int = 0, compute: Sequence[int] = (1, 2), gpus_per_node: int = 2,
                 cpus_per_node: int = 2, base: Path = Path("/var/tmp"), ctld_port: int = 6817,
                 slurmd_port: int = 6818, min_job_age: int = 600, debug: str = "info") -> None:
        if not farm.hosts or not farm.farm_id:
            raise RuntimeError("SlurmCluster needs a started farm")
        if not getattr(farm, "routed", False):
            raise RuntimeError("SlurmCluster needs a routed farm: HostFarm(..., routed=True) / host_farm(routed=True)")
        compute = tuple(compute)
        if not compute or login in compute or len(set(compute)) != len(compute):
            raise ValueError(f"login {login} and compute {compute}: distinct hosts, at least one compute host")
        for i in (login, *compute):
            if not 0 <= i < len(farm.hosts):
                raise ValueError(f"host {i} is not in the farm (it has {len(farm.hosts)})")
        if gpus_per_node > farm.gpus:
            raise ValueError(f"gpus_per_node={gpus_per_node}, but the farm's hosts have {farm.gpus} GPU nodes")
        self.farm = farm
        self.login, self.compute = login, compute
        self.gpus_per_node, self.cpus_per_node = gpus_per_node, cpus_per_node
        self.ctld_port, self.slurmd_port, self.debug = ctld_port, slurmd_port, debug
        self.min_job_age = min_job_age
        self.shared_dir = Path(base).resolve() / f"gpuq-slurm-{farm.farm_id}"
        self.conf = self.shared_dir / "slurm.conf"
        self.log_dir = self.shared_dir / "log"
        self.munge_key = self.shared_dir / "munge.key"
        self.cluster_name = f"gpuq{farm.farm_id}"
        self.start_seconds = 0.0
        self._daemons: dict[tuple[str, int], _Daemon] = {}
        self._started = self._down = False

    # ------------------------------------------------------------------------------------- names

    @property
    def login_name(self) -> str:
        return self.farm.hosts[self.login].name

    @property
    def nodes(self) -> list[str]:
        """The compute nodes' names (= their hosts' names and hostnames)."""
        return [self.farm.hosts[i].name for i in self.compute]

    @property
    def ctld_log(self) -> Path:
        """slurmctld's log (``log_dir``: every daemon's; ``log_tails()``: their tails, for messages)."""
        return self.log_dir / f"slurmctld-{self.login_name}.log"

    def host_index(self, node: int | str) -> int:
        """A compute node given as farm host index or node name -> its farm host index."""
        if isinstance(node, int):
            if node not in self.compute:
                raise ValueError(f"host {node} is not a compute node of this cluster ({self.compute})")
            return node
        for i in self.compute:
            if self.farm.hosts[i].name == node:
                return i
        raise ValueError(f"{node!r} is not a compute node of this cluster ({self.nodes})")

    def node_name(self, node: int | str) -> str:
        return self.farm.hosts[self.host_index(node)].name

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 60) -> SlurmCluster:
        """Start munged everywhere, slurmctld, the slurmds; return once ``sinfo`` shows every node idle
        and the controller's scheduler has run once (it first runs ~3 s after slurmctld starts: a job
        submitted earlier waits for that), so jobs start within about a second of ``sbatch``."""
        if self._started:
            raise RuntimeError("this cluster was started already")
        problem = requirements_problem()
        if problem:
            raise RuntimeError(problem)
        self._started = True
        t0 = time.monotonic()
        atexit.register(self.teardown)
        try:
            self._prepare()
            for i in (self.login, *self.compute):
                self._start_munged(i)
            for i in (self.login, *self.compute):
                self._wait_munged(i)
            self._spawn(self.login, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            for i in self.compute:
                self._spawn(i, "slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.farm.hosts[i].name])
            self.wait_nodes(self.nodes, "idle", timeout=timeout)
            self._wait_first_schedule()
        except BaseException:
            self.teardown()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def teardown(self) -> None:
        """Idempotent: SIGKILL every daemon it started (by recorded pid + start time), remove shared_dir."""
        if self._down:
            return
        self._down = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)
        for d in self._daemons.values():
            if d.alive():
                _kill(d.pid, signal.SIGKILL)
        for d in self._daemons.values():
            _wait(lambda d=d: not d.alive(), 10)
            if d.launcher is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    d.launcher.wait(timeout=10)
        self._daemons.clear()
        shutil.rmtree(self.shared_dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # ------------------------------------------------------------------------------------- faults

    def stop_slurmd(self, node: int | str, *, jobs: bool = False) -> None:
        """SIGKILL the node's slurmd: slurmctld stops hearing from it ("alloc*"/"idle*" after ~7 s) and
        marks it DOWN ("down*", ~15-20 s after the kill); its jobs end NODE_FAIL (reason NodeDown), or
        go back to PENDING when requeueable (``--requeue``; JobRequeue=1 makes that sbatch's default).

        The jobs' processes (slurmstepd and below) keep running unless ``jobs=True`` (a crashed node:
        everything but PID 1, sshd and munged dies too).  Without ``jobs``, a restarted slurmd reports
        the stale steps, slurmctld kills them and revokes the job's credential, and a requeued job that
        it then starts on that node at once fails (FAILED, NonZeroExitCode: "Job credential revoked")."""
        i = self.host_index(node)
        d = self._daemons.get(("slurmd", i))
        if d is not None:
            self._stop(d)
        if jobs:
            keep = {x.pid for x in self._daemons.values() if x.host == i and x.alive()}
            for p in self.farm.workload_pids(i):
                if p not in keep:
                    _kill(p, signal.SIGKILL)

    def start_slurmd(self, node: int | str, *, wait: bool = True, timeout: float = 30) -> None:
        """(Re)start the node's slurmd (and its munged, when it died: after ``farm.preempt``/``boot``);
        with ``wait``, until the node is idle again (ReturnToService=2)."""
        i = self.host_index(node)
        d = self._daemons.get(("slurmd", i))
        if d is not None and d.alive():
            raise RuntimeError(f"slurmd on {self.farm.hosts[i].name} is running")
        m = self._daemons.get(("munged", i))
        if m is None or not m.alive():
            self._start_munged(i)
            self._wait_munged(i)
        self._spawn(i, "slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.farm.hosts[i].name])
        if wait:
            self.wait_nodes([self.farm.hosts[i].name], "idle", timeout=timeout)

    def daemon_pid(self, kind: str, i: int) -> int | None:
        """Root-namespace pid of the ``kind`` daemon (munged, slurmctld, slurmd) on host i, if alive."""
        d = self._daemons.get((kind, i))
        return d.pid if d is not None and d.alive() else None

    # ------------------------------------------------------------------------------------- logs

    def log_tails(self, n: int = 2500) -> str:
        """The tail of every daemon's log, for error messages."""
        parts = []
        if self.log_dir.is_dir():
            for p in sorted(self.log_dir.iterdir()):
                log = p.with_suffix(".log")
                if p.suffix == ".out" and log.exists() and log.stat().st_size:
                    continue  # the daemon's stderr before it opened its log (or a copy of it)
                text = _tail(p, n).strip()
                if text:
                    parts.append(f"--- {p.name}\n{text}")
        return "\n".join(parts) or "(no logs)"
