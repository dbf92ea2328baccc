"""SSHHost: a remote machine over SSH (paramiko): commands and files over the connection ``sshconnect.py`` keeps.

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
  (sshexec.py); a large one through the system ``ssh`` when it checks the host key as strictly
  (sshsystem.py); a download never reads past the size the caller expects, and feeds what it
  writes to the caller's digest.
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
import shlex
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import paramiko

from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.core.specs import CommandResult
from orchestrator.hosts.base import Digest, Host, Progress, too_big
from orchestrator.hosts.sshcommand import CHUNK, exchange
from orchestrator.hosts.sshconnect import SSHConnection, reason_of
from orchestrator.hosts.sshexec import close_channel

__all__ = ["SSHHost", "remote_command"]

NOT_FOUND_MARK = "gpuq-ssh: command not found"

_log = logging.getLogger(__name__)


class SSHHost(SSHConnection, Host):
    """A host reached over SSH.  Lazily connects; ``close()`` releases the connection."""

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
            raise HostUnreachable(self.name, f"connection lost while running {argv[0]}: {reason_of(exc)}") from exc
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
                                                 f"sftp subsystem installed and enabled?): {reason_of(exc)}") from exc
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

    def _system(self, nbytes: int) -> list[str] | None:
        """The system ssh's argv for a transfer of ``nbytes``, or None for paramiko's path."""
        if not self.options.system_ssh or nbytes < self.options.system_ssh_min_bytes:
            return None
        if not self._system_checked:
            from orchestrator.hosts.sshsystem import system_ssh

            self._connection()  # paramiko checks (and on first use records) the host key first
            self._system_argv = system_ssh(self.endpoint, self.options.known_hosts,
                                           connect_timeout_s=self.endpoint.connect_timeout_s
                                           or self.options.connect_timeout_s)
            self._system_checked = True
        return self._system_argv

    def _system_failed(self, why: str) -> None:
        _log.info("%s: the system ssh client cannot be used (%s); files go through paramiko", self.name, why)
        self._system_argv = None

    def put(self, local: Path, remote: str, *, progress: Progress | None = None) -> None:
        directory, _, base = remote.rpartition("/")
        tmp = f"{directory}/.{base}.tmp.{os.getpid()}" if directory else f".{base}.tmp.{os.getpid()}"
        system = self._system(local.stat().st_size)
        if system is not None:
            from orchestrator.hosts.sshsystem import SystemSSHUnusable, system_put

            try:
                system_put(system, self.name, local, remote, tmp, directory, stall_s=self.options.transfer_stall_s,
                           progress=progress)
                self.system_transfers += 1
                return
            except SystemSSHUnusable as exc:
                self._system_failed(str(exc))
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
            raise HostUnreachable(self.name, f"upload of {local.name} failed: {reason_of(exc)}") from exc

    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None,
            progress: Progress | None = None, digest: Digest | None = None) -> None:
        system = self._system(size - offset) if size is not None else None
        if system is not None:
            from orchestrator.hosts.sshsystem import SystemSSHUnusable, system_get

            try:
                system_get(system, self.name, remote, local, offset, size, stall_s=self.options.transfer_stall_s,
                           progress=progress, digest=digest)
                self.system_transfers += 1
                return
            except SystemSSHUnusable as exc:
                self._system_failed(str(exc))
        sftp = self._files()
        if sftp is None:
            from orchestrator.hosts.sshexec import exec_get

            with self._dropping_on_unreachable():
                exec_get(self._session(), self.name, remote, local, offset, size,
                         stall_s=self.options.transfer_stall_s, progress=progress, digest=digest)
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
            raise HostUnreachable(self.name, f"cannot read {remote}: {reason_of(exc)}") from exc
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
                    if digest is not None:
                        digest.update(block)
                    done += len(block)
                    if progress is not None:
                        progress(done)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if isinstance(exc, PermissionError):
                raise HostError(self.name, f"cannot read {remote}: permission denied") from exc
            with self._lock:
                self._drop()
            raise HostUnreachable(self.name, f"download of {remote} broke off: {reason_of(exc)}") from exc


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


