"""How a farm builds its hosts: namespaces, veths and addresses, per-host dirs, keys, PID 1, sshd up."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tests.support.testhosts.host import (
    ALT_SSH_PORT,
    COVERED,
    FAKE_DMESG,
    FAKE_NVSMI,
    HOSTINIT,
    IN_HOST,
    LOCAL_BIN,
    LOCK_FILE,
    NETNS_PREFIX,
    SLOTS,
    SSHD,
    SSHD_CONFIG,
    SUBNET,
    VETH_PREFIX,
    TestHost,
    default_gpus,
)
from tests.support.testhosts.procs import _atomic_write, _run, _tail, _wait, all_pids, pid_ns, proc_stat


class HostBuilding:
    """``HostFarm``'s start of a host: what ``start`` and ``boot`` call (and the farm.json they keep)."""

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
                                    close_fds=True, cwd="/", env=init_environment(h.init_env))
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


def init_environment(extra: dict[str, str]) -> dict[str, str]:
    """PID 1's environment: this machine's, less anything that looks like a credential (a host must never see
    the controller's cloud keys through its PID 1), plus what the provider puts in the container (``extra``)."""
    secretish = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
    env = {k: v for k, v in os.environ.items() if not any(w in k.upper() for w in secretish)}
    env.update(extra)
    return env


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
