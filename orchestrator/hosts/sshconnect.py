"""One SSH host's connection (paramiko): host keys verified, jump hosts tunnelled, connecting retried
with capped backoff, one connection reused by every call (``ssh.SSHHost`` runs commands and moves files
over it); and ``offered_key``, the key a host offers now, read before it is trusted."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from orchestrator.core.errors import HostAuthFailed, HostKeyError, HostUnreachable
from orchestrator.hosts.knownhosts import TrustPolicy as _Policy
from orchestrator.hosts.knownhosts import load_trust, revoked_message, user_keys_for
from orchestrator.hosts.sshconfig import Endpoint, fingerprint, known_hosts_key

# paramiko logs a dropped link ("Socket exception: Connection reset by peer") through Python's
# last-resort handler straight onto the user's terminal; gpuq reports transport failures itself
# (HostUnreachable, "unreachable since T"), so paramiko's records go nowhere unless a caller
# configures logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
_log = logging.getLogger("orchestrator.hosts.sshconnect")


KEEPALIVE_S = 10


CONNECT_TIMEOUT_S = 15.0


CONNECT_TRIES = 3


BACKOFF_BASE_S = 0.5


BACKOFF_CAP_S = 8.0


TRANSFER_STALL_S = 60.0


MAX_OUTPUT_BYTES = 64 << 20  # a command's stdout plus stderr; a host printing without end is stopped here


SYSTEM_SSH_MIN_BYTES = 8 << 20  # a file this large goes through the system ssh when it can (sshsystem.py)


# paramiko's defaults (2 MiB window, 32 KiB packets) stall a fast link on window updates
WINDOW_BYTES = 64 << 20


PACKET_BYTES = 1 << 15


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
    system_ssh: bool = True  # large files through the system OpenSSH client when it is as strict (sshsystem.py)
    system_ssh_min_bytes: int = SYSTEM_SSH_MIN_BYTES
    sleep: Callable[[float], None] = field(default=time.sleep)


_KNOWN_HOSTS_LOCK = threading.Lock()



class SSHConnection:
    """One host's SSH connection (and its jump hosts'): made lazily, reused, dropped and remade."""

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
        self.system_transfers = 0  # for tests and benchmarks: files moved by the system ssh client
        self._system_argv: list[str] | None = None
        self._system_checked = False
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
                                                 f"{reason_of(exc)}") from exc
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
            raise HostUnreachable(self.name, f"cannot connect to {endpoint.label()}: {reason_of(exc)}") from exc
        transport = client.get_transport()
        policy: _Policy = client._gpuq_policy  # type: ignore[attr-defined]
        offered = transport.get_remote_server_key() if transport is not None else None
        if offered is not None and policy.trust.is_revoked(offered):
            client.close()
            raise HostKeyError(self.name, revoked_message(endpoint.label(), offered))
        if transport is not None:
            _tune(transport, self.options.keepalive_s)
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
                    raise HostUnreachable(self.name, f"cannot open a session: {reason_of(exc)}") from exc
        raise AssertionError("unreachable")  # pragma: no cover


def _tune(transport: paramiko.Transport, keepalive_s: int) -> None:
    transport.set_keepalive(keepalive_s)
    transport.default_window_size = WINDOW_BYTES  # every channel opened from now on (sessions, SFTP)
    transport.default_max_packet_size = PACKET_BYTES


def _tunnel(via: paramiko.SSHClient, to: Endpoint, timeout: float, name: str) -> paramiko.Channel:
    transport = via.get_transport()
    try:
        if transport is None:
            raise paramiko.SSHException("jump host connection is closed")
        return transport.open_channel("direct-tcpip", (to.hostname, to.port), ("127.0.0.1", 0), timeout=timeout)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise HostUnreachable(name, f"the jump host cannot reach {to.label()}: {reason_of(exc)}") from exc


def reason_of(exc: BaseException) -> str:
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
    jumps = SSHConnection(name, endpoint, root="/", python="", options=SSHOptions(known_hosts=Path(os.devnull)))
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
        raise HostUnreachable(name, f"cannot read the host key of {endpoint.label()}: {reason_of(exc)}") from exc
    finally:
        if transport is not None:
            transport.close()
        for client in clients:
            client.close()
