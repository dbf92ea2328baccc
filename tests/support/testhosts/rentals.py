"""What a cloud backend (tests/support/fakecloud/netns_backend.py) does to a host between rentals."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable

from tests.support.testhosts.host import SSHD_COMMS, TestHost
from tests.support.testhosts.procs import _atomic_write, _kill, pid_ns, proc_stat


class HostRentals:
    """``HostFarm``'s disks, keys and workload between rentals."""

    @property
    def torn_down(self) -> bool:
        """``teardown`` has run: nothing may boot a host of this farm any more."""
        return self._down

    def is_up(self, i: int) -> bool:
        """Host i's PID 1 is running (it may still be starting sshd)."""
        return self.hosts[i].init_alive()

    def workload_pids(self, i: int, keep: Iterable[str] = ("init", "sshd")) -> list[int]:
        """Root-namespace pids of host i's processes except those named in ``keep``: ``"init"`` (PID 1)
        and ``"sshd"`` (the listener and every sshd process below it; the commands its sessions run
        are workload)."""
        return sorted(self._workload(i, keep))

    def signal_workload(self, i: int, sig: int, keep: Iterable[str] = ("init", "sshd")) -> list[int]:
        """Send ``sig`` to every workload process of host i (see ``workload_pids``), by pid checked
        against its start time and PID namespace; returns the pids signalled."""
        ns = self.hosts[i].pidns
        sent = []
        for p, start in sorted(self._workload(i, keep).items()):
            st = proc_stat(p)
            if st is not None and st[2] == start and pid_ns(p) == ns:
                _kill(p, sig)
                sent.append(p)
        return sent

    def wipe_root(self, i: int, authorized_keys: Iterable[str] = ()) -> None:
        """A fresh volume disk: host i's /root emptied, leaving only ``.ssh/authorized_keys`` with the
        farm's client key (and ``authorized_keys``, public key lines).  The host must be down (its
        interpreter is bound below /root when it lives there)."""
        h = self._down_host(i, "wipe_root")
        shutil.rmtree(h.root, ignore_errors=True)
        h.root.mkdir(mode=0o700)
        h.root.chmod(0o700)
        (h.root / ".ssh").mkdir(mode=0o700)
        keys = [self.client_key.with_suffix(".pub").read_text().strip(), *(k.strip() for k in authorized_keys)]
        (h.root / ".ssh" / "authorized_keys").write_text("".join(k + "\n" for k in keys if k))

    def wipe_tmp(self, i: int) -> None:
        """A fresh container disk: host i's /tmp emptied (``boot`` does this too).  The host must be down."""
        h = self._down_host(i, "wipe_tmp")
        shutil.rmtree(h.tmp, ignore_errors=True)
        h.tmp.mkdir(mode=0o1777)
        h.tmp.chmod(0o1777)

    def renew_host_key(self, i: int) -> str:
        """A new host key for host i, up or down (up: ``regenerate_host_key``, which restarts sshd).
        ``known_hosts`` keeps the old pin.  Returns the new line."""
        h = self.hosts[i]
        if h.init_alive():
            return self.regenerate_host_key(i)
        proc = self._keygen(h.host_key, f"root@{h.name}")
        if proc.wait(timeout=30) != 0:
            raise RuntimeError(f"ssh-keygen failed: {proc.stderr.read().decode() if proc.stderr else ''}")
        h.host_key_line = self._read_host_key_line(h)
        self._save()
        return h.host_key_line

    def set_gpu_devices(self, i: int, count: int) -> None:
        """How many fake GPU nodes (/dev/nvidia0..) host i gets from its next ``boot`` on.  (What its
        nvidia-smi lists is the GPU state file: ``write_gpu_state``.)"""
        spec_path = self.hosts[i].root_dir / "init.json"
        spec = json.loads(spec_path.read_text())
        spec["gpu_devices"] = int(count)
        _atomic_write(spec_path, json.dumps(spec, indent=1))

    def _down_host(self, i: int, what: str) -> TestHost:
        h = self.hosts[i]
        if h.init_alive():
            raise RuntimeError(f"{what}({i}): {h.name} is running; preempt it first")
        return h

    def _workload(self, i: int, keep: Iterable[str]) -> dict[int, int]:
        """pid -> start time of host i's processes outside ``keep`` (see ``workload_pids``)."""
        keep = set(keep)
        unknown = keep - {"init", "sshd"}
        if unknown:
            raise ValueError(f"keep: unknown {sorted(unknown)} (known: init, sshd)")
        h = self.hosts[i]
        table = self._host_table(i)
        kept: set[int] = set()
        if "init" in keep:
            kept.add(h.init_pid)
        if "sshd" in keep:
            frontier = [p for p, (pp, comm, _s) in table.items() if pp == h.init_pid and comm in SSHD_COMMS]
            kept.update(frontier)
            while frontier:
                parent = frontier.pop()
                for p, (pp, comm, _s) in table.items():
                    if pp == parent and comm in SSHD_COMMS and p not in kept:
                        kept.add(p)
                        frontier.append(p)
        return {p: st[2] for p, st in table.items() if p not in kept}
