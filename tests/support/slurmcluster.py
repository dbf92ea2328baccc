"""A real Slurm cluster on a routed farm of test hosts (tests/support/testhosts/); needs root,
``slurm-wlm`` and ``munge`` (Debian: ``apt-get install -y slurm-wlm munge``).

    farm = HostFarm(base, 3, gpus=2, routed=True).start()
    with SlurmCluster(farm, login=0, compute=(1, 2)) as cluster:
        job = cluster.sbatch("--gres=gpu:1", wrap="nvidia-smi -L > out.txt")
        cluster.wait_job(job, {"COMPLETED"})

- **shared filesystem**: ``shared_dir`` = ``/var/tmp/gpuq-slurm-<farm id>/`` (outside the per-host
  dirs, so every host and the test process see the same files): ``slurm.conf``, ``gres.conf``,
  ``munge.key`` (0400), ``log/`` (every daemon's log) and ``cluster.json`` (the daemons' pids).  The
  farm removes it at teardown too (``HostFarm.attach_dir``), also by ``scripts/testhosts.py down``.
- **munge**: one generated key; one ``munged --foreground --force`` per host, socket at the default
  ``/run/munge/munge.socket.2`` (/run is per host), seed and pid files there too.
- **slurmctld** on the login host, **slurmd** on each compute host (``NodeName`` = the host's name =
  its hostname, ``NodeAddr`` = its address); state and spool dirs in the host's private /run.  No
  cgroups (proctrack/linuxproc, task/none), no accounting (``sacct`` does not work), select/cons_tres
  with CR_CPU, GRES ``gpu:<gpus_per_node>`` over the host's fake /dev/nvidia0.. nodes (Slurm sets
  CUDA_VISIBLE_DEVICES).  Each host has its own network namespace, so the standard ports
  (6817/6818) never collide with a cluster of another pytest-xdist worker.
- **clients**: every host's sshd gets ``SetEnv SLURM_CONF=<shared_dir>/slurm.conf``, so ``sbatch``,
  ``squeue``, ``scancel``, ``sinfo``, ``scontrol`` run over SSH as plain commands find the cluster;
  /etc/slurm and /etc/munge are never written.

Timings (22.05, this config): start ~3.3 s (nodes idle after ~0.4 s, then the scheduler's first
pass); sbatch -> COMPLETED of a trivial job ~1 s; ``scontrol requeue`` -> running again ~6-7 s (a
requeued job is held PENDING/BeginTime for cred_expire+1 s: ``AuthInfo=cred_expire=5``, default 120);
a killed slurmd -> NODE_FAIL ~15-20 s.  Slurm's smallest time limit is 1 minute and slurmctld checks
limits every 30 s: ``scontrol update JobId=N EndTime=now`` on a running job gives TIMEOUT within 30 s.

Daemons are started inside a host's namespaces with ``nsenter`` (into its PID 1's mount, UTS, IPC,
network and PID namespaces), in the foreground; they are killed by recorded pid, checked against
its start time.  A host's PID 1 dying (``farm.preempt``, farm teardown) kills them too.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.support.testhosts import HostFarm, _atomic_write, _kill, _tail, _wait, proc_stat

T = TypeVar("T")

SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL_HINT = "run .ci/run, or as root: apt-get install -y slurm-wlm munge"
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MUNGE_DIR = "/run/munge"  # in-host (per host: /run is private)
STATE_DIR = "/run/gpuq-slurm"  # in-host: slurmctld's StateSaveLocation, slurmd's spool, pid files
# squeue's fields, in order ("|" separated; the name last, it may hold anything)
SQUEUE_FORMAT = "%i|%T|%r|%N|%M|%l|%j"
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})


def requirements_problem() -> str | None:
    """None when this machine can run a Slurm cluster (the farm's needs aside); else what is missing."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root"
    missing = [b for b in (*SLURM_BINARIES, "munged", "nsenter") if _which(b) is None]
    if missing:
        return f"the Slurm test cluster needs {', '.join(missing)}: {INSTALL_HINT}"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


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


@dataclass
class _Daemon:
    kind: str  # munged, slurmctld, slurmd
    host: int
    pid: int  # root-namespace pid
    start: int  # its start time (clock ticks)
    launcher: subprocess.Popen[bytes] | None = None  # the nsenter waiting on it

    def alive(self) -> bool:
        st = proc_stat(self.pid)
        return st is not None and st[2] == self.start


class SlurmCluster:
    """slurmctld on farm host ``login``, slurmd on the ``compute`` hosts; see the module docstring."""

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

    # ------------------------------------------------------------------------------------- commands

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

    # ------------------------------------------------------------------------------------- internals

    def _prepare(self) -> None:
        if self.shared_dir.exists():  # a dead farm's with the same id: farm ids are unique among live farms
            shutil.rmtree(self.shared_dir)
        self.shared_dir.mkdir(mode=0o755, parents=True)
        self.shared_dir.chmod(0o755)
        self.farm.attach_dir(self.shared_dir)
        self.log_dir.mkdir(mode=0o755)
        fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        for i in (self.login, *self.compute):
            run = self.farm.hosts[i].run_dir
            for sub in ("munge", "gpuq-slurm", "gpuq-slurm/ctld", "gpuq-slurm/spool"):
                (run / sub).mkdir(mode=0o755, exist_ok=True)
                (run / sub).chmod(0o755)
        _atomic_write(self.conf, self._slurm_conf())
        _atomic_write(self.shared_dir / "gres.conf", self._gres_conf())
        # slurmd 22.05 always loads a cgroup plugin; v1's does nothing until a cgroup plugin (proctrack,
        # task, jobacct) uses it, and none does here.  (autodetect fails where /sys/fs/cgroup is odd.)
        _atomic_write(self.shared_dir / "cgroup.conf", "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        for i in (self.login, *self.compute):
            h = self.farm.hosts[i]
            extra = _with_setenv(h.sshd_extra, "SLURM_CONF", str(self.conf))
            if extra != h.sshd_extra:
                self.farm.set_sshd_extra(i, extra)

    def _slurm_conf(self) -> str:
        login = self.farm.hosts[self.login]
        lines = [
            f"# gpuq test cluster on farm {self.farm.farm_id} (tests/support/slurmcluster.py)",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={login.name}({login.address})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "AuthInfo=cred_expire=5",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            f"StateSaveLocation={STATE_DIR}/ctld",
            f"SlurmdSpoolDir={STATE_DIR}/spool",
            f"SlurmctldPidFile={STATE_DIR}/slurmctld.pid",
            f"SlurmdPidFile={STATE_DIR}/slurmd.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld-{login.name}.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            f"SlurmctldDebug={self.debug}",
            f"SlurmdDebug={self.debug}",
            "JobRequeue=1",
            f"MinJobAge={self.min_job_age}",
            "SlurmdTimeout=10",
            "SlurmctldTimeout=10",
            "ReturnToService=2",
            "KillWait=5",
            "MessageTimeout=3",
            "TCPTimeout=2",
            "BatchStartTimeout=10",
            "InactiveLimit=0",
            "Waittime=0",
            "CompleteWait=0",
        ]
        for i in self.compute:
            h = self.farm.hosts[i]
            gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
            lines.append(f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs={self.cpus_per_node}"
                         f" Sockets=1 CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 RealMemory=1024{gres}"
                         " State=UNKNOWN")
        lines.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _gres_conf(self) -> str:
        lines = ["AutoDetect=off"]
        if self.gpus_per_node:
            last = self.gpus_per_node - 1
            files = "/dev/nvidia0" if last == 0 else f"/dev/nvidia[0-{last}]"
            lines += [f"NodeName={self.farm.hosts[i].name} Name=gpu File={files}" for i in self.compute]
        return "\n".join(lines) + "\n"

    def _wait_first_schedule(self, timeout: float = 10) -> None:
        """slurmctld logs its SchedulerParameters when its main scheduler first runs (22.05); no such
        line after ``timeout`` (another version) is fine: jobs then may wait a few seconds at first."""
        def scheduled() -> bool:
            try:
                return "SchedulerParameters=" in self.ctld_log.read_text(errors="replace")
            except OSError:
                return False

        _wait(scheduled, timeout, 0.05)

    def _start_munged(self, i: int) -> None:
        h = self.farm.hosts[i]
        (h.run_dir / "munge" / "munge.socket.2").unlink(missing_ok=True)
        self._spawn(i, "munged", ["munged", "--foreground", "--force", f"--key-file={self.munge_key}",
                                  f"--socket={MUNGE_DIR}/munge.socket.2", f"--pid-file={MUNGE_DIR}/munged.pid",
                                  f"--seed-file={MUNGE_DIR}/munged.seed",
                                  f"--log-file={self.log_dir}/munged-{h.name}.log", f"--origin={h.address}"])

    def _wait_munged(self, i: int) -> None:
        h = self.farm.hosts[i]
        d = self._daemons[("munged", i)]
        sock = h.run_dir / "munge" / "munge.socket.2"
        if not _wait(lambda: sock.exists() or not d.alive(), 10):
            raise RuntimeError(f"{h.name}: munged made no socket in 10 s\n{self.log_tails()}")
        if not d.alive():
            raise RuntimeError(f"{h.name}: munged died\n{self.log_tails()}")

    def _spawn(self, i: int, kind: str, argv: list[str]) -> _Daemon:
        """Start ``argv`` (a foreground daemon) in farm host i's namespaces; record its pid + start time."""
        h = self.farm.hosts[i]
        if not h.init_alive():
            raise RuntimeError(f"{h.name} is not running")
        env = {"PATH": SBIN_PATH, "HOME": "/root", "LANG": "C", "SLURM_CONF": str(self.conf)}
        nsenter = ["nsenter", f"--target={h.init_pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]
        with open(self.log_dir / f"{kind}-{h.name}.out", "ab") as out:
            proc = subprocess.Popen([*nsenter, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                    cwd="/", start_new_session=True, close_fds=True)
        found: list[tuple[int, int]] = []

        def look() -> bool:
            for p in _children(proc.pid):
                st = proc_stat(p)
                if st is not None and st[1] == kind[:15]:
                    found.append((p, st[2]))
                    return True
            return proc.poll() is not None

        _wait(look, 10, 0.005)
        if not found:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
            raise RuntimeError(f"{h.name}: {kind} did not start (nsenter: {proc.poll()})\n{self.log_tails()}")
        d = _Daemon(kind, i, found[0][0], found[0][1], proc)
        old = self._daemons.get((kind, i))
        if old is not None and old.launcher is not None:
            old.launcher.poll()  # reap it, if it is gone (a preempted host's)
        self._daemons[(kind, i)] = d
        self._save()
        return d

    def _stop(self, d: _Daemon) -> None:
        if d.alive():
            _kill(d.pid, signal.SIGKILL)
        if not _wait(lambda: not d.alive(), 10):
            raise RuntimeError(f"{d.kind} ({d.pid}) on {self.farm.hosts[d.host].name} survived SIGKILL")
        if d.launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.launcher.wait(timeout=5)

    def _save(self) -> None:
        data: dict[str, Any] = {
            "farm_id": self.farm.farm_id, "conf": str(self.conf), "login": self.login_name, "nodes": self.nodes,
            "daemons": [{"kind": d.kind, "host": self.farm.hosts[d.host].name, "pid": d.pid, "start": d.start}
                        for d in self._daemons.values()]}
        _atomic_write(self.shared_dir / "cluster.json", json.dumps(data, indent=1))


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (/proc/<pid>/task/*/children)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
    return kids


def _with_setenv(extra: str, name: str, value: str) -> str:
    """sshd_config lines ``extra`` with ``name=value`` in its SetEnv line (sshd uses the first SetEnv
    line only), replacing an earlier value of ``name``."""
    lines = extra.splitlines()
    item = f"{name}={value}"
    for k, line in enumerate(lines):
        words = shlex.split(line)
        if words and words[0].lower() == "setenv":
            kept = [w for w in words[1:] if not w.startswith(f"{name}=")]
            lines[k] = shlex.join(["SetEnv", *kept, item])
            return "\n".join(lines) + "\n"
    return "\n".join([*lines, shlex.join(["SetEnv", item])]) + "\n"
