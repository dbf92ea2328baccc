"""``HostFarm``: a farm's life (start, teardown, recorded state) and the SSH commands that reach its hosts."""

from __future__ import annotations

import atexit
import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.testhosts.building import HostBuilding, list_netns
from tests.support.testhosts.faults import HostFaults
from tests.support.testhosts.gpus import GpuControls
from tests.support.testhosts.host import H100_MIB, H100_NAME, TestHost, requirements_problem
from tests.support.testhosts.procs import _atomic_write, _holding_pidns, _kill, _run
from tests.support.testhosts.rentals import HostRentals

FarmFactory = Callable[..., "HostFarm"]  # the integration fixtures' `host_farm(n=3, gpus=2) -> HostFarm`


class HostFarm(HostBuilding, HostFaults, HostRentals, GpuControls):
    """N real OpenSSH hosts in their own namespaces; see the package docstring.  ``start()`` returns self.
    What it does to its hosts comes from its bases (building.py, faults.py, rentals.py, gpus.py)."""

    def __init__(self, base_dir: Path, n: int, gpus: int = 2, python: str = sys.executable, *,
                 gpu_name: str = H100_NAME, gpu_mem_mib: int = H100_MIB, sftp: bool = True,
                 routed: bool = False, sshd_extra: str = "") -> None:
        """``sftp=False``: the hosts' sshd has no SFTP subsystem (minimal images, Alpine without
        openssh-sftp-server).  ``routed=True``: the hosts reach each other (see the module docstring).
        ``sshd_extra``: lines appended to every host's sshd_config."""
        if n < 1:
            raise ValueError("a farm needs at least one host")
        self.base_dir = Path(base_dir).resolve()
        self.n, self.gpus, self.python = n, gpus, python
        self.gpu_name, self.gpu_mem_mib = gpu_name, gpu_mem_mib
        self.sftp = sftp
        self.routed = routed
        self.sshd_extra = sshd_extra
        self.attached_dirs: list[str] = []
        self.farm_id = ""
        self.hosts: list[TestHost] = []
        self.client_key = self.base_dir / "client_ed25519"
        self.known_hosts = self.base_dir / "known_hosts"
        self.state_file = self.base_dir / "farm.json"
        self.start_seconds = 0.0
        self._launchers: dict[int, subprocess.Popen[bytes]] = {}
        self._down = False

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self) -> HostFarm:
        if self.hosts:
            raise RuntimeError("this farm was started already")
        problem = requirements_problem()
        if problem:
            raise RuntimeError(problem)
        t0 = time.monotonic()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.teardown)
        try:
            keygens = [self._keygen(self.client_key, "gpuq-testfarm-client")]
            self._allocate_and_plumb()
            for h in self.hosts:
                self._prepare_host_dirs(h)
                keygens.append(self._keygen(h.host_key, f"root@{h.name}"))
            for p in keygens:
                if p.wait(timeout=30) != 0:
                    raise RuntimeError(f"ssh-keygen failed: {p.stderr.read().decode() if p.stderr else ''}")
            authorized = self.client_key.with_suffix(".pub").read_text()
            for h in self.hosts:
                (h.root / ".ssh" / "authorized_keys").write_text(authorized)
                h.host_key_line = self._read_host_key_line(h)
            for h in self.hosts:
                self._launch(h)
            for h in self.hosts:
                self._find_init(h)
            self._save()
            self._wait_ready(self.hosts)
            self.write_known_hosts()
        except BaseException:
            self.teardown()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def teardown(self) -> None:
        """Idempotent: SIGKILL every host's PID 1 (by recorded pid + start time), delete veths and netns
        (a routed farm's forwarding setting goes with its veths), remove the attached dirs."""
        if self._down:
            return
        self._down = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)
        with contextlib.ExitStack() as held:
            for h in self.hosts:
                held.enter_context(_holding_pidns(h))
            for h in self.hosts:
                if h.init_alive():
                    _kill(h.init_pid, signal.SIGKILL)
            left = {h.name: self._reap(h, timeout=10) for h in self.hosts}
        for h in self.hosts:
            # anything else still in the host's network namespace (there should be nothing)
            res = _run(["ip", "netns", "pids", h.netns], check=False)
            for tok in res.stdout.split():
                if tok.isdigit():
                    _kill(int(tok), signal.SIGKILL)
        batch = "".join(f"link del {h.veth}\n" for h in self.hosts if Path(f"/sys/class/net/{h.veth}").exists())
        if batch:
            _run(["ip", "-force", "-batch", "-"], input=batch, check=False)
        existing = set(list_netns())
        batch = "".join(f"netns del {h.netns}\n" for h in self.hosts if h.netns in existing)
        if batch:
            _run(["ip", "-force", "-batch", "-"], input=batch, check=False)
        for d in getattr(self, "attached_dirs", []):
            shutil.rmtree(d, ignore_errors=True)
        if self.state_file.parent.is_dir():
            self._save(status="down")
        if any(left.values()):
            raise RuntimeError(f"processes outlived their host's PID 1: {left}")

    def __enter__(self) -> HostFarm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def disown(self) -> None:
        """Leave the hosts running after this process exits (``scripts/testhosts.py up``)."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)
        self._launchers.clear()

    @classmethod
    def from_state(cls, base_dir: Path) -> HostFarm:
        """The farm recorded in ``base_dir/farm.json`` (for ``down`` after a crash)."""
        base = Path(base_dir).resolve()
        data = json.loads((base / "farm.json").read_text())
        farm = cls(base, max(1, len(data["hosts"])), data.get("gpus", 0), data.get("python", sys.executable),
                   routed=bool(data.get("routed", False)))
        farm.farm_id = data["farm_id"]
        farm.attached_dirs = [str(d) for d in data.get("attached_dirs", [])]
        farm.hosts = [TestHost.from_json(h) for h in data["hosts"]]
        return farm

    def describe(self) -> dict[str, Any]:
        return {"farm_id": self.farm_id, "base_dir": str(self.base_dir), "client_key": str(self.client_key),
                "routed": getattr(self, "routed", False), "attached_dirs": list(getattr(self, "attached_dirs", [])),
                "known_hosts": str(self.known_hosts), "state_file": str(self.state_file),
                "ssh": shlex.join(self.ssh_argv(0)[:-1]) + " root@<address>" if self.hosts else "",
                "hosts": [{"name": h.name, "address": h.address, "port": h.port, "netns": h.netns,
                           "root_dir": str(h.root_dir), "init_pid": h.init_pid, "host_key": h.host_key_line,
                           "gpu_state": str(h.gpu_state)} for h in self.hosts]}

    # ------------------------------------------------------------------------------------- ssh

    def ssh_argv(self, i: int, *options: str) -> list[str]:
        """The OpenSSH client command for host i (strict host-key checking against ``known_hosts``).
        ``options`` come first: for ssh the first value of an option wins, so they override the defaults."""
        h = self.hosts[i]
        return self.endpoint_ssh_argv(h.address, h.port, *options)

    def endpoint_ssh_argv(self, address: str, port: int, *options: str, user: str = "root") -> list[str]:
        """``ssh_argv`` for an endpoint as a provider API reports it (``user@address``, ``port``), with
        the farm's client key and ``known_hosts``."""
        return ["ssh", *options, "-F", "/dev/null", "-i", str(self.client_key), "-p", str(port),
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "LogLevel=ERROR", f"{user}@{address}"]

    def ssh(self, i: int, *argv: str, timeout: float = 30, input: str | None = None,
            options: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
        """Run argv (shlex-quoted) on host i over a real SSH connection; never raises on failure."""
        cmd = [*self.ssh_argv(i, *options), "--", shlex.join(argv)] if argv else self.ssh_argv(i, *options)
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def ssh_endpoint(self, address: str, port: int, *argv: str, user: str = "root", timeout: float = 30,
                     input: str | None = None, options: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
        """``ssh`` to an endpoint (``Instance.ssh_host``/``ssh_port``) rather than a host index."""
        base = self.endpoint_ssh_argv(address, port, *options, user=user)
        cmd = [*base, "--", shlex.join(argv)] if argv else base
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def write_known_hosts(self, path: Path | None = None) -> Path:
        """Pin every host's current key (``regenerate_host_key`` does not: the test sees the change)."""
        target = path or self.known_hosts
        lines = [f"{h.address} {h.host_key_line}\n" if h.port == 22 else f"[{h.address}]:{h.port} {h.host_key_line}\n"
                 for h in self.hosts]
        _atomic_write(target, "".join(lines))
        return target
