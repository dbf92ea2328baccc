"""Every error gpuq raises on purpose, in one tree.

The CLI catches :class:`GpuqError` in exactly one place, prints ``str(err)``
(one clear line, or a few for multi-error reports) and exits with
``err.exit_code``.  Anything that is not a ``GpuqError`` is a bug and shows
its traceback.  Foreign exceptions (sqlite3, SQLAlchemy, OSError from a
subprocess, paramiko, httpx) are translated at the module that touches them.

::

    GpuqError                      exit 1   (the codes: orchestrator/core/exitcodes.py)
    ├── UsageError                 exit 2   the user asked for something malformed
    │   ├── ConfigError                     settings / profile file problems
    │   ├── QueueParseError                 every problem of one queue file at once
    │   └── JobNotFound                     a job reference matches nothing / is ambiguous
    ├── WaitTimeout                exit 4   `gpuq wait --timeout` ran out
    ├── LedgerError                         the SQLite ledger cannot do what was asked
    │   ├── IllegalTransition               a state change not in states.ALLOWED
    │   └── LedgerVersionError              ledger written by a newer gpuq
    ├── HostError                           a host could not do what was asked
    │   ├── HostUnreachable                 transport failed (never a verdict on a job)
    │   ├── HostKeyError                    the host's SSH key is unknown or changed (fail closed)
    │   ├── HostAuthFailed                  the host refused our SSH key
    │   ├── CommandFailed                   a remote command exited non-zero
    │   ├── AgentRefused                    the host agent ran and gave no answer (agent/client.py)
    │   └── TransferError                   `gpuq pull` could not get a job's manifest or files
    ├── ProtocolError                       a host answered with something that is not a gpuq document
    │                                       (orchestrator/host_documents: that host only is affected)
    ├── AgentError                          the host agent refused or failed
    ├── BundleError                         the bundle could not be built or placed
    └── ProviderError                       a cloud provider API refused or failed (raw code kept)
        ├── ProviderAuthError               missing, rejected or inactive API key (never shows the key)
        ├── NoCapacity                      no machines of the requested kind right now (retry later)
        ├── RateLimited                     HTTP 429 persisted through every bounded retry
        ├── ProviderUnreachable             network error, timeout or 5xx through every retry;
        │   │                               the outcome of the last call is unknown
        │   └── CreateUnknown               a create that erred or timed out, its machine not found
        │                                   by name yet: it may exist and bill (looked up, row kept)
        ├── ProvisioningFailed              an instance never became ready (stuck, or died while booting)
        └── ProviderUnsupported             the provider has no such operation (Lambda has no stop or spot)

Every subclass of ``GpuqError`` anywhere in ``orchestrator/`` is drawn here
(``tests/unit/test_error_tree.py`` fails otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core import exitcodes


class GpuqError(Exception):
    """Base of every deliberate gpuq error."""

    exit_code = exitcodes.FAILED


class UsageError(GpuqError):
    """The user asked for something malformed; nothing was changed."""

    exit_code = exitcodes.USAGE


class WaitTimeout(GpuqError):
    """``gpuq wait --timeout`` ran out while jobs were still unfinished; ``snapshot``: the sweep as it
    stood then (an ``api.Snapshot``), for ``gpuq wait --json`` to print."""

    exit_code = exitcodes.TIMEOUT

    def __init__(self, message: str, snapshot: object = None) -> None:
        super().__init__(message)
        self.snapshot = snapshot


class ConfigError(UsageError):
    """A settings or profile file is invalid."""


@dataclass(frozen=True)
class QueueIssue:
    """One problem on one line of a queue file (``line`` 0 = the whole file)."""

    line: int
    column: int | None
    message: str

    def render(self, label: str) -> str:
        if self.line <= 0:
            return f"{label}: {self.message}"
        if self.column is None:
            return f"{label}:{self.line}: {self.message}"
        return f"{label}:{self.line}:{self.column}: {self.message}"


class QueueParseError(UsageError):
    """All problems of a queue file, reported together (``path:line:col: message``)."""

    def __init__(self, path: Path | str, issues: Sequence[QueueIssue]) -> None:
        self.path = Path(path)
        self.label = str(path)
        self.issues = list(issues)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [issue.render(self.label) for issue in self.issues]
        count = len(self.issues)
        tail = f"{count} error{'s' if count != 1 else ''} in {self.label}; nothing was submitted"
        return "\n".join([*lines, tail])

    @property
    def first(self) -> QueueIssue:
        return self.issues[0]


class JobNotFound(UsageError):
    """A job reference (id, prefix, ``queue:name``) matched nothing or several jobs."""


class LedgerError(GpuqError):
    """The ledger could not do what was asked."""


class IllegalTransition(LedgerError):
    """A state change that states.ALLOWED does not permit."""

    def __init__(self, kind: str, ident: str, old: str, new: str) -> None:
        self.kind, self.ident, self.old, self.new = kind, ident, old, new
        super().__init__(f"{kind} {ident}: cannot go from {old} to {new}")


class LedgerVersionError(LedgerError):
    """The ledger was written by a newer gpuq than this one."""


class HostError(GpuqError):
    """A host could not do what was asked."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"host {host}: {message}")


