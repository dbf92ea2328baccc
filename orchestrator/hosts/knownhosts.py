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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko


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
