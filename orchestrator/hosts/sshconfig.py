"""Where an SSH target leads: ``~/.ssh/config`` applied the way OpenSSH reads it, and key names.

``resolve`` turns ``user@address[:port]`` or an alias (HostName, User, Port, IdentityFile,
IdentitiesOnly, ProxyJump, ProxyCommand, ConnectTimeout) into an Endpoint; explicit values win
over the config.  Like OpenSSH, the user's file is read first and ``/etc/ssh/ssh_config`` after it,
and the first value obtained wins (IdentityFile accumulates).  A jump host's own ProxyJump is
followed (the chain is flattened, outermost hop first).  Split from ssh.py, which
connects; the SSH modules of hosts/ are the only ones that import paramiko.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import paramiko

from orchestrator.core.errors import HostError


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect, after ``~/.ssh/config`` is applied."""

    hostname: str
    port: int = 22
    user: str = ""
    key_files: tuple[str, ...] = ()
    jump: tuple[Endpoint, ...] = ()
    alias: str = ""
    proxy_command: str = ""  # tokens already expanded; used when there is no ProxyJump
    identities_only: bool = False  # IdentitiesOnly yes: the named keys only, no ssh-agent
    connect_timeout_s: float | None = None

    def label(self) -> str:
        where = self.hostname if self.port == 22 else f"{self.hostname}:{self.port}"
        return f"{self.user}@{where}" if self.user else where


def _split_target(target: str) -> tuple[str, str, int | None]:
    user, _, rest = target.rpartition("@")
    port: int | None = None
    if rest.startswith("["):  # [v6addr]:port or [host]:port
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":") and tail[1:].isdigit():
            port = int(tail[1:])
        return user, host, port
    if rest.count(":") == 1:
        host, _, maybe = rest.partition(":")
        if maybe.isdigit():
            return user, host, int(maybe)
    return user, rest, port


SYSTEM_SSH_CONFIG = Path("/etc/ssh/ssh_config")


def _lookup(path: Path, host: str, target: str) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        config = paramiko.SSHConfig.from_path(str(path))
        return dict(config.lookup(host))
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise HostError(target, f"cannot read {path}: {exc}") from exc


def resolve(
    target: str,
    *,
    port: int | None = None,
    user: str = "",
    key_file: str = "",
    ssh_config: Path | None = None,
    system_config: Path | None = SYSTEM_SSH_CONFIG,
    _depth: int = 0,
) -> Endpoint:
    """Apply ``~/.ssh/config`` to ``target`` the way OpenSSH would (explicit values win)."""
    if _depth > 5:
        raise HostError(target, "ProxyJump chain is longer than 5 hops (a loop in ~/.ssh/config?)")
    t_user, t_host, t_port = _split_target(target)
    if not t_host:
        raise HostError(target, "no address in the SSH target; use user@address or an ~/.ssh/config alias")
    cfg_path = ssh_config if ssh_config is not None else Path.home() / ".ssh" / "config"
    looked = _lookup(cfg_path, t_host, target)
    system = _lookup(system_config, t_host, target) if system_config is not None else {}
    if looked.get("hostname") == t_host and system.get("hostname"):
        looked.pop("hostname")  # paramiko fills in the target itself: not a value the user set
    for key, value in system.items():
        if key == "identityfile":
            looked["identityfile"] = [*looked.get("identityfile", []), *value]
        else:
            looked.setdefault(key, value)
    hostname = str(looked.get("hostname") or t_host)
    final_port = port or t_port or int(looked.get("port") or 22)
    final_user = user or t_user or str(looked.get("user") or "")
    keys = tuple([key_file] if key_file else [os.path.expanduser(k) for k in looked.get("identityfile", [])])
    jumps: list[Endpoint] = []
    proxy = str(looked.get("proxyjump") or "")
    if proxy and proxy.lower() != "none":
        for i, hop in enumerate(proxy.split(",")):
            resolved = resolve(hop.strip(), ssh_config=cfg_path, system_config=system_config, _depth=_depth + 1)
            if i == 0:
                jumps.extend(resolved.jump)  # the first hop's own ProxyJump leads to it (as ssh -J does)
            jumps.append(replace(resolved, jump=(), proxy_command=resolved.proxy_command if i == 0 else ""))
    command = str(looked.get("proxycommand") or "")
    timeout = str(looked.get("connecttimeout") or "")
    return Endpoint(
        hostname, final_port, final_user, keys, tuple(jumps), alias=t_host if looked else "",
        proxy_command="" if jumps or command.lower() == "none" else command,
        identities_only=str(looked.get("identitiesonly") or "").lower() == "yes",
        connect_timeout_s=float(timeout) if timeout.isdigit() and int(timeout) > 0 else None,
    )


def known_hosts_key(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
