"""One test host: where its files lie, its record (``TestHost``), its GPUs and its sshd_config."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.testhosts.procs import proc_stat

SUPPORT = Path(__file__).resolve().parents[1]  # tests/support/
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
    # what the provider puts in its container's environment (PID 1's, read as /proc/1/environ inside the host:
    # RUNPOD_POD_ID, vast.ai's CONTAINER_API_KEY...), set before a boot; sshd sessions do not inherit it
    init_env: dict[str, str] = field(default_factory=dict)

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
