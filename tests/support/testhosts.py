"""A farm of real OpenSSH "GPU hosts" for integration tests (needs root, sshd, iproute2, util-linux).

Each host is a faithful stand-in for a rented GPU container:

- its own **network namespace** ``gpuq-th-<farm>-<i>`` joined to the root namespace by a veth pair
  (root side ``gqth<farm>h<i>``, host side ``eth0``) on a private /30 of 10.231.0.0/16; sshd listens
  on the host side address, port 22, and nowhere else;
- its own **PID, mount, UTS and IPC namespaces**: ``ps`` inside sees only the host, the hostname is the
  host's name, /dev is private (a tmpfs with the machine's null/zero/random/tty/pts nodes bound in,
  a private /dev/shm, and fake GPU nodes /dev/nvidia0.., /dev/nvidiactl, /dev/nvidia-uvm that open
  like /dev/null, so ``fuser`` sees who holds a "GPU"), and per-host directories are bound over
  ``/root``, ``/tmp``, ``/run`` and ``/usr/local/bin`` (hosts never share files).  PID 1 is
  ``hostinit.py``, which runs sshd and reaps orphans; SIGKILL of it from the root namespace
  (``preempt``) kills the whole host;
- ``/usr/local/bin/python3`` and ``python`` run the test run's interpreter (its directories are bound
  into the per-host dirs at their real paths, so a venv under /tmp or a pyenv under /root still works),
  ``/usr/local/bin/nvidia-smi`` is ``fake_nvidia_smi.py`` over a per-host JSON GPU state, and
  ``/usr/local/bin/dmesg`` is ``fake_dmesg.py`` over a per-host kernel-log fixture (``dmesg.log``;
  ``dmesg.log.unreadable`` makes it fail like a restricted kernel log);
- a farm-wide authorized ed25519 client key and a pinned ed25519 host key per host;
- hosts reach only their own gateway, unless the farm is **routed** (``routed=True``): then each host
  routes 10.231.0.0/16 via its gateway and the root namespace forwards packets that arrive on the
  farm's veths (``net.ipv4.conf.<veth>.forwarding=1``, per interface: the machine's
  ``net.ipv4.ip_forward`` is never touched, and the setting vanishes with the veth), so the hosts of
  the farm reach each other (a Slurm cluster: tests/support/slurmcluster.py);
- ``sshd_extra``: lines appended to every host's sshd_config (``set_sshd_extra`` changes one host's
  later and restarts its sshd), e.g. ``SetEnv SLURM_CONF=...`` for the commands sessions run.

Files outside the per-host dirs (/etc, /usr, /var/tmp, ...) are the machine's own, shared by every
host: a directory there can serve as a cluster's shared filesystem; ``attach_dir`` records one in
farm.json so that teardown (and ``down`` after a crash) removes it.

Controller-side layout of a farm (``base_dir``)::

    farm.json              farm id, hosts (netns, veth, addresses, init pid + start time), attached dirs:
                           enough to tear down after a crash (``scripts/testhosts.py down --dir D``)
    client_ed25519[.pub]   the authorized client key;  known_hosts: "<address> ssh-ed25519 AAAA..."
    host-<i>/root/         the host's /root (.ssh/authorized_keys)
    host-<i>/tmp/          the host's /tmp
    host-<i>/bin/          the host's /usr/local/bin (python3, python, nvidia-smi, links to the real ones)
    host-<i>/run/          the host's /run: sshd/ (privsep), sshd.pid, gpuq-testhost/ (sshd_config,
                           host key, gpus.json, fake_nvidia_smi.py, dmesg.log, fake_dmesg.py)
    host-<i>/init.json     what hostinit does;  host-<i>/init.log: hostinit's and sshd's stderr

Everything is torn down by recorded pid (checked against its start time) and namespace name.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import fake_dmesg, fake_nvidia_smi

SUPPORT = Path(__file__).resolve().parent
HOSTINIT = SUPPORT / "hostinit.py"
FAKE_NVSMI = SUPPORT / "fake_nvidia_smi.py"
FAKE_DMESG = SUPPORT / "fake_dmesg.py"
SSHD = "/usr/sbin/sshd"
NETNS_PREFIX = "gpuq-th-"
VETH_PREFIX = "gqth"
SUBNET = ipaddress.IPv4Network("10.231.0.0/16")
SLOTS = SUBNET.num_addresses // 4  # one /30 per host
IN_HOST = "/run/gpuq-testhost"  # the host's own files, as the host sees them
COVERED = {"/root": "root", "/tmp": "tmp", "/run": "run"}  # in-host path -> per-host subdir bound over it
LOCAL_BIN = "/usr/local/bin"
LOCK_FILE = "/run/lock/gpuq-testhosts.lock"
SSHD_COMMS = ("sshd", "sshd-session", "sshd-auth")
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MIB = 81559
FarmFactory = Callable[..., "HostFarm"]  # the integration fixtures' `host_farm(n=3, gpus=2) -> HostFarm`
INSTALL_HINT = ("run .ci/run, or as root: apt-get install -y openssh-server openssh-client iproute2 util-linux")


def requirements_problem() -> str | None:
    """None when this machine can run a farm; otherwise what is missing and how to get it."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network/PID/mount namespaces)")
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if not missing:
        return None
    return f"the test host farm needs {', '.join(missing)}: {INSTALL_HINT}"


