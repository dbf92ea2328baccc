"""Which host keys gpuq trusts: gpuq's own known_hosts first, then the user's, read like OpenSSH.

- gpuq's file (``$GPUQ_HOME/known_hosts``) wins: a host named there is checked against gpuq's
  entries only, so a key the user re-trusted with ``gpuq hosts trust`` is not overruled by a stale
  line in ``~/.ssh/known_hosts`` (docs/security.md).
- ``@revoked`` lines in either file name keys that are refused wherever they are offered.
- ``@cert-authority`` lines are remembered so that a host trusted only through a certificate
  authority gets a clear refusal (gpuq pins plain host keys; it does not check host certificates).
- A line paramiko cannot read is skipped, never a traceback.
- Every edit of gpuq's file happens under an exclusive ``fcntl`` lock on a lock file beside it, so
  two gpuq processes recording keys at once both keep their entries.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from orchestrator.core.errors import HostKeyError
from orchestrator.hosts.sshconfig import fingerprint


@dataclass
class Trust:
    own: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    user: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: set[str] = field(default_factory=set)  # "<type> <base64>"
    cert_authorities: list[str] = field(default_factory=list)  # host patterns of @cert-authority lines

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return f"{key.get_name()} {key.get_base64()}" in self.revoked

    def certificate_only(self, hostname: str) -> bool:
        """True when only an ``@cert-authority`` line speaks for ``hostname``."""
        names = {hostname, hostname.strip("[").split("]")[0]}
        for patterns in self.cert_authorities:
            wanted = [p for p in patterns.split(",") if not p.startswith("!")]
            if any(fnmatch.fnmatch(n, p) for n in names for p in wanted):
                return True
        return False


def _read(path: Path, into: paramiko.HostKeys, trust: Trust) -> None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return  # an unreadable file is skipped: the other file still applies
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            parts = line.split()
            if parts[0] == "@revoked" and len(parts) >= 4:
                trust.revoked.add(f"{parts[2]} {parts[3]}")
            elif parts[0] == "@cert-authority" and len(parts) >= 2:
                trust.cert_authorities.append(parts[1])
            continue  # any other marker is not a plain key: skipped
        entry = None
        with contextlib.suppress(Exception):  # paramiko raises several types for a malformed line
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
        if entry is None or entry.key is None:
            continue
        for name in entry.hostnames:
            into.add(name, entry.key.get_name(), entry.key)


def load_trust(own_file: Path, user_file: Path) -> Trust:
    trust = Trust()
    if own_file.is_file():
        _read(own_file, trust.own, trust)
    if user_file.is_file():
        _read(user_file, trust.user, trust)
    return trust


def user_keys_for(trust: Trust, hostname: str) -> paramiko.HostKeys:
    """The user's keys to consult for ``hostname``: none when gpuq's file names it (gpuq's wins)."""
    return paramiko.HostKeys() if trust.own.lookup(hostname) is not None else trust.user


@contextlib.contextmanager
def locked(known_hosts: Path) -> Iterator[None]:
    """Hold the cross-process lock for editing ``known_hosts`` (a ``.lock`` file beside it)."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(known_hosts.with_name(known_hosts.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class TrustPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse, or (trust on first use) record it in the gpuq known_hosts file."""

    def __init__(self, host_name: str, known_hosts: Path, trust_new: bool, lock: threading.Lock,
                 trust: Trust) -> None:
        self.host_name = host_name
        self.known_hosts = known_hosts
        self.trust_new = trust_new
        self.lock = lock
        self.trust = trust
        self.trusted: list[str] = []

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}"
        if self.trust.is_revoked(key):
            raise HostKeyError(self.host_name, revoked_message(hostname, key))
        if self.trust.certificate_only(hostname):
            raise HostKeyError(
                self.host_name,
                f"{hostname} is trusted only through an @cert-authority line in ~/.ssh/known_hosts, and gpuq "
                f"does not check host certificates; it offers {key.get_name()} {fingerprint(key)}: confirm "
                "that fingerprint with the machine's owner or console, then run the command again with "
                "--trust-new-host-key to pin the key itself",
            )
        if not self.trust_new:
            raise HostKeyError(
                self.host_name,
                f"unknown SSH host key for {hostname} ({key.get_name()} {fingerprint(key)}); "
                "check the fingerprint with the machine's owner or console, then run the command again "
                "with --trust-new-host-key to trust it (recorded in gpuq's known_hosts)",
            )
        with self.lock, locked(self.known_hosts):
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.trusted.append(f"{key.get_name()} {key.get_base64()}")


def revoked_message(where: str, key: paramiko.PKey) -> str:
    return (f"{where} offers the host key {key.get_name()} {fingerprint(key)}, which a known_hosts file marks "
            "@revoked; refusing to connect. Ask the machine's owner for its new key")
