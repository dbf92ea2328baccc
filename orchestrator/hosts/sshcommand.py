"""One command's exchange over an open SSH session channel: stdin fed between reads, output capped,
the exit status awaited with a short grace for the output that follows it.

``SSHHost.run`` opens the channel, calls :func:`exchange` and turns a transport failure into
``HostUnreachable``; this module never connects.  Errors: ``HostError`` when the command prints past
the cap (a host that prints without end is not trusted), ``HostUnreachable`` at the timeout.
"""

from __future__ import annotations

import select
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import paramiko

from orchestrator.core.errors import HostError, HostUnreachable

CHUNK = 1 << 20
STDIN_CHUNK = 1 << 15
EOF_GRACE_S = 2.0


@dataclass
class Exchange:
    """What one command sent back so far, and what of its stdin is still to be fed."""

    chan: paramiko.Channel
    host: str
    argv: Sequence[str]
    cap: int
    pending: memoryview
    out: list[bytes] = field(default_factory=list)
    err: list[bytes] = field(default_factory=list)
    received: int = 0
    status_at: float | None = None

    def drain(self) -> None:
        """Read what is ready on stdout and stderr; past the cap, stop reading (HostError)."""
        while self.chan.recv_ready():
            self.out.append(self.chan.recv(CHUNK))
            self.received += len(self.out[-1])
        while self.chan.recv_stderr_ready():
            self.err.append(self.chan.recv_stderr(CHUNK))
            self.received += len(self.err[-1])
        if self.received > self.cap:
            raise HostError(self.host, f"{self.argv[0]} printed more than {self.cap >> 20} MiB; gpuq stopped "
                                       "reading its output (a host that prints without end is not trusted)")

    def feed(self) -> bool:
        """Send the next piece of stdin when the channel takes it; True when something was sent.  stdin
        is fed between reads, never in one blocking sendall: a command that echoes its input (cat) would
        otherwise fill both windows and wait for us forever."""
        if self.pending and (self.chan.closed or self.chan.status_event.is_set()):
            self.pending = memoryview(b"")  # the command stopped reading: the rest has no reader
        if not (self.pending and self.chan.send_ready()):
            return False
        sent = self.chan.send(bytes(self.pending[:STDIN_CHUNK]))
        self.pending = self.pending[sent:]
        if not self.pending:
            self.chan.shutdown_write()
        return True

    def finished(self) -> bool:
        """OpenSSH may send the exit status before the last output: done at EOF (or the close) after the
        status, but not waiting for a background process that kept the pipes open."""
        if self.chan.status_event.is_set() and self.status_at is None:
            self.status_at = time.monotonic()
        if self.chan.closed:
            return True
        return self.status_at is not None and (bool(self.chan.eof_received)
                                               or time.monotonic() - self.status_at > EOF_GRACE_S)


def exchange(chan: paramiko.Channel, host: str, argv: Sequence[str], command: str, *, stdin: bytes | None,
             timeout: float, cap: int) -> tuple[int, bytes, bytes]:
    """Run ``command`` on ``chan``: (exit code, or -1 when the server sent none; stdout; stderr)."""
    ex = Exchange(chan, host, argv, cap, memoryview(stdin or b""))
    deadline = time.monotonic() + timeout
    chan.exec_command(command)
    if not ex.pending:
        chan.shutdown_write()
    while True:
        ex.drain()
        if ex.feed():
            continue
        if ex.finished():
            ex.drain()
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise HostUnreachable(host, f"{argv[0]} did not finish within {timeout:.0f} s")
        select.select([chan], [], [], min(left, 0.01 if ex.pending else 0.1 if ex.status_at else 1.0))
    code = chan.exit_status if chan.status_event.is_set() else -1
    return code, b"".join(ex.out), b"".join(ex.err)