# ----------------------------------------------------------------------------------------------- /proc


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, comm, start time in clock ticks) of a live (non-zombie) process, else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    comm = st[st.index("(") + 1:st.rindex(")")]
    rest = st[st.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), comm, int(rest[19])


def pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def all_pids() -> Iterator[int]:
    for d in os.listdir("/proc"):
        if d.isdigit():
            yield int(d)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@contextlib.contextmanager
def _holding_pidns(h: TestHost) -> Iterator[None]:
    """Keep host h's PID namespace referenced (an open nsfs fd), so that its inode number, which is how
    gpuq's test hosts name a namespace, is not handed to a new namespace while the host is being emptied."""
    fd = -1
    if h.init_pid and h.init_alive():
        with contextlib.suppress(OSError):
            fd = os.open(f"/proc/{h.init_pid}/ns/pid", os.O_RDONLY)
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False, timeout=60)
    if check and res.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res


def _wait(pred: Any, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# ----------------------------------------------------------------------------------------------- hosts


@dataclass
class TestHost:
    """One host of a farm.  ``root_dir``'s ``root/`` and ``tmp/`` are the host's /root and /tmp."""

    __test__ = False  # not a pytest test class

    name: str  # also its hostname
    index: int
    netns: str
    veth: str  # root-namespace side of the veth pair (the host side is eth0)
    address: str  # the host's address: sshd listens here, port 22
    gateway: str  # the root namespace's address on the pair
    port: int
    root_dir: Path
    gpu_state: Path  # controller-side path of the fake nvidia-smi's JSON state
    host_key_line: str = ""  # "ssh-ed25519 AAAA..." (pinned in the farm's known_hosts)
    init_pid: int = 0  # root-namespace pid of the host's PID 1 (0: not running)
    init_start: int = 0  # its start time (clock ticks), so a recycled pid is never killed
    pidns: str = ""  # "pid:[...]" of the host's PID namespace
    launcher_pid: int = 0  # the `unshare` parent waiting on PID 1
    sshd_extra: str = ""  # lines appended to the host's sshd_config

    @property
    def root(self) -> Path:
        return self.root_dir / "root"

    @property
    def tmp(self) -> Path:
        return self.root_dir / "tmp"

    @property
    def run_dir(self) -> Path:
        return self.root_dir / "run"

    @property
    def host_key(self) -> Path:
        return self.run_dir / "gpuq-testhost" / "ssh_host_ed25519_key"

    @property
    def log(self) -> Path:
        return self.root_dir / "init.log"

    @property
    def kernel_log(self) -> Path:
        """The fixture the host's ``dmesg`` prints (controller-side path)."""
        return self.run_dir / "gpuq-testhost" / "dmesg.log"

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["root_dir"], d["gpu_state"] = str(self.root_dir), str(self.gpu_state)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TestHost:
        kw = dict(d)
        kw["root_dir"], kw["gpu_state"] = Path(kw["root_dir"]), Path(kw["gpu_state"])
        return cls(**kw)

    def init_alive(self) -> bool:
        """The recorded PID 1 is still this host's (same pid, same start time)."""
        st = proc_stat(self.init_pid) if self.init_pid else None
        return st is not None and st[2] == self.init_start


def default_gpus(seed: str, count: int, name: str = H100_NAME, mem_mib: int = H100_MIB) -> list[dict[str, Any]]:
    gpus = []
    for g in range(count):
        digest = hashlib.sha256(f"{seed}/{g}".encode()).digest()[:16]
        gpus.append({
            "index": g, "name": name, "uuid": f"GPU-{uuid.UUID(bytes=digest)}",
            "serial": str(int.from_bytes(digest[:6], "big")), "pci.bus_id": f"00000000:{0x18 + g:02X}:00.0",
            "utilization.gpu": 0, "utilization.memory": 0, "memory.used": 0, "memory.total": mem_mib,
            "temperature.gpu": 31, "temperature.memory": 35, "power.draw": 69.5, "power.limit": 700.0,
            "clocks.current.sm": 1980, "clocks.max.sm": 1980, "clocks.current.memory": 2619,
            "clocks.max.memory": 2619, "processes": [],
        })
    return gpus


ALT_SSH_PORT = 2222  # every host's sshd listens here too: a rental's "public port" can change (RunPod)

SSHD_CONFIG = """\
# gpuq test host {name}
ListenAddress {address}:{port}
ListenAddress {address}:{alt_port}
HostKey {in_host}/ssh_host_ed25519_key
PidFile /run/sshd.pid
AuthorizedKeysFile /root/.ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PermitUserEnvironment no
X11Forwarding no
PrintMotd no
PrintLastLog no
MaxSessions 50
MaxStartups 100
LogLevel ERROR
Subsystem sftp internal-sftp
"""


class HostFarm:
    """N real OpenSSH hosts in their own namespaces; see the module docstring.  ``start()`` returns self."""

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

    # ------------------------------------------------------------------------------------- faults

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

    # ------------------------------------------------------------------------------------- rentals
    # What a cloud backend (tests/support/fakecloud/netns_backend.py) does to a host between rentals.

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

    # ------------------------------------------------------------------------------------- GPUs

    def read_gpu_state(self, i: int) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.hosts[i].gpu_state.read_text())
        return state

    def write_gpu_state(self, i: int, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """The whole state ({"gpus": [...], "broken": ...}) or just the list of GPUs."""
        full = dict(state) if isinstance(state, Mapping) else {**self.read_gpu_state(i), "gpus": list(state)}
        _atomic_write(self.hosts[i].gpu_state, json.dumps(full, indent=1))

    def set_gpu(self, i: int, gpu: int, fields: Mapping[str, Any] | None = None, **kw: Any) -> None:
        """Update fields of GPU ``gpu`` on host i: ``set_gpu(0, 1, {"memory.used": 4096})`` or
        ``set_gpu(0, 1, utilization_gpu=97, processes=[{"pid": 42, "used_memory": 1024}])``
        (a keyword's underscores read as dots unless the name is a field as it stands)."""
        state = self.read_gpu_state(i)
        g = state["gpus"][gpu]
        for k, v in {**(fields or {}), **kw}.items():
            known = {*fake_nvidia_smi.GPU_FIELDS, "processes"}
            key = k if k in known else k.replace("_", ".")
            if key not in known:
                raise ValueError(f"unknown GPU field {k!r}: pass fields={{'<nvidia-smi name>': value}}")
            g[key] = v
        self.write_gpu_state(i, state)

    def set_driver_broken(self, i: int, broken: bool | str = True) -> None:
        """Every nvidia-smi call on host i fails ("NVIDIA-SMI has failed ...", exit 9) until cleared."""
        self.write_gpu_state(i, {**self.read_gpu_state(i), "broken": broken})

    def set_gpu_throttle(self, i: int, gpu: int, *reasons: str) -> None:
        """Make exactly ``reasons`` (``hw_slowdown``, ``hw_thermal_slowdown``, ``hw_power_brake_slowdown``,
        ``sw_thermal_slowdown``, ``sw_power_cap``, ...) Active on GPU ``gpu``; none: no throttling."""
        known = [k.split(".", 1)[1] for k in fake_nvidia_smi.GPU_FIELDS if k.startswith("clocks_throttle_reasons.")
                 and k not in ("clocks_throttle_reasons.active", "clocks_throttle_reasons.supported")]
        unknown = set(reasons) - set(known)
        if unknown:
            raise ValueError(f"unknown throttle reasons {sorted(unknown)}; known: {known}")
        self.set_gpu(i, gpu, {f"clocks_throttle_reasons.{r}": r in reasons for r in known})

    def set_gpu_heat(self, i: int, gpu: int, temp_c: float, sm_clock_mhz: float | None = None) -> None:
        """GPU temperature (and, optionally, the current SM clock; clocks.max.sm stays)."""
        fields: dict[str, Any] = {"temperature.gpu": temp_c}
        if sm_clock_mhz is not None:
            fields["clocks.current.sm"] = sm_clock_mhz
        self.set_gpu(i, gpu, fields)

    def set_gpu_ecc(self, i: int, gpu: int, *, uncorrected: int = 0, corrected: int = 0,
                    retired_pending: bool = False, remap_failure: bool = False, ecc_enabled: bool = True) -> None:
        """ECC state as nvidia-smi reports it (volatile counts, pending retirement, row-remap failure)."""
        self.set_gpu(i, gpu, {"ecc.errors.uncorrected.volatile.total": uncorrected,
                              "ecc.errors.corrected.volatile.total": corrected,
                              "retired_pages.pending": "Yes" if retired_pending else "No",
                              "remapped_rows.failure": "Yes" if remap_failure else "No",
                              "ecc.mode.current": "Enabled" if ecc_enabled else "Disabled"})

    # ------------------------------------------------------------------------------------- kernel log

    def append_kernel_log(self, i: int, line: str) -> str:
        """Append one line to host i's kernel log (what its ``dmesg`` prints).  A line without a
        ``[ seconds]`` timestamp gets the current boot-clock time, after every earlier line.
        Returns the line as written."""
        path = self.hosts[i].kernel_log
        text = line.rstrip("\n")
        if not fake_dmesg.TS_RE.match(text):
            text = _kernel_line(text, _kernel_log_last(path))
        with open(path, "a") as f:
            f.write(text + "\n")
        return text

    def inject_xid(self, i: int, gpu: int, code: int, message: str = "") -> str:
        """An ``NVRM: Xid`` line for GPU ``gpu`` of host i (its PCI address as the driver prints it)."""
        bus = str(self.read_gpu_state(i)["gpus"][gpu].get("pci.bus_id", "00000000:18:00.0"))
        pci = bus[-12:-2] if len(bus) >= 12 else bus  # "00000000:18:00.0" -> "0000:18:00"
        text = message or {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has "
                           "been detected on GPU in the framebuffer at partition 0, subpartition 0.",
                           13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
                           }.get(code, "Graphics Exception")
        return self.append_kernel_log(i, f"NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python3, {text}")

    def clear_kernel_log(self, i: int) -> None:
        """Host i's kernel log back to its boot lines (timestamps keep rising) and readable."""
        self._write_boot_kernel_log(self.hosts[i])

    def _write_boot_kernel_log(self, h: TestHost) -> None:
        boot = [f"Linux version (gpuq test host {h.name})", "Command line: console=ttyS0"]
        if self.gpus > 0:
            boot.append("nvidia: module license 'NVIDIA' taints kernel.")
        lines: list[str] = []
        last = _kernel_log_last(h.kernel_log)
        for msg in boot:
            lines.append(_kernel_line(msg, last))
            last = float(lines[-1][1:lines[-1].index("]")])
        _atomic_write(h.kernel_log, "".join(line + "\n" for line in lines))
        fake_dmesg_flag(h).unlink(missing_ok=True)

    def set_kernel_log_readable(self, i: int, readable: bool = True) -> None:
        """readable=False: host i's ``dmesg`` fails as under kernel.dmesg_restrict (exit 1)."""
        flag = fake_dmesg_flag(self.hosts[i])
        if readable:
            flag.unlink(missing_ok=True)
        else:
            flag.write_text("")

    # ------------------------------------------------------------------------------------- GPU holders

    def hold_gpu_device(self, i: int, gpu: int | None, *argv: str) -> int:
        """Start a process inside host i that holds ``/dev/nvidia<gpu>`` (``None``: /dev/nvidiactl) open
        and sleeps, in its own session, invisible to nvidia-smi: a VRAM zombie.  ``argv`` is appended
        to its command line.  Returns its pid as the host sees it; it dies with the host
        (``teardown``/``preempt``) or by ``release_gpu_device``."""
        node = "/dev/nvidiactl" if gpu is None else f"/dev/nvidia{gpu}"
        code = ("import os, sys, time\ntry:\n    os.setsid()\nexcept OSError:\n    pass\n"
                "fd = os.open(sys.argv[1], os.O_RDWR)\ntime.sleep(86400)\n")
        script = ('code=$1; node=$2; shift 2\n'
                  'python3 -c "$code" "$node" "$@" </dev/null >/dev/null 2>&1 &\n'
                  'pid=$!; n=0\n'
                  'while [ $n -lt 250 ]; do\n'
                  '  for f in /proc/$pid/fd/*; do\n'
                  '    [ "$(readlink "$f" 2>/dev/null)" = "$node" ] && { echo $pid; exit 0; }\n'
                  '  done\n'
                  '  n=$((n+1)); sleep 0.02\n'
                  'done\n'
                  'echo "holder $pid never opened $node" >&2; exit 1\n')
        res = self.ssh(i, "sh", "-c", script, "sh", code, node, *argv)
        if res.returncode != 0 or not res.stdout.strip().isdigit():
            raise RuntimeError(f"hold_gpu_device({i}, {gpu}) failed: {res.stdout}{res.stderr}")
        return int(res.stdout.strip())

    def release_gpu_device(self, i: int, pid: int) -> None:
        """SIGKILL a holder started by ``hold_gpu_device`` (by its in-host pid); gone already is fine."""
        self.ssh(i, "sh", "-c", f"kill -9 {int(pid)} 2>/dev/null; true")

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

    def _save(self, status: str = "up") -> None:
        data = {"farm_id": self.farm_id, "status": status, "gpus": self.gpus, "python": self.python,
                "routed": getattr(self, "routed", False), "attached_dirs": getattr(self, "attached_dirs", []),
                "client_key": str(self.client_key), "known_hosts": str(self.known_hosts),
                "hosts": [h.to_json() for h in self.hosts]}
        _atomic_write(self.state_file, json.dumps(data, indent=1))

    def _keygen(self, path: Path, comment: str) -> subprocess.Popen[bytes]:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in (path, path.with_name(path.name + ".pub")):
            old.unlink(missing_ok=True)
        return subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @staticmethod
    def _read_host_key_line(h: TestHost) -> str:
        parts = h.host_key.with_name(h.host_key.name + ".pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    def _allocate_and_plumb(self) -> None:
        """Pick a farm id and n free /30s, create the namespaces and veth pairs (under a machine-wide lock)."""
        Path(LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            netns = set(list_netns())
            links = set(os.listdir("/sys/class/net"))
            used = used_slots()
            rng = random.Random(f"{os.getpid()}-{time.time_ns()}-{os.urandom(8).hex()}")
            for _ in range(1000):
                fid = f"{rng.getrandbits(16):04x}"
                if any(x.startswith(f"{NETNS_PREFIX}{fid}-") for x in netns) or \
                        any(x.startswith(f"{VETH_PREFIX}{fid}") for x in links):
                    continue
                start = rng.randrange(0, SLOTS - self.n)
                if not any(s in used for s in range(start, start + self.n)):
                    break
            else:
                raise RuntimeError("no free farm id / address block in 10.231.0.0/16")
            self.farm_id = fid
            for k in range(self.n):
                net = ipaddress.IPv4Address(int(SUBNET.network_address) + 4 * (start + k))
                name = f"{NETNS_PREFIX}{fid}-{k}"
                root_dir = self.base_dir / f"host-{k}"
                self.hosts.append(TestHost(
                    name=name, index=k, netns=name, veth=f"{VETH_PREFIX}{fid}h{k}", address=str(net + 2),
                    gateway=str(net + 1), port=22, root_dir=root_dir,
                    gpu_state=root_dir / "run" / "gpuq-testhost" / "gpus.json",
                    sshd_extra=getattr(self, "sshd_extra", "")))
            self._save(status="starting")  # recorded before anything exists: `down` can always clean up
            batch = ""
            for h in self.hosts:
                batch += (f"netns add {h.netns}\n"
                          f"link add {h.veth} type veth peer name eth0 netns {h.netns}\n"
                          f"addr add {h.gateway}/30 dev {h.veth}\n"
                          f"link set {h.veth} up\n")
            _run(["ip", "-batch", "-"], input=batch)
        routed = getattr(self, "routed", False)
        for h in self.hosts:
            route = f"route add {SUBNET} via {h.gateway}\n" if routed else ""
            _run(["ip", "-n", h.netns, "-batch", "-"],
                 input=f"addr add {h.address}/30 dev eth0\nlink set eth0 up\nlink set lo up\n{route}")
            if routed:
                # forward what arrives on this veth (per interface: net.ipv4.ip_forward stays as it is)
                Path(f"/proc/sys/net/ipv4/conf/{h.veth}/forwarding").write_text("1\n")

    def _python_dirs(self) -> list[str]:
        """Directories the interpreter needs (prefixes, its real bin dir), real paths included."""
        if os.path.realpath(self.python) == os.path.realpath(sys.executable):
            dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
        else:
            out = _run([self.python, "-c", "import sys, json; print(json.dumps("
                        "[sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"]).stdout
            dirs = json.loads(out)
        dirs += [os.path.dirname(os.path.abspath(self.python)), os.path.dirname(os.path.realpath(self.python))]
        return sorted({os.path.abspath(d) for d in dirs} | {os.path.realpath(d) for d in dirs})

    def _binds(self, h: TestHost) -> list[tuple[str, str]]:
        """hostinit's bind mounts, in order: interpreter dirs into the per-host dirs, then the covers."""
        binds: list[tuple[str, str]] = []
        chosen: list[str] = []
        for d in self._python_dirs():
            cover = _covering(d)
            if cover is None or any(_under(d, c) for c in chosen) or not os.path.isdir(d):
                continue
            chosen.append(d)
            binds.append((d, str(h.root_dir / COVERED[cover] / os.path.relpath(d, cover))))
        if os.path.isdir(LOCAL_BIN):
            binds.append((LOCAL_BIN, str(h.run_dir / "gpuq-testhost" / "usr-local-bin")))
        binds.append((str(h.root_dir / "bin"), LOCAL_BIN))
        binds += [(str(h.root_dir / sub), cover) for cover, sub in COVERED.items()]
        return binds

    def _prepare_host_dirs(self, h: TestHost) -> None:
        for sub, mode in (("root", 0o700), ("tmp", 0o1777), ("bin", 0o755), ("run", 0o755)):
            (h.root_dir / sub).mkdir(parents=True, exist_ok=True)
            (h.root_dir / sub).chmod(mode)
        (h.root / ".ssh").mkdir(mode=0o700, exist_ok=True)
        (h.run_dir / "sshd").mkdir(mode=0o755, exist_ok=True)
        own = h.run_dir / "gpuq-testhost"
        own.mkdir(exist_ok=True)
        binds = self._binds(h)
        for _src, dst in binds:
            if not dst.startswith(str(h.root_dir)):
                continue
            Path(dst).mkdir(parents=True, exist_ok=True)
        # /usr/local/bin: python3/python (the test interpreter), nvidia-smi (the fake), links to the real ones
        py = self.python
        if _under(os.path.abspath(py), LOCAL_BIN):
            py = f"{IN_HOST}/usr-local-bin/{os.path.relpath(os.path.abspath(py), LOCAL_BIN)}"
        bindir = h.root_dir / "bin"
        ours = {"python3": f'#!/bin/sh\nexec {shlex.quote(py)} "$@"\n'}
        ours["python"] = ours["python3"]
        if self.gpus > 0:
            shutil.copyfile(FAKE_NVSMI, own / "fake_nvidia_smi.py")
            ours["nvidia-smi"] = (f"#!/bin/sh\nexec {shlex.quote(py)} -I -S {IN_HOST}/fake_nvidia_smi.py "
                                  f'--state {IN_HOST}/gpus.json "$@"\n')
        shutil.copyfile(FAKE_DMESG, own / "fake_dmesg.py")
        ours["dmesg"] = (f"#!/bin/sh\nexec {shlex.quote(py)} -I -S {IN_HOST}/fake_dmesg.py "
                         f'--log {IN_HOST}/dmesg.log "$@"\n')
        self._write_boot_kernel_log(h)
        if os.path.isdir(LOCAL_BIN):
            for entry in os.listdir(LOCAL_BIN):
                if entry not in ours and not (bindir / entry).is_symlink():
                    (bindir / entry).symlink_to(f"{IN_HOST}/usr-local-bin/{entry}")
        for entry, text in ours.items():
            (bindir / entry).write_text(text)
            (bindir / entry).chmod(0o755)
        state = {"driver_version": "550.54.15", "cuda_version": "12.4", "broken": False,
                 "gpus": default_gpus(f"{self.farm_id}/{h.index}", self.gpus, self.gpu_name, self.gpu_mem_mib)}
        _atomic_write(h.gpu_state, json.dumps(state, indent=1))
        self._write_sshd_config(h)
        spec = {"binds": binds, "hostname": h.name, "sshd": SSHD, "sshd_config": f"{IN_HOST}/sshd_config",
                "private_shm": True, "private_dev": True, "gpu_devices": self.gpus}
        (h.root_dir / "init.json").write_text(json.dumps(spec, indent=1))

    def _write_sshd_config(self, h: TestHost) -> None:
        config = SSHD_CONFIG.format(name=h.name, address=h.address, port=h.port, alt_port=ALT_SSH_PORT,
                                    in_host=IN_HOST)
        if not getattr(self, "sftp", True):
            config = config.replace("Subsystem sftp internal-sftp\n", "")
        if h.sshd_extra:
            # last, so a Match block in it covers only its own lines
            config = f"{config}# sshd_extra\n{h.sshd_extra.rstrip()}\n"
        _atomic_write(h.run_dir / "gpuq-testhost" / "sshd_config", config)

    def _launch(self, h: TestHost) -> None:
        argv = ["ip", "netns", "exec", h.netns,
                "unshare", "--pid", "--fork", "--mount", "--mount-proc", "--uts", "--ipc", "--propagation", "slave",
                self.python, "-I", "-S", str(HOSTINIT), str(h.root_dir / "init.json")]
        with open(h.log, "ab" if h.log.exists() and h.init_start else "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                    close_fds=True, cwd="/")
        self._launchers[h.index] = proc
        h.launcher_pid = proc.pid

    def _find_init(self, h: TestHost) -> None:
        """The launcher (`unshare`, after `ip netns exec` exec'd it) forks PID 1: find it, record identity."""
        own_ns = pid_ns(os.getpid())
        found: list[int] = []

        def look() -> bool:
            for p in all_pids():
                st = proc_stat(p)
                if st is not None and st[0] == h.launcher_pid and pid_ns(p) not in (None, own_ns):
                    found.append(p)
                    return True
            return False

        if not _wait(look, 10, 0.005):
            raise RuntimeError(f"{h.name}: no PID 1 appeared; log:\n{_tail(h.log)}")
        h.init_pid = found[0]
        st = proc_stat(h.init_pid)
        h.init_start = st[2] if st else 0
        h.pidns = pid_ns(h.init_pid) or ""

    def _wait_ready(self, hosts: Iterable[TestHost], timeout: float = 20) -> None:
        pending = list(hosts)
        deadline = time.monotonic() + timeout
        while pending:
            pending = [h for h in pending if _connect_state(h.address, h.port, banner=True) != "ok"]
            if not pending:
                return
            for h in pending:
                if not h.init_alive():
                    raise RuntimeError(f"{h.name}: PID 1 died during start; log:\n{_tail(h.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pending[0].name}: sshd not accepting after {timeout}s; "
                                   f"log:\n{_tail(pending[0].log)}")
            time.sleep(0.02)


# ----------------------------------------------------------------------------------------------- helpers


def list_netns() -> list[str]:
    res = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def used_slots() -> set[int]:
    """/30 slots of 10.231.0.0/16 that some interface of the root namespace already uses."""
    used = set()
    for line in _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = ipaddress.IPv4Interface(parts[parts.index("inet") + 1])
            if addr.ip in SUBNET:
                used.add((int(addr.ip) - int(SUBNET.network_address)) // 4)
    return used


def _covering(path: str) -> str | None:
    """The covered in-host directory (/root, /tmp, /run) that hides ``path``, if any.  (An interpreter
    in /usr/local/bin is reached through /run/gpuq-testhost/usr-local-bin instead.)"""
    return next((cover for cover in COVERED if _under(path, cover)), None)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _connect_state(address: str, port: int, banner: bool = False) -> str:
    """"ok" (accepting; with banner=True: an SSH banner arrived), "refused", "nobanner" or "timeout"
    (no answer, unreachable).  Says goodbye politely, so sshd logs nothing at LogLevel ERROR."""
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            s.settimeout(2)
            try:
                greeting = s.recv(256)
            except OSError:
                greeting = b""
            if greeting.startswith(b"SSH-"):
                with contextlib.suppress(OSError):
                    s.sendall(b"SSH-2.0-gpuq-testhosts-probe\r\n")
                    s.shutdown(socket.SHUT_WR)
                    s.recv(4096)
                return "ok"
            return "nobanner" if banner else "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "timeout"


def fake_dmesg_flag(h: TestHost) -> Path:
    return Path(fake_dmesg.unreadable_flag(str(h.kernel_log)))


def _kernel_log_last(path: Path) -> float:
    """The timestamp of the last line of a kernel-log fixture (0 when none)."""
    last = 0.0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            m = fake_dmesg.TS_RE.match(line)
            if m:
                last = float(m.group(0).strip().strip("[]").strip())
    return last


def _kernel_line(message: str, after: float) -> str:
    """``[ seconds] message`` stamped with the boot clock (what /proc/uptime counts), after ``after``."""
    ts = max(time.clock_gettime(time.CLOCK_BOOTTIME), after + 1e-6)
    return f"[{ts:12.6f}] {message}"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads may race
    tmp.write_text(text)
    os.replace(tmp, path)


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"
