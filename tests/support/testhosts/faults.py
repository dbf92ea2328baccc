"""Faults a test does to a running host (sshd stopped, preemption, cut links, new keys) and its processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.testhosts.building import _connect_state
from tests.support.testhosts.host import SSHD_COMMS, TestHost
from tests.support.testhosts.procs import _holding_pidns, _kill, _run, _wait, all_pids, pid_ns, proc_stat


class HostFaults:
    """``HostFarm``'s faults, process tables and the reaping of a host's PID namespace."""

    def stop_sshd(self, i: int) -> None:
        """"systemctl stop ssh": the listener and its sessions die; the host and detached processes stay."""
        self._signal_init(i, signal.SIGUSR1)
        h = self.hosts[i]
        if not _wait(lambda: _connect_state(h.address, h.port) == "refused", 10):
            raise RuntimeError(f"{h.name}: sshd still accepting after stop")

    def start_sshd(self, i: int) -> None:
        self._signal_init(i, signal.SIGUSR2)
        self._wait_ready([self.hosts[i]])

    def preempt(self, i: int) -> None:
        """SIGKILL the host's PID 1: the kernel kills every process of the host.  The netns stays."""
        h = self.hosts[i]
        with _holding_pidns(h):
            if h.init_alive():
                _kill(h.init_pid, signal.SIGKILL)
            if left := self._reap(h, timeout=10):
                raise RuntimeError(f"{h.name}: processes survived the preemption: {left}")
        h.init_pid = h.init_start = h.launcher_pid = 0
        # the kernel hands a dead namespace's inode number to the next new one (another worker's host):
        # a down host has no PID namespace, so host_pids/signal_workload never reach a stranger's processes
        h.pidns = ""
        self._save()

    def boot(self, i: int, *, wipe_tmp: bool = True) -> None:
        """Start a preempted host again (same address, key and /root; a fresh /tmp unless told otherwise)."""
        h = self.hosts[i]
        if h.init_alive():
            raise RuntimeError(f"{h.name} is running")
        if wipe_tmp:
            shutil.rmtree(h.tmp, ignore_errors=True)
            h.tmp.mkdir(mode=0o1777)
            h.tmp.chmod(0o1777)
        with contextlib.suppress(FileNotFoundError):
            (h.run_dir / "sshd.pid").unlink()
        self._launch(h)
        self._find_init(h)
        self._save()
        self._wait_ready([h])

    def ssh_sessions(self, i: int) -> list[int]:
        """The pids of host i's established SSH session processes (sshd's children and theirs; not the
        listener itself, nor the commands the sessions run)."""
        h = self.hosts[i]
        table = self._host_table(i)
        listeners = [p for p, (pp, comm, _s) in table.items() if pp == h.init_pid and comm in SSHD_COMMS]
        sessions: list[int] = []
        frontier = list(listeners)
        while frontier:
            parent = frontier.pop()
            for p, (pp, comm, _s) in table.items():
                if pp == parent and comm in SSHD_COMMS:
                    sessions.append(p)
                    frontier.append(p)
        return sessions

    def cut_connections(self, i: int) -> int:
        """Kill every established SSH session process of host i (TCP drops); sshd keeps listening and
        the sessions' commands and detached processes keep running.  Returns how many were killed."""
        table = self._host_table(i)
        victims = self.ssh_sessions(i)
        for p in victims:
            if (st := proc_stat(p)) is not None and st[2] == table[p][2]:
                _kill(p, signal.SIGKILL)
        _wait(lambda: all(proc_stat(p) is None for p in victims), 5)
        return len(victims)

    def set_link(self, i: int, up: bool) -> None:
        """Network partition: the host's side of the link goes down (packets vanish: timeouts, not
        refusals), or comes back up."""
        h = self.hosts[i]
        _run(["ip", "-n", h.netns, "link", "set", "eth0", "up" if up else "down"])
        if up:
            _run(["ip", "neigh", "flush", "dev", h.veth], check=False)  # forget the failed ARP entry
            if h.init_alive() and not _wait(lambda: _connect_state(h.address, h.port) != "timeout", 10):
                raise RuntimeError(f"{h.name}: still unreachable after the link came back")

    def regenerate_host_key(self, i: int) -> str:
        """A new host key and a restarted sshd; ``known_hosts`` keeps the old pin.  Returns the new line."""
        h = self.hosts[i]
        self.stop_sshd(i)
        proc = self._keygen(h.host_key, f"root@{h.name}")
        if proc.wait(timeout=30) != 0:
            raise RuntimeError("ssh-keygen failed")
        h.host_key_line = self._read_host_key_line(h)
        self._save()
        self.start_sshd(i)
        return h.host_key_line

    def set_sshd_extra(self, i: int, text: str) -> None:
        """Replace the extra lines of host i's sshd_config (e.g. ``SetEnv SLURM_CONF=/x/slurm.conf``);
        a running sshd restarts to read them (its sessions drop; detached processes stay)."""
        h = self.hosts[i]
        h.sshd_extra = text
        self._write_sshd_config(h)
        self._save()
        if h.init_alive():
            self.stop_sshd(i)
            self.start_sshd(i)

    def attach_dir(self, path: Path | str) -> None:
        """Remove ``path`` (a directory outside the farm, e.g. a cluster's shared dir under /var/tmp)
        when the farm is torn down, also by ``scripts/testhosts.py down`` after a crash."""
        p = str(Path(path).resolve())
        if p in ("/", "/var/tmp", "/tmp", str(self.base_dir)) or not p.startswith("/"):
            raise ValueError(f"attach_dir: refusing {p}")
        if p not in self.attached_dirs:
            self.attached_dirs.append(p)
            if self.hosts:
                self._save()

    # ------------------------------------------------------------------------------------- processes

    def host_pids(self, i: int) -> list[int]:
        """Root-namespace pids of every live process in host i's PID namespace."""
        ns = self.hosts[i].pidns
        if not ns:
            return []
        return sorted(p for p in all_pids() if pid_ns(p) == ns and proc_stat(p) is not None)

    def host_processes(self, i: int) -> dict[int, str]:
        """Root-namespace pid -> command line, for every process of host i."""
        out = {}
        for p in self.host_pids(i):
            with contextlib.suppress(OSError):
                out[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return out

    # ------------------------------------------------------------------------------------- internals

    def _host_table(self, i: int) -> dict[int, tuple[int, str, int]]:
        table = {}
        for p in self.host_pids(i):
            st = proc_stat(p)
            if st is not None:
                table[p] = st
        return table

    def _signal_init(self, i: int, sig: int) -> None:
        h = self.hosts[i]
        if not h.init_alive():
            raise RuntimeError(f"{h.name} is not running")
        os.kill(h.init_pid, sig)

    def _reap(self, h: TestHost, timeout: float) -> list[int]:
        """Wait for host h's PID 1 (SIGKILLed by the caller) and then every other process of the host to be
        gone; returns those still left.  The caller holds the PID namespace (`_holding_pidns`): the kernel
        hands a freed namespace's inode number to the next new one, and another worker's host must never
        be taken for this one."""
        proc = self._launchers.pop(h.index, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        _wait(lambda: not h.init_alive(), timeout)
        if not h.pidns:
            return []

        def left() -> list[int]:
            return [p for p in all_pids() if pid_ns(p) == h.pidns]

        def emptied() -> bool:
            # the kernel SIGKILLs the rest of the namespace when PID 1 dies, but on a loaded machine a
            # process can take a while to get there (blocked in I/O): kill again and keep waiting
            pids = left()
            for p in pids:
                _kill(p, signal.SIGKILL)
            return not pids

        _wait(emptied, max(timeout, 60), 0.05)
        return left()
