"""Large files through the system OpenSSH client (``ssh``), at the speed of the wire.

paramiko's channel is pure Python: a large file moves at a fraction of what ``ssh host cat`` moves.
When this machine has ``ssh`` and the host is reached directly with key files, a large download or
upload streams through ``ssh ... tail -c``/``cat`` (the scripts of ``sshexec.py``: the same size
bound, the same temporary name and rename, the same errors) and the caller verifies the bytes as
for paramiko's path (``Host.get``'s ``digest`` hashes them as they are written).

Host keys are never checked more weakly than paramiko's path checks them (knownhosts.py): OpenSSH
runs with ``StrictHostKeyChecking=yes``, ``UserKnownHostsFile`` set to gpuq's own file alone, no
global file, ``BatchMode`` (no prompt, no password), the host's key files only (no agent) and no
forwarding of any kind, and this path is taken only when gpuq's file names the host with plain keys
none of which is revoked (in either file) and no ``@cert-authority`` line speaks for it: every key
OpenSSH would accept then is one paramiko's path accepts.  Anything else (a jump host, a
ProxyCommand, no key file, no ``ssh`` here, an odd path) returns None and the caller uses paramiko.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.hosts.base import Digest, Progress
from orchestrator.hosts.knownhosts import load_trust
from orchestrator.hosts.sshconfig import Endpoint, known_hosts_key
from orchestrator.hosts.sshexec import CHUNK, get_failure, get_script, put_failure, put_script, receive

SSH_FAILED = 255  # ssh's own exit status: it could not connect, authenticate or check the key


class SystemSSHUnusable(Exception):
    """ssh could not start the transfer (exit 255 before any byte): the caller falls back to paramiko."""


def _plain(value: str) -> bool:
    return bool(value) and not any(c.isspace() or c in "\"'\\" for c in value)


def _gpuq_file_vouches(known_hosts: Path, endpoint: Endpoint) -> bool:
    """gpuq's file names the host with plain keys, none revoked, and no certificate authority speaks for it."""
    trust = load_trust(known_hosts, Path.home() / ".ssh" / "known_hosts")
    name = known_hosts_key(endpoint.hostname, endpoint.port)
    keys = trust.own.lookup(name)
    if keys is None or not keys.keys() or trust.certificate_only(name):
        return False
    return not any(f"{k.get_name()} {k.get_base64()}" in trust.revoked for k in keys.values())


def system_ssh(endpoint: Endpoint, known_hosts: Path, *, connect_timeout_s: float) -> list[str] | None:
    """The ``ssh`` argument vector (up to the remote command) for ``endpoint``, or None when the system
    client cannot be used with checks as strict as paramiko's."""
    binary = shutil.which("ssh")
    if binary is None or endpoint.jump or endpoint.proxy_command or not endpoint.key_files:
        return None
    paths = [str(known_hosts), *endpoint.key_files]
    if not all(_plain(p) for p in paths) or not _plain(endpoint.hostname) or endpoint.hostname.startswith("-"):
        return None
    if endpoint.user and (not _plain(endpoint.user) or endpoint.user.startswith("-")):
        return None
    if not _gpuq_file_vouches(known_hosts, endpoint):
        return None
    options = {"BatchMode": "yes", "StrictHostKeyChecking": "yes", "UserKnownHostsFile": str(known_hosts),
               "GlobalKnownHostsFile": os.devnull, "CheckHostIP": "no", "UpdateHostKeys": "no",
               "IdentitiesOnly": "yes", "IdentityAgent": "none", "ForwardAgent": "no", "ForwardX11": "no",
               "ClearAllForwardings": "yes", "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
               "ConnectTimeout": str(max(1, int(connect_timeout_s))), "ServerAliveInterval": "15",
               "ServerAliveCountMax": "4", "LogLevel": "ERROR", "Compression": "no"}
    argv = [binary, "-F", os.devnull, "-T", "-x", "-a", "-p", str(endpoint.port)]
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    for key_file in endpoint.key_files:
        argv += ["-i", key_file]
    if endpoint.user:
        argv += ["-l", endpoint.user]
    return [*argv, "--", endpoint.hostname]


def _stderr_of(handle: IO[bytes]) -> str:
    handle.seek(0)
    return handle.read(1 << 16).decode("utf-8", "replace").strip()


def _reap(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _blocks(fd: int, stall_s: float, host: str, remote: str) -> Iterator[bytes]:
    """What ssh's stdout brings, block by block, until its end; a silence of ``stall_s`` is a stall."""
    while True:
        if not select.select([fd], [], [], stall_s)[0]:
            raise HostUnreachable(host, f"download of {remote} stalled for {stall_s:.0f} s")
        block = os.read(fd, CHUNK)
        if not block:
            return
        yield block


def system_get(ssh: Sequence[str], host: str, remote: str, local: Path, offset: int, size: int | None, *,
               stall_s: float, progress: Progress | None = None, digest: Digest | None = None) -> None:
    """Download ``remote`` from ``offset`` on into ``local`` through ``ssh``; never past ``size``.

    Raises SystemSSHUnusable when ssh failed before a byte arrived, else the Host contract's errors."""
    local.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as err, open(local, "r+b" if offset and local.exists() else "wb") as dst:
        dst.truncate(offset)
        dst.seek(offset)
        proc = subprocess.Popen([*ssh, get_script(remote, offset)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        done = offset
        try:
            done = receive(_blocks(proc.stdout.fileno(), stall_s, host, remote), dst, offset, host, remote, size,
                           digest, progress)
        except PermissionError as exc:
            proc.kill()
            raise HostError(host, f"cannot write {local}: permission denied") from exc
        except BaseException:
            proc.kill()  # a stall, too many bytes, an interrupt: nothing more is read
            raise
        finally:
            proc.stdout.close()
            code = _reap(proc)
        if code == SSH_FAILED and done == offset:
            raise SystemSSHUnusable(_stderr_of(err) or "ssh exit 255")
        if code == SSH_FAILED:
            raise HostUnreachable(host, f"download of {remote} broke off: {_stderr_of(err) or 'ssh exit 255'}")
        if code != 0:
            raise get_failure(host, remote, _stderr_of(err), code)


def system_put(ssh: Sequence[str], host: str, local: Path, remote: str, tmp: str, directory: str, *,
               stall_s: float, progress: Progress | None = None) -> None:
    """Upload ``local`` to ``remote`` through ``ssh`` (``cat`` into ``tmp``, size checked, renamed)."""
    size = local.stat().st_size
    with tempfile.TemporaryFile() as err, open(local, "rb") as src:
        proc = subprocess.Popen([*ssh, put_script(remote, tmp, directory, size)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=err)
        assert proc.stdin is not None
        sent = 0
        try:
            while block := src.read(CHUNK):
                if not select.select([], [proc.stdin.fileno()], [], stall_s)[1]:
                    raise HostUnreachable(host, f"upload of {local.name} stalled for {stall_s:.0f} s")
                proc.stdin.write(block)
                sent += len(block)
                if progress is not None:
                    progress(sent)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # ssh ended: its exit status says why
        finally:
            if not proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
            code = _reap(proc)
        if code == SSH_FAILED:  # an upload starts over anyway: paramiko's path tries it
            raise SystemSSHUnusable(_stderr_of(err) or "ssh exit 255")
        if code != 0:
            raise put_failure(host, remote, _stderr_of(err), code)
