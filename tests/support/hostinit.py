"""PID 1 of one test "GPU host" (see testhosts/).  stdlib only.

Started by the farm as ``ip netns exec NS unshare --pid --fork --mount --mount-proc ... python -I -S
hostinit.py SPEC.json``.  It

1. performs the host's bind mounts (SPEC["binds"], in order: the interpreter's directories into the
   per-host dirs first, then the per-host dirs over /usr/local/bin, /run, /root and /tmp), gives the
   host a private /dev (SPEC["private_dev"]: a tmpfs holding bind mounts of the machine's null, zero,
   full, random, urandom, tty, ptmx, pts and mqueue, the fd/stdin/stdout/stderr links, a private
   tmpfs on /dev/shm, and SPEC["gpu_devices"] fake GPU nodes /dev/nvidia0.., /dev/nvidiactl and
   /dev/nvidia-uvm: character devices with /dev/null's numbers, so they open like a GPU node and
   ``fuser`` sees their holders) and sets the hostname;
2. starts ``sshd -D -e -f CONFIG`` as its child and reaps every zombie (orphans reparent to PID 1);
3. obeys signals: SIGUSR1 = stop sshd (the listener and every sshd session process: "systemctl stop
   ssh"), SIGUSR2 = start sshd again, SIGHUP = restart sshd (re-reads config and host key),
   SIGTERM/SIGINT = kill everything in the host and exit.  With sshd stopped the host stays up.

Sources of bind mounts are opened (O_PATH) before the first mount, so covering /root, /tmp or /dev
never hides a source that lives below them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time

MS_BIND = 0x1000
MS_REC = 0x4000
MS_NOSUID = 0x2
MS_NODEV = 0x4
SSHD_COMMS = ("sshd", "sshd-session", "sshd-auth")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def log(msg: str) -> None:
    sys.stderr.write("hostinit[{}]: {}\n".format(time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def mount(src: str, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags,
                     data.encode() if data else None)
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {src} -> {dst}: {os.strerror(e)}")


DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx")  # bound from the machine's /dev
DEV_DIRS = ("pts", "mqueue")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}


def private_dev(gpu_devices: int, private_shm: bool) -> None:
    """A tmpfs over /dev with only what sshd, python and the agent need, plus fake GPU nodes."""
    keep: list[tuple[str, int, bool]] = []  # (name, O_PATH fd, is a directory)
    for name in DEV_NODES + DEV_DIRS:
        path = "/dev/" + name
        if os.path.lexists(path) and not os.path.islink(path):
            keep.append((name, os.open(path, os.O_PATH | os.O_CLOEXEC), os.path.isdir(path)))
    null_rdev = os.stat("/dev/null").st_rdev
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755,size=16m")  # no MS_NODEV: device nodes must open
    for name, fd, is_dir in keep:
        dst = "/dev/" + name
        if is_dir:
            os.mkdir(dst, 0o755)
        else:
            os.close(os.open(dst, os.O_WRONLY | os.O_CREAT, 0o666))
        mount(f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
        os.close(fd)
    for name, target in DEV_LINKS.items():
        os.symlink(target, "/dev/" + name)
    os.mkdir("/dev/shm", 0o1777)
    os.chmod("/dev/shm", 0o1777)
    if private_shm:
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    names = [f"nvidia{g}" for g in range(gpu_devices)] + (["nvidiactl", "nvidia-uvm"] if gpu_devices else [])
    for name in names:
        os.mknod("/dev/" + name, stat.S_IFCHR | 0o666, null_rdev)
        os.chmod("/dev/" + name, 0o666)


def do_mounts(spec: dict) -> None:
    fds = []
    for src, _dst in spec["binds"]:
        fds.append(os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    for fd, (_src, dst) in zip(fds, spec["binds"], strict=False):
        os.makedirs(dst, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
    for fd in fds:
        os.close(fd)
    if spec.get("private_dev", False):
        private_dev(int(spec.get("gpu_devices", 0)), bool(spec.get("private_shm", True)))
    elif spec.get("private_shm", True):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if spec.get("hostname"):
        socket.sethostname(spec["hostname"])
    os.chdir("/root")


def proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, comm) for every process this PID namespace's /proc shows."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        out[int(d)] = (ppid, comm)
    return out


def sshd_tree(listener: int) -> list[int]:
    """Every sshd process below the listener (monitors, privsep children), not the session commands."""
    table = proc_table()
    found: list[int] = []
    frontier = [listener]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, comm) in table.items():
            if ppid == parent and comm in SSHD_COMMS:
                found.append(pid)
                frontier.append(pid)
    return found


class Init:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.sshd: subprocess.Popen | None = None
        self.pending: list[int] = []

    def on_signal(self, signum: int, _frame: object) -> None:
        self.pending.append(signum)

    def start_sshd(self) -> None:
        if self.sshd is not None and self.sshd.poll() is None:
            return
        self.sshd = subprocess.Popen([self.spec["sshd"], "-D", "-e", "-f", self.spec["sshd_config"]],
                                     stdin=subprocess.DEVNULL, close_fds=True)
        log(f"sshd started (pid {self.sshd.pid})")

    def stop_sshd(self) -> None:
        if self.sshd is None or self.sshd.poll() is not None:
            self.sshd = None
            return
        listener = self.sshd.pid
        sessions = sshd_tree(listener)
        os.kill(listener, signal.SIGKILL)
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            self.sshd.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log(f"sshd {listener} did not exit")
        self.sshd = None
        log(f"sshd stopped (and {len(sessions)} session processes)")

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.sshd is not None and pid == self.sshd.pid:
                self.sshd.returncode = os.waitstatus_to_exitcode(status)
                log(f"sshd exited on its own ({self.sshd.returncode})")
                self.sshd = None

    def shutdown(self) -> None:
        log("shutting down")
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)  # every process of this PID namespace except PID 1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        sys.exit(0)

    def run(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for s in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self.on_signal)
        if self.spec.get("start_sshd", True):
            self.start_sshd()
        while True:
            with contextlib.suppress(InterruptedError):
                select.select([r], [], [], 5.0)
            try:
                os.read(r, 4096)
            except BlockingIOError:
                pass
            except OSError as e:
                if e.errno != errno.EAGAIN:
                    raise
            self.reap()
            pending, self.pending = self.pending, []
            for s in pending:
                if s == signal.SIGUSR1:
                    self.stop_sshd()
                elif s == signal.SIGUSR2:
                    self.start_sshd()
                elif s == signal.SIGHUP:
                    self.stop_sshd()
                    self.start_sshd()
                elif s in (signal.SIGTERM, signal.SIGINT):
                    self.shutdown()
            self.reap()


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if os.getpid() != 1:
        log(f"warning: not PID 1 (pid {os.getpid()})")
    do_mounts(spec)
    Init(spec).run()


if __name__ == "__main__":
    main()
