"""The host agent's verbs as calls: each function builds its verb's command line, runs it with its timeout,
checks the exit code and returns the verb's document model (docs/host-protocol.md).

No other module builds an agent command line or reads an agent's raw output: a verb the agent answers in
words (``kill``, ``stacks``, ``cancel``) comes back as a :class:`Said` per job, a document verb as its
``host_documents`` model.  Errors: ``HostError`` (``HostUnreachable``) when the host could not be asked,
:class:`AgentRefused` when the agent exited non-zero where that means no answer, ``ProtocolError`` when its
document is not one (that host only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator import host_documents
from orchestrator.core import protocol
from orchestrator.core.errors import HostError
from orchestrator.core.specs import CommandResult
from orchestrator.host_documents import (
    AgentStop,
    CollectDocument,
    HealthDocument,
    ReapDocument,
    RetryDecisions,
    SnapshotPointer,
    StatusDocument,
    Verdicts,
)
from orchestrator.hosts.base import Host

TAIL = 300  # characters of an agent's stderr quoted in an error


class AgentRefused(HostError):
    """The agent ran and exited non-zero where that means it gave no answer."""

    def __init__(self, host: str, verb: str, code: int, said: str) -> None:
        self.verb, self.code, self.said = verb, code, said
        super().__init__(host, f"{verb} exited {code}: {said}")


@dataclass(frozen=True)
class Said:
    """A verb's answer in words: its exit code and its last line (stdout, else stderr)."""

    code: int
    text: str

    @property
    def ok(self) -> bool:
        return self.code == protocol.EXIT_OK


@dataclass(frozen=True)
class Reaped:
    """The ``reap`` verb's answer: its document (None when it printed none), exit code and what it said."""

    doc: ReapDocument | None
    code: int
    said: str


def command(host: Host, bundle_sha: str, *args: str) -> list[str]:
    """The agent of bundle ``bundle_sha`` on ``host`` with ``args``.  The one place its command line is made;
    ``transfer.pull_jobs`` takes it as the prefix of the ``manifest`` verb it runs per batch."""
    return [host.python, agent_path(host, bundle_sha), "--root", host.root, *args]


def agent_path(host: Host, bundle_sha: str) -> str:
    return host.path(protocol.BUNDLES_DIR, bundle_sha, protocol.AGENT_ENTRY)


