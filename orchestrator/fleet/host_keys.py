"""What gpuq's known_hosts file (``$GPUQ_HOME/known_hosts``) says of each host: a key trusted by its
fingerprint, a moved endpoint, keys forgotten with their host, under one cross-process lock."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from orchestrator.core.config import Settings
from orchestrator.core.errors import HostError, HostKeyError, UsageError
from orchestrator.fleet.registry import over_ssh
from orchestrator.ledger import HostRow, Ledger

if TYPE_CHECKING:  # paramiko loads only when a command talks to an SSH host (fast `gpuq --help`)
    from orchestrator.hosts.sshconfig import Endpoint


def _known_lock(settings: Settings) -> contextlib.AbstractContextManager[None]:
    """The cross-process lock on gpuq's known_hosts; a holder may nest it (``trust`` calls
    ``forget_keys``) without blocking on its own flock."""
    return _ReentrantKnownLock(settings.home / "known_hosts")


class _ReentrantKnownLock:
    _held: ClassVar[dict[Path, int]] = {}

    def __init__(self, path: Path) -> None:
        self.path = path
        self._inner: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> None:
        depth = self._held.get(self.path, 0)
        if depth == 0:
            from orchestrator.hosts.knownhosts import locked

            self._inner = locked(self.path)
            self._inner.__enter__()
        self._held[self.path] = depth + 1

    def __exit__(self, *exc: object) -> None:
        self._held[self.path] -= 1
        if self._held[self.path] == 0 and self._inner is not None:
            self._inner.__exit__(None, None, None)


def _known_lines(settings: Settings) -> list[str]:
    path = settings.home / "known_hosts"
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else []


def _write_known(settings: Settings, lines: Iterable[str]) -> None:
    path = settings.home / "known_hosts"
    tmp = path.with_name(f".known_hosts.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.writelines(f"{line}\n" for line in lines)
    os.replace(tmp, path)


def known_key(settings: Settings, endpoint: Endpoint) -> str:
    from orchestrator.hosts.sshconfig import known_hosts_key

    marker = known_hosts_key(endpoint.hostname, endpoint.port)
    for line in _known_lines(settings):
        parts = line.split()
        if len(parts) >= 3 and marker in parts[0].split(","):
            return f"{parts[1]} {parts[2]}"
    return ""


def forget_keys(settings: Settings, endpoint: Endpoint, *, only: Iterable[str] | None = None) -> int:
    """Drop this endpoint's entries from gpuq's known_hosts (``only``: just these "<type> <b64>" keys)."""
    from orchestrator.hosts.sshconfig import known_hosts_key

    keep_only = set(only) if only is not None else None
    if keep_only is not None and not keep_only:
        return 0
    marker = known_hosts_key(endpoint.hostname, endpoint.port)
    kept, dropped = [], 0
    with _known_lock(settings):
        for line in _known_lines(settings):
            parts = line.split()
            mine = len(parts) >= 3 and marker in parts[0].split(",")
            if mine and (keep_only is None or f"{parts[1]} {parts[2]}" in keep_only):
                dropped += 1
                continue
            kept.append(line)
        if dropped:
            _write_known(settings, kept)
    return dropped


def trust(ledger: Ledger, settings: Settings, name: str, fingerprint_: str) -> str:
    """Replace one host's known key with the key it offers now, if that key has the fingerprint given."""
    from orchestrator.hosts.sshconfig import known_hosts_key, resolve
    from orchestrator.hosts.sshconnect import offered_key

    row = ledger.host(name)
    if row is None or not over_ssh(row):
        raise UsageError(f'unknown SSH host "{name}"; `gpuq hosts list` shows the registered ones')
    endpoint = resolve(row.target, port=row.port, user=row.user, key_file=row.key_path)
    key_type, key_b64, offered_fp = offered_key(name, endpoint)
    if offered_fp != fingerprint_:
        raise HostKeyError(name, f"{endpoint.label()} offers {offered_fp}, not {fingerprint_}; nothing changed")
    marker = known_hosts_key(endpoint.hostname, endpoint.port)
    with _known_lock(settings):
        forget_keys(settings, endpoint)
        _write_known(settings, [*_known_lines(settings), f"{marker} {key_type} {key_b64}"])
    ledger.update_host(name, host_key=f"{key_type} {key_b64}")
    ledger.record_event("host", name, f"host key replaced by the user: now {offered_fp}")
    return offered_fp


def move_endpoint(ledger: Ledger, settings: Settings, name: str, target: str, port: int) -> None:
    """The same machine answers at a new address or port (a RunPod pod after a resume: ports change
    on every start).  Its recorded host key is pinned for the new endpoint, never trusted anew: a
    machine that offers another key there is refused like any changed key."""
    from orchestrator.hosts.sshconfig import known_hosts_key, resolve

    row = ledger.host(name)
    if row is None or row.kind != "ssh":
        raise UsageError(f'unknown SSH host "{name}"; `gpuq hosts list` shows the registered ones')
    if not row.host_key:
        raise HostKeyError(name, "no host key recorded for this host; cannot follow it to a new endpoint")
    endpoint = resolve(target, port=port, user=row.user, key_file=row.key_path)
    marker = known_hosts_key(endpoint.hostname, endpoint.port)
    with _known_lock(settings):
        lines = [line for line in _known_lines(settings)
                 if line.split() and marker not in line.split()[0].split(",")]
        _write_known(settings, [*lines, f"{marker} {row.host_key}"])
    ledger.update_host(name, target=target, port=port)
    ledger.record_event("host", name, f"now at {endpoint.label()} (same host key {key_fingerprint(row.host_key)})")


def key_fingerprint(key_line: str) -> str:
    """SHA256 fingerprint of a "<type> <base64>" key, as OpenSSH prints it ("" if none)."""
    import base64
    import hashlib

    parts = key_line.split()
    if len(parts) < 2:
        return ""
    try:
        blob = base64.b64decode(parts[1])
    except ValueError:
        return ""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def forget_row_keys(settings: Settings, row: HostRow) -> int:
    """Forget the key pinned for a host's endpoint (a terminated rental: RunPod reuses IP:port)."""
    from orchestrator.hosts.sshconfig import resolve

    if not over_ssh(row):
        return 0
    try:
        return forget_keys(settings, resolve(row.target, port=row.port, user=row.user, key_file=row.key_path))
    except HostError:  # an alias that no longer resolves: its key entry cannot be named either
        return 0


def forget_host(ledger: Ledger, settings: Settings, row: HostRow) -> None:
    """Drop the host from the ledger and its key from gpuq's known_hosts."""
    from orchestrator.hosts.sshconfig import resolve

    if over_ssh(row):
        # an alias that no longer resolves: its key entry cannot be named either
        with contextlib.suppress(HostError):
            forget_keys(settings, resolve(row.target, port=row.port, user=row.user, key_file=row.key_path))
    ledger.remove_host(row.name, "removed by the user")
