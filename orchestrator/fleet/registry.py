"""The registered hosts as Host objects: one ``Fleet`` per command, built from the ledger's rows.

One ``Fleet`` lives for one command: it hands out one Host object per host, so an
SSH connection is opened once and reused by every call of that command, and
``close()`` releases them all.  Registering a host is ``registering.py``; what gpuq's known_hosts
file says of one is ``host_keys.py``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core.config import LOCAL_HOST, Settings
from orchestrator.core.errors import HostError, UsageError
from orchestrator.hosts.base import Host
from orchestrator.hosts.local import LocalHost
from orchestrator.ledger import HostRow, Ledger

if TYPE_CHECKING:  # paramiko loads only when a command talks to an SSH host (fast `gpuq --help`), the host
    # documents' models only when one is read (`gpuq status --no-probe` reads none)
    from orchestrator.hosts.sshconnect import SSHOptions

SLURM_ON_THIS_MACHINE = "local"  # `gpuq hosts add NAME --slurm local`: gpuq itself runs on the login node


def ssh_options(settings: Settings, *, trust_new: bool = False) -> SSHOptions:
    from orchestrator.hosts.sshconnect import SSHOptions

    return SSHOptions(known_hosts=settings.home / "known_hosts", trust_new_host_key=trust_new)


def agent_flags(row: HostRow, settings: Settings) -> tuple[str, ...]:
    """Host-specific flags for the agent's ``serve`` (and ``enqueue --serve``)."""
    flags: list[str] = []
    if row.kind == "local":  # the CPU slots the plan assumes (host_capacity), also to an agent already serving
        flags += ["--cpu-slots", str(settings.local_cpu_slots or os.cpu_count() or 1)]
    if row.train_device == "cpu":
        flags += ["--train-device", "cpu"]
    if row.provider:  # a rented host keeps its own lease: 0 turns a lease it holds off (gpuq_selfstop.py)
        flags += ["--lease-timeout-s", "%g" % (settings.lease_timeout_min * 60.0)]
    return tuple(flags)


class Fleet:
    """Host objects for one command, one per host, connections reused and closed together."""

    def __init__(self, settings: Settings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        self._hosts: dict[str, Host] = {}
        self._lock = threading.Lock()

    def local(self) -> Host:
        with self._lock:
            if LOCAL_HOST not in self._hosts:
                root = self.settings.local_host_root
                host = LocalHost(root, python=self.settings.local_python)
                row = self.ledger.ensure_host(LOCAL_HOST, kind="local", root=str(root), python=host.python)
                host.agent_flags = agent_flags(row, self.settings)
                self._hosts[LOCAL_HOST] = host
            return self._hosts[LOCAL_HOST]

    def host(self, row: HostRow) -> Host:
        if row.kind == "local":
            return self.local()
        with self._lock:
            cached = self._hosts.get(row.name)
            if cached is not None:
                return cached
            if row.kind not in ("ssh", "slurm"):
                raise HostError(row.name, f"host kind {row.kind!r} is not supported by this gpuq")
            if row.kind == "slurm" and row.target == SLURM_ON_THIS_MACHINE:  # gpuq runs on the login node
                here = LocalHost(Path(row.root), name=row.name, python=row.python)
                self._hosts[row.name] = here
                return here
            from orchestrator.hosts.ssh import SSHHost
            from orchestrator.hosts.sshconfig import resolve

            endpoint = resolve(row.target, port=row.port, user=row.user, key_file=row.key_path)
            made = SSHHost(row.name, endpoint, root=row.root, python=row.python,
                           options=ssh_options(self.settings))
            made.agent_flags = agent_flags(row, self.settings)
            self._hosts[row.name] = made
            return made

    def named(self, name: str) -> Host:
        if name == LOCAL_HOST:
            return self.local()
        row = self.ledger.host(name)
        if row is None:
            raise UsageError(f'unknown host "{name}"; `gpuq hosts list` shows the registered ones')
        return self.host(row)

    def drop(self, name: str) -> None:
        """Forget (and close) the cached Host of ``name``: its endpoint changed."""
        with self._lock:
            host = self._hosts.pop(name, None)
        if host is not None:
            host.close()

    def remote_rows(self) -> list[HostRow]:
        return [row for row in self.ledger.hosts() if row.kind != "local"]

    def close(self) -> None:
        with self._lock:
            hosts, self._hosts = list(self._hosts.values()), {}
        for host in hosts:
            host.close()


# --- registering ---------------------------------------------------------------------


# --- known_hosts ---------------------------------------------------------------------


def over_ssh(row: HostRow) -> bool:
    """The host is reached over SSH: an SSH host, or a Slurm cluster's login node (not `--slurm local`)."""
    return row.kind == "ssh" or (row.kind == "slurm" and row.target != SLURM_ON_THIS_MACHINE)