def run(host: Host, bundle_sha: str, *args: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
    """One agent call, its result as it came (for this package's launcher and the verbs below)."""
    if stdin is None:
        return host.run(command(host, bundle_sha, *args), timeout=timeout)
    return host.run(command(host, bundle_sha, *args), stdin=stdin, timeout=timeout)


def _tail(result: CommandResult) -> str:
    return result.stderr.strip()[-TAIL:]


def status(host: Host, bundle_sha: str, args: Sequence[str], *, timeout: float) -> StatusDocument:
    """``status --json``: the probe's document."""
    result = run(host, bundle_sha, "status", "--json", *args, timeout=timeout)
    if result.exit_code != 0:
        raise AgentRefused(host.name, "status", result.exit_code, _tail(result))
    return host_documents.read_status(host.name, result.stdout)


def collect(host: Host, bundle_sha: str, job_ids: Sequence[str]) -> CollectDocument:
    """``collect``: finished jobs' summaries, hashes and end records."""
    result = run(host, bundle_sha, "collect", *job_ids, timeout=120)
    if result.exit_code != 0:
        raise AgentRefused(host.name, "collect", result.exit_code, _tail(result))
    return host_documents.read_collect(host.name, result.stdout)


@dataclass(frozen=True)
class HealthAnswer:
    """The ``health`` verb's document, or (None) its exit code and why it printed none."""

    doc: HealthDocument | None
    code: int
    unread: str = ""


def health(host: Host, bundle_sha: str, args: Sequence[str], *, timeout: float) -> HealthAnswer:
    """``health``: the preflight's document (it exits non-zero on a failed check, with its document)."""
    result = run(host, bundle_sha, "health", *args, timeout=timeout)
    try:
        return HealthAnswer(host_documents.read_health(host.name, result.stdout), result.exit_code)
    except host_documents.ProtocolError as exc:
        tail = (result.stderr or result.stdout).strip()[-TAIL:]
        return HealthAnswer(None, result.exit_code, f"{exc.detail}): {tail}")


def snapshot(host: Host, bundle_sha: str, job_id: str) -> SnapshotPointer | str:
    """``snapshot``: the checkpoint the agent pinned for shipping, or why none was."""
    try:
        result = run(host, bundle_sha, "snapshot", job_id, timeout=60)
    except HostError as exc:
        return str(exc)
    try:
        pointer = host_documents.read_snapshot(host.name, result.stdout) if result.exit_code == 0 else None
    except host_documents.ProtocolError:
        pointer = None
    if pointer is None:
        return (result.stderr or result.stdout).strip()[-TAIL:] or "the agent pinned no checkpoint"
    return pointer


def _said(result: CommandResult) -> Said:
    lines = (result.stdout.strip() or result.stderr.strip()).splitlines()
    return Said(result.exit_code, lines[-1] if lines else "")


def stacks(host: Host, bundle_sha: str, job_id: str, attempt: int, *, timeout: float) -> Said:
    """``stacks``: where each process of the attempt waits, saved as its stacks.txt ("saved ..." or why not)."""
    return _said(run(host, bundle_sha, "stacks", job_id, str(attempt), timeout=timeout))


def kill(host: Host, bundle_sha: str, job_id: str, attempt: int | None = None, *, timeout: float) -> Said:
    """``kill``: end the job's attempt (its process group); the agent's verdict in words."""
    extra = [str(attempt)] if attempt is not None else []
    result = run(host, bundle_sha, "kill", job_id, *extra, timeout=timeout)
    return Said(result.exit_code, result.stdout.strip() or result.stderr.strip())


def decide_retry(host: Host, bundle_sha: str, items: Sequence[tuple[str, int]], *,
                 timeout: float) -> RetryDecisions | None:
    """``decide-retry``: who starts attempt n+1 of each (job, n); None from an agent without the verb."""
    result = run(host, bundle_sha, "decide-retry", *[f"{job_id}:{n}" for job_id, n in items], timeout=timeout)
    if result.exit_code == protocol.AGENT_EXIT_USAGE:
        return None
    if result.exit_code != protocol.EXIT_OK:
        raise AgentRefused(host.name, "decide-retry", result.exit_code, _tail(result))
    return host_documents.read_retry_decisions(host.name, result.stdout)


def withdraw(host: Host, bundle_sha: str, job_ids: Sequence[str]) -> Verdicts:
    """``withdraw``: jobs not yet started taken back out of the inbox; no verdict for a host that does not
    answer, or answers with anything but its verdicts (nothing was withdrawn as far as gpuq knows)."""
    try:
        result = run(host, bundle_sha, "withdraw", *job_ids, timeout=60)
        return host_documents.read_verdicts(host.name, result.stdout) if result.exit_code == 0 else Verdicts({})
    except (HostError, host_documents.ProtocolError):
        return Verdicts({})


def cancel(host: Host, bundle_sha: str, job_ids: Sequence[str], *, timeout: float) -> dict[str, str]:
    """``cancel``: each job's verdict in the agent's words (its stderr, or its exit code, when it gave none)."""
    result = run(host, bundle_sha, "cancel", *job_ids, timeout=timeout)
    lines = result.stdout.strip().splitlines()
    if len(job_ids) == 1:
        said = {job_ids[0]: lines[0] if lines else ""}
    else:
        said = dict(line.split(" ", 1) for line in lines if " " in line)
    fallback = result.stderr.strip() or f"agent exit {result.exit_code}"
    return {job_id: said.get(job_id) or fallback for job_id in job_ids}


def stop_agent(host: Host, bundle_sha: str, *, force: bool) -> AgentStop:
    """``stop-agent``: stop an idle agent now (``force``: with running jobs too)."""
    result = run(host, bundle_sha, "stop-agent", *(["--force"] if force else []), timeout=60)
    if result.exit_code != 0:
        raise AgentRefused(host.name, "stop-agent", result.exit_code, (result.stderr or result.stdout).strip()[-200:])
    return host_documents.read_agent_stop(host.name, result.stdout)


def reap(host: Host, bundle_sha: str, args: Sequence[str], *, timeout: float) -> Reaped:
    """``reap``: VRAM zombies found (and, with ``--force``, killed)."""
    result = run(host, bundle_sha, "reap", *args, timeout=timeout)
    try:
        doc = host_documents.read_reap(host.name, result.stdout)
    except host_documents.ProtocolError:
        return Reaped(None, result.exit_code, (result.stderr or result.stdout).strip()[-400:])
    return Reaped(doc, result.exit_code, result.stderr.strip()[-400:] if result.exit_code else "")
