"""SSHHost: a remote machine over SSH (paramiko).  The only module that imports paramiko.

Contract (docs/security.md, docs/host-protocol.md):

- **Host keys are verified** (knownhosts.py).  Keys live in a gpuq-owned known_hosts file
  (``$GPUQ_HOME/known_hosts``), which wins for a host it names; the user's
  ``~/.ssh/known_hosts`` is consulted read-only otherwise; ``@revoked`` keys are refused.
  An unknown key is refused unless the host was created with
  ``trust_new_host_key`` (trust on first use, recorded in the gpuq file); a
  changed key is always refused (HostKeyError), and the old entry is kept as
  evidence.
- **Targets** are ``user@address`` or an alias from ``~/.ssh/config`` (sshconfig.py);
  ProxyJump tunnels a ``direct-tcpip`` channel through each jump host, whose keys are
  verified the same way and recorded as its own; ProxyCommand runs the command as the socket.
- **Files** go over SFTP, or over an exec channel when the host has no SFTP subsystem
  (sshexec.py); a download never reads past the size the caller expects.
- **One connection per host per command**, reused by every call, with
  keepalives.  Connecting retries with capped exponential backoff and jitter;
  a command whose session cannot be opened on a stale connection reconnects once.
  A command that started is never re-sent: the caller decides (gpuq's agent verbs
  are idempotent and the next tick repeats them).
- **Argument vectors only.**  Every element is shell-quoted here, so nothing from
  a queue file or a spec is ever interpreted by the remote shell.
- **Errors** never leak paramiko or socket types: transport trouble becomes
  HostUnreachable, key trouble HostKeyError, refused keys HostAuthFailed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from orchestrator.core.errors import HostAuthFailed, HostError, HostKeyError, HostUnreachable
from orchestrator.core.specs import CommandResult
from orchestrator.hosts.base import Host, Progress, too_big
from orchestrator.hosts.knownhosts import TrustPolicy as _Policy
from orchestrator.hosts.knownhosts import load_trust, revoked_message, user_keys_for
from orchestrator.hosts.sshcommand import CHUNK, exchange
from orchestrator.hosts.sshconfig import Endpoint, fingerprint, known_hosts_key, resolve
from orchestrator.hosts.sshexec import close_channel

# paramiko logs a dropped link ("Socket exception: Connection reset by peer") through Python's
# last-resort handler straight onto the user's terminal; gpuq reports transport failures itself
# (HostUnreachable, "unreachable since T"), so paramiko's records go nowhere unless a caller
# configures logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
_log = logging.getLogger("orchestrator.hosts.ssh")

__all__ = [
    "Endpoint", "SSHHost", "SSHOptions", "fingerprint", "known_hosts_key", "offered_key", "remote_command", "resolve",
]

KEEPALIVE_S = 10
CONNECT_TIMEOUT_S = 15.0
CONNECT_TRIES = 3
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
TRANSFER_STALL_S = 60.0
NOT_FOUND_MARK = "gpuq-ssh: command not found"
MAX_OUTPUT_BYTES = 64 << 20  # a command's stdout plus stderr; a host printing without end is stopped here


@dataclass
class SSHOptions:
    known_hosts: Path
    trust_new_host_key: bool = False
    ssh_config: Path | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    keepalive_s: int = KEEPALIVE_S
    connect_tries: int = CONNECT_TRIES
    transfer_stall_s: float = TRANSFER_STALL_S
    max_output_bytes: int = MAX_OUTPUT_BYTES
    sleep: Callable[[float], None] = field(default=time.sleep)


_KNOWN_HOSTS_LOCK = threading.Lock()


class SSHHost(Host):
    """A host reached over SSH.  Lazily connects; ``close()`` releases the connection."""

    def __init__(self, name: str, endpoint: Endpoint, *, root: str, python: str, options: SSHOptions) -> None:
        self.name = name
        self.endpoint = endpoint
        self.root = root
        self.python = python or "python3"
        self.options = options
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._no_sftp = False  # the host's sshd has no SFTP subsystem: files go over exec channels
        self._lock = threading.RLock()
        self.connects = 0  # for tests and benchmarks: how many TCP connections this object made
        self.round_trips = 0
        self.trusted_keys: list[str] = []  # "<type> <base64>" of this host, accepted on first use by this object
        # jump hosts' keys accepted on first use, each with its own endpoint (never the host's key)
        self.trusted_hop_keys: list[tuple[Endpoint, str]] = []

    # --- connection ---------------------------------------------------------------

    def _new_client(self, endpoint: Endpoint) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        known = self.options.known_hosts
        # gpuq's file first and alone for a host it names; the user's file otherwise (read-only)
        trust = load_trust(known, Path.home() / ".ssh" / "known_hosts")
        client._host_keys = trust.own  # type: ignore[attr-defined]
        client._system_host_keys = user_keys_for(  # type: ignore[attr-defined]
            trust, known_hosts_key(endpoint.hostname, endpoint.port))
        policy = _Policy(self.name, known, self.options.trust_new_host_key, _KNOWN_HOSTS_LOCK, trust)
        client.set_missing_host_key_policy(policy)
        client._gpuq_policy = policy  # type: ignore[attr-defined]
        return client

    def _connect_one(self, endpoint: Endpoint, sock: Any) -> paramiko.SSHClient:
        client = self._new_client(endpoint)
        timeout = endpoint.connect_timeout_s or self.options.connect_timeout_s
        if sock is None and endpoint.proxy_command:
            try:
                sock = paramiko.ProxyCommand(endpoint.proxy_command)
            except (OSError, paramiko.SSHException) as exc:
                raise HostUnreachable(self.name, f"ProxyCommand for {endpoint.label()} failed to start: "
                                                 f"{_describe(exc)}") from exc
        try:
            client.connect(
                endpoint.hostname,
                port=endpoint.port,
                username=endpoint.user or None,
                key_filename=list(endpoint.key_files) or None,  # type: ignore[arg-type]  # stubs say str; list is documented
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                sock=sock,
                look_for_keys=not endpoint.key_files,
                # as OpenSSH: ssh-agent keys are offered alongside IdentityFile unless IdentitiesOnly
                allow_agent=not endpoint.identities_only,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                self.name,
                f"the SSH host key of {endpoint.label()} CHANGED: known {fingerprint(exc.expected_key)}, "
                f"offered {fingerprint(exc.key)}. Refusing to connect: this is either a re-created machine or "
                "someone intercepting the connection. If the machine was re-created, get its new "
                "fingerprint from the provider's console (not from this connection), then "
                f"`gpuq hosts trust {self.name} --fingerprint <that fingerprint>` replaces only this entry",
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            keys = ", ".join(endpoint.key_files) or "your default keys and ssh-agent"
            raise HostAuthFailed(
                self.name, f"{endpoint.label()} refused {keys}: add the public key to the host's "
                "~/.ssh/authorized_keys or pass --key"
            ) from exc
        except HostKeyError:
            client.close()
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise HostUnreachable(self.name, f"cannot connect to {endpoint.label()}: {_describe(exc)}") from exc
        transport = client.get_transport()
        policy: _Policy = client._gpuq_policy  # type: ignore[attr-defined]
        offered = transport.get_remote_server_key() if transport is not None else None
        if offered is not None and policy.trust.is_revoked(offered):
            client.close()
            raise HostKeyError(self.name, revoked_message(endpoint.label(), offered))
        if transport is not None:
            transport.set_keepalive(self.options.keepalive_s)
        if endpoint is self.endpoint:
            self.trusted_keys.extend(policy.trusted)
        else:
            self.trusted_hop_keys.extend((endpoint, key) for key in policy.trusted)
        return client

    def _open(self) -> paramiko.SSHClient:
        sock: Any = None
        jumps: list[paramiko.SSHClient] = []
        try:
            previous: paramiko.SSHClient | None = None
            for hop in self.endpoint.jump:
                if previous is not None:
                    sock = _tunnel(previous, hop, self.options.connect_timeout_s, self.name)
                previous = self._connect_one(hop, sock)
                jumps.append(previous)
            if previous is not None:
                sock = _tunnel(previous, self.endpoint, self.options.connect_timeout_s, self.name)
            client = self._connect_one(self.endpoint, sock)
        except BaseException:
            for j in jumps:
                j.close()
            raise
        self._jumps = jumps
        self.connects += 1
        return client

    def _connection(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return self._client
                self._drop()
            delay = BACKOFF_BASE_S
            for attempt in range(1, self.options.connect_tries + 1):
                try:
                    self._client = self._open()
                    return self._client
                except HostUnreachable as exc:
                    if attempt == self.options.connect_tries:
                        raise
                    wait = min(BACKOFF_CAP_S, delay) * (0.5 + random.random() / 2)
                    _log.info("%s; retry %d of %d in %.1f s", exc, attempt, self.options.connect_tries - 1, wait)
                    self.options.sleep(wait)
                    delay *= 2
            raise AssertionError("unreachable")  # pragma: no cover

    def _drop(self) -> None:
        for closer in (self._sftp, self._client, *self._jumps):
            if closer is not None:
                with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                    closer.close()
        self._sftp = None
        self._client = None
        self._jumps = []

    def close(self) -> None:
        with self._lock:
            self._drop()

    # --- commands -----------------------------------------------------------------

    def _session(self) -> paramiko.Channel:
        """A fresh session channel; a stale connection is replaced once."""
        for fresh in (False, True):
            client = self._connection()
            transport = client.get_transport()
            try:
                if transport is None:
                    raise paramiko.SSHException("no transport")
                return transport.open_session(timeout=self.options.connect_timeout_s)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                with self._lock:
                    self._drop()
                if fresh:
                    raise HostUnreachable(self.name, f"cannot open a session: {_describe(exc)}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        started = time.monotonic()
        chan = self._session()
        self.round_trips += 1
        try:
            code, out, err = exchange(chan, self.name, argv, remote_command(argv), stdin=stdin, timeout=timeout,
                                      cap=self.options.max_output_bytes)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            with self._lock:
                self._drop()
            raise HostUnreachable(self.name, f"connection lost while running {argv[0]}: {_describe(exc)}") from exc
        finally:
            close_channel(chan)
        if code < 0:  # the server sent no exit status: the session was torn down under us
            raise HostUnreachable(self.name, f"{argv[0]} ended without an exit status (connection dropped)")
        stderr = err.decode("utf-8", "replace")
        if code == 127 and stderr.endswith(NOT_FOUND_MARK + "\n"):
            raise HostUnreachable(self.name, f"cannot run {argv[0]}: no such command on the host")
        return CommandResult(host=self.name, argv=tuple(str(a) for a in argv), exit_code=code,
                             stdout=out.decode("utf-8", "replace"), stderr=stderr,
                             duration_s=time.monotonic() - started)

    # --- files --------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is not None:
                channel = self._sftp.get_channel()
                if channel is not None and not channel.closed:
                    return self._sftp
            client = self._connection()
            try:
                self._sftp = client.open_sftp()
                # a silently dead link fails a transfer after this long without a byte, instead
                # of blocking until TCP gives up (the pull retries and resumes from the offset)
                self._sftp.get_channel().settimeout(self.options.transfer_stall_s)  # type: ignore[union-attr]
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self._sftp = None
                raise HostUnreachable(self.name, f"cannot start SFTP on {self.endpoint.label()} (is its sshd's "
                                                 f"sftp subsystem installed and enabled?): {_describe(exc)}") from exc
            return self._sftp

    def _mkdirs(self, sftp: paramiko.SFTPClient, directory: str) -> None:
        try:
            sftp.stat(directory)
            return
        except FileNotFoundError:
            pass
        prefix = "/" if directory.startswith("/") else ""
        done: list[str] = []
        for part in (p for p in directory.split("/") if p):
            done.append(part)
            path = prefix + "/".join(done)
            try:
                sftp.stat(path)
            except FileNotFoundError:
                sftp.mkdir(path)

    def _files(self) -> paramiko.SFTPClient | None:
        """SFTP when the host offers it; None when its sshd has no SFTP subsystem (files then
        stream over exec channels, like ``scp -O``)."""
        if self._no_sftp:
            return None
        try:
            return self._sftp_client()
        except HostUnreachable:
            with self._lock:
                client = self._connection()  # still unreachable: that error is the real cause
                transport = client.get_transport()
                if transport is None or not transport.is_active():
                    raise
                self._no_sftp = True
            return None

    @contextlib.contextmanager
    def _dropping_on_unreachable(self) -> Iterator[None]:
        """A link that broke under an exec-channel transfer is closed, so the next call reconnects."""
        try:
            yield
        except HostUnreachable:
            self.close()
            raise

    def put(self, local: Path, remote: str, *, progress: Progress | None = None) -> None:
        directory, _, base = remote.rpartition("/")
        tmp = f"{directory}/.{base}.tmp.{os.getpid()}" if directory else f".{base}.tmp.{os.getpid()}"
        sftp = self._files()
        if sftp is None:
            from orchestrator.hosts.sshexec import exec_put

            with self._dropping_on_unreachable():
                exec_put(self._session(), self.name, local, remote, tmp, directory,
                         stall_s=self.options.transfer_stall_s, progress=progress)
            return
        try:
            if directory:
                self._mkdirs(sftp, directory)
            sftp.put(str(local), tmp, confirm=True,
                     callback=(lambda done, _total: progress(done)) if progress is not None else None)
            sftp.posix_rename(tmp, remote)
        except FileNotFoundError as exc:
            raise HostError(self.name, f"cannot write {remote}: {exc}") from exc
        except PermissionError as exc:
            raise HostError(self.name, f"cannot write {remote}: permission denied") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            with self._lock:
                self._drop()
            raise HostUnreachable(self.name, f"upload of {local.name} failed: {_describe(exc)}") from exc

    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None,
            progress: Progress | None = None) -> None:
        sftp = self._files()
        if sftp is None:
            from orchestrator.hosts.sshexec import exec_get

            with self._dropping_on_unreachable():
                exec_get(self._session(), self.name, remote, local, offset, size,
                         stall_s=self.options.transfer_stall_s, progress=progress)
            return
        try:
            remote_size = sftp.stat(remote).st_size or 0
            if stat.S_ISDIR(sftp.stat(remote).st_mode or 0):
                raise HostError(self.name, f"{remote} is a directory, not a file")
        except FileNotFoundError as exc:
            raise HostError(self.name, f"{remote} does not exist") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            with self._lock:
                self._drop()
            raise HostUnreachable(self.name, f"cannot read {remote}: {_describe(exc)}") from exc
        if size is not None and remote_size > size:
            raise too_big(self.name, remote, remote_size, size)
        limit = remote_size if size is None else min(size, remote_size)
        local.parent.mkdir(parents=True, exist_ok=True)
        mode = "r+b" if offset and local.exists() else "wb"
        try:
            with open(local, mode) as dst, sftp.open(remote, "rb") as src:
                dst.truncate(offset)
                dst.seek(offset)
                src.seek(offset)
                if limit > offset:
                    src.prefetch(limit)
                done = offset
                # never past the size seen (or expected): a file that grows meanwhile is not followed
                while done < limit and (block := src.read(min(CHUNK, limit - done))):
                    dst.write(block)
                    done += len(block)
                    if progress is not None:
                        progress(done)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if isinstance(exc, PermissionError):
                raise HostError(self.name, f"cannot read {remote}: permission denied") from exc
            with self._lock:
                self._drop()
            raise HostUnreachable(self.name, f"download of {remote} broke off: {_describe(exc)}") from exc


def remote_command(argv: Sequence[str]) -> str:
    """The command line for the remote login shell (POSIX sh family): every element quoted.

    A missing program exits 127 with a marker on stderr (``run`` raises HostUnreachable, as the
    Host contract says), and the trailing ``exit $?`` keeps the shell from exec'ing the program,
    so a command killed by signal N reports exit 128+N instead of a bare exit-signal (which
    paramiko drops, so it would read as a dropped connection).
    """
    program = shlex.quote(str(argv[0]))
    quoted = " ".join(shlex.quote(str(a)) for a in argv)
    return (f"command -v -- {program} >/dev/null 2>&1 || {{ echo {shlex.quote(NOT_FOUND_MARK)} >&2; exit 127; }}; "
            f"{quoted}; exit $?")


def _tunnel(via: paramiko.SSHClient, to: Endpoint, timeout: float, name: str) -> paramiko.Channel:
    transport = via.get_transport()
    try:
        if transport is None:
            raise paramiko.SSHException("jump host connection is closed")
        return transport.open_channel("direct-tcpip", (to.hostname, to.port), ("127.0.0.1", 0), timeout=timeout)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise HostUnreachable(name, f"the jump host cannot reach {to.label()}: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    return text or type(exc).__name__


def offered_key(name: str, endpoint: Endpoint, *, timeout: float = CONNECT_TIMEOUT_S) -> tuple[str, str, str]:
    """The host key ``endpoint`` offers now, without authenticating: (type, base64, fingerprint).

    Jump hosts on the way are verified as usual; only the last hop's key is read unverified,
    which is the point: the caller compares it with a fingerprint the user got out of band.
    """
    jumps = SSHHost(name, endpoint, root="/", python="", options=SSHOptions(known_hosts=Path(os.devnull)))
    sock: Any = None
    clients: list[paramiko.SSHClient] = []
    transport: paramiko.Transport | None = None
    try:
        previous: paramiko.SSHClient | None = None
        for hop in endpoint.jump:
            if previous is not None:
                sock = _tunnel(previous, hop, timeout, name)
            previous = jumps._connect_one(hop, sock)
            clients.append(previous)
        if previous is not None:
            sock = _tunnel(previous, endpoint, timeout, name)
        elif endpoint.proxy_command:
            sock = paramiko.ProxyCommand(endpoint.proxy_command)
        else:
            sock = socket.create_connection((endpoint.hostname, endpoint.port), timeout=timeout)
        transport = paramiko.Transport(sock)
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return key.get_name(), key.get_base64(), fingerprint(key)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise HostUnreachable(name, f"cannot read the host key of {endpoint.label()}: {_describe(exc)}") from exc
    finally:
        if transport is not None:
            transport.close()
        for client in clients:
            client.close()