class HostUnreachable(HostError):
    """Transport to the host failed.  Says nothing about the jobs on it."""


class HostKeyError(HostError):
    """The host offered an SSH host key gpuq cannot trust: unknown (no TOFU asked) or changed.

    Never retried: a changed key is either a re-created machine or an attack, and only the
    user can tell which.
    """


class HostAuthFailed(HostError):
    """The host refused every key gpuq offered.  Not retried."""


class CommandFailed(HostError):
    """A command on a host exited non-zero."""

    def __init__(self, host: str, argv: Sequence[str], exit_code: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = exit_code
        self.stderr = stderr
        tail = stderr.strip().splitlines()[-3:]
        detail = ("; ".join(tail)) if tail else "no output"
        super().__init__(host, f"{self.argv[0] if argv else 'command'} exited {exit_code}: {detail}")


class AgentError(GpuqError):
    """The host agent refused a request or failed to start."""


class BundleError(GpuqError):
    """The bundle could not be built or placed on a host."""


class TransferError(HostError):
    """``gpuq pull`` could not obtain a manifest or files from a host (the agent refused, a reply
    was unreadable, a remote file vanished).  A transport drop is HostUnreachable instead."""


# Provider errors (orchestrator/providers/, docs/providers.md): drawn in the tree above.


class ProviderError(GpuqError):
    """A provider API call failed.  ``code`` is the provider's own error code or message, kept raw."""

    def __init__(self, provider: str, message: str, *, code: str = "", status: int | None = None) -> None:
        self.provider = provider
        self.code = code
        self.status = status
        super().__init__(f"{provider}: {message}")


class ProviderAuthError(ProviderError):
    """The provider has no usable API key for gpuq: missing, rejected (401) or account inactive."""


class NoCapacity(ProviderError):
    """The provider has no machines of the requested kind now.  Retryable later; never retried blindly."""


class RateLimited(ProviderError):
    """The provider kept answering HTTP 429 through every bounded retry."""


class ProviderUnreachable(ProviderError):
    """Network error, timeout or 5xx through every retry.  The last call's outcome is unknown:
    re-query state before acting on it (docs/providers.md)."""


class CreateUnknown(ProviderUnreachable):
    """A create call answered a server error or timed out, so it may have been applied, and no instance
    carried its name when asked right after: the machine may exist and bill.  Never "not created": the
    caller looks it up by its name for a bounded time, and the row stays until it knows (docs/providers.md)."""


class ProvisioningFailed(ProviderError):
    """An instance did not become ready: stuck provisioning past its deadline, or lost while booting."""


class ProviderUnsupported(ProviderError):
    """The provider has no such operation (for example: Lambda Cloud has no stop and no spot)."""
