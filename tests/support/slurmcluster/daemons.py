"""The Slurm daemons (munged, slurmctld, slurmd): what the machine needs, and a daemon started in a host's
namespaces, recorded (cluster.json) and killed by pid and start time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from tests.support.testhosts import _atomic_write, _kill, _wait, proc_stat

SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL_HINT = "run .ci/run, or as root: apt-get install -y slurm-wlm munge"
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MUNGE_DIR = "/run/munge"  # in-host (per host: /run is private)
STATE_DIR = "/run/gpuq-slurm"  # in-host: slurmctld's StateSaveLocation, slurmd's spool, pid files


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
class _Daemon:
    kind: str  # munged, slurmctld, slurmd
    host: int
    pid: int  # root-namespace pid
    start: int  # its start time (clock ticks)
    launcher: subprocess.Popen[bytes] | None = None  # the nsenter waiting on it

    def alive(self) -> bool:
        st = proc_stat(self.pid)
        return st is not None and st[2] == self.start


class SlurmDaemons:
    """``SlurmCluster``'s daemons: munged's start and socket, a daemon's spawn and stop, cluster.json."""

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
