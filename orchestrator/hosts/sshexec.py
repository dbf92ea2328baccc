"""File transfers over an exec channel, for hosts whose sshd has no SFTP subsystem.

Like ``scp -O``: the file streams through ``cat`` on the host.  An upload lands in a temporary
name, its byte count is checked on the host, then it is renamed into place (the caller verifies
the sha256 as for SFTP); a download resumes from ``offset`` with ``tail -c``.  Every path is
shell-quoted.  Errors are the Host contract's: HostError for the file, HostUnreachable for the link
(the caller, ``SSHHost``, opens the session channel and drops its connection on HostUnreachable).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import paramiko

from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.hosts.base import Digest, Progress, too_big

CHUNK = 1 << 20
_MARK = "gpuq-ssh:"


def close_channel(chan: paramiko.Channel) -> None:
    """Close a session channel whose connection may already be gone. paramiko raises EOFError when the
    close cannot be sent; in a ``finally`` that would replace the error being raised (the host's real
    answer, such as output past the cap) and leave the command as a bare EOFError, which click turns
    into "aborted"."""
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        chan.close()


def _stderr(chan: paramiko.Channel) -> str:
    parts: list[bytes] = []
    while True:
        block = chan.recv_stderr(1 << 15)
        if not block:
            break
        parts.append(block)
        if sum(map(len, parts)) > 1 << 16:
            break
    return b"".join(parts).decode("utf-8", "replace").strip()


def put_script(remote: str, tmp: str, directory: str, size: int) -> str:
    """The host's side of an upload: stdin into ``tmp``, its byte count checked, renamed to ``remote``."""
    q = shlex.quote
    mkdir = f"mkdir -p -- {q(directory)} && " if directory else ""
    return (f"{mkdir}cat > {q(tmp)} && [ $(wc -c < {q(tmp)}) -eq {size} ] && mv -f -- {q(tmp)} {q(remote)} "
            f"|| {{ rm -f -- {q(tmp)}; echo '{_MARK} write failed' >&2; exit 1; }}")


def put_failure(host: str, remote: str, err: str, code: int) -> HostError:
    detail = err.replace(f"{_MARK} write failed", "").strip() or f"exit {code}"
    return HostError(host, f"cannot write {remote}: {detail}")


def get_script(remote: str, offset: int) -> str:
    """The host's side of a download: ``remote`` from ``offset`` on to stdout; marks for a directory or nothing."""
    q = shlex.quote
    return (f"if [ -d {q(remote)} ]; then echo '{_MARK} directory' >&2; exit 3; fi; "
            f"[ -f {q(remote)} ] || {{ echo '{_MARK} missing' >&2; exit 3; }}; "
            f"tail -c +{offset + 1} -- {q(remote)}")


def get_failure(host: str, remote: str, err: str, code: int) -> HostError:
    if f"{_MARK} directory" in err:
        return HostError(host, f"{remote} is a directory, not a file")
    if f"{_MARK} missing" in err:
        return HostError(host, f"{remote} does not exist")
    return HostError(host, f"cannot read {remote}: {err or f'exit {code}'}")


def exec_put(chan: paramiko.Channel, host: str, local: Path, remote: str, tmp: str, directory: str, *,
             stall_s: float, progress: Progress | None = None) -> None:
    """Upload ``local`` to ``remote`` through ``cat`` on the open session channel ``chan`` of ``host``."""
    size = local.stat().st_size
    script = put_script(remote, tmp, directory, size)
    try:
        chan.settimeout(stall_s)
        chan.exec_command(script)
        with open(local, "rb") as src:
            sent = 0
            while block := src.read(CHUNK):
                chan.sendall(block)
                sent += len(block)
                if progress is not None:
                    progress(sent)
        chan.shutdown_write()
        err = _stderr(chan)
        code = chan.recv_exit_status()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise HostUnreachable(host, f"upload of {local.name} failed: {exc or type(exc).__name__}") from exc
    finally:
        close_channel(chan)
    if code != 0:
        raise put_failure(host, remote, err, code)


def receive(blocks: Iterable[bytes], dst: IO[bytes], done: int, host: str, remote: str, size: int | None,
            digest: Digest | None, progress: Progress | None) -> int:
    """A download's bytes written as they come, after the ``done`` already held: never past ``size`` (stops
    reading there), hashed as written, progress told; returns the bytes now held (both download paths)."""
    for block in blocks:
        if size is not None and done + len(block) > size:
            raise too_big(host, remote, done + len(block), size)
        dst.write(block)
        if digest is not None:
            digest.update(block)
        done += len(block)
        if progress is not None:
            progress(done)
    return done


def exec_get(chan: paramiko.Channel, host: str, remote: str, local: Path, offset: int, size: int | None = None, *,
             stall_s: float, progress: Progress | None = None, digest: Digest | None = None) -> None:
    """Download ``remote`` from ``offset`` on into ``local`` through ``tail -c`` on the open channel ``chan``."""
    script = get_script(remote, offset)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        chan.settimeout(stall_s)
        chan.exec_command(script)
        with open(local, "r+b" if offset and local.exists() else "wb") as dst:
            dst.truncate(offset)
            dst.seek(offset)
            receive(iter(lambda: chan.recv(CHUNK), b""), dst, offset, host, remote, size, digest, progress)
        err = _stderr(chan)
        code = chan.recv_exit_status()
    except PermissionError as exc:
        raise HostError(host, f"cannot write {local}: permission denied") from exc
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise HostUnreachable(host, f"download of {remote} broke off: {exc or type(exc).__name__}") from exc
    finally:
        close_channel(chan)
    if code != 0:
        raise get_failure(host, remote, err, code)
