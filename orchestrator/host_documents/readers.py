"""One reader per document a host sends: the agent's raw stdout in, the checked model out, or
``ProtocolError`` (docs/host-protocol.md).  Nothing below this package sees a host's raw JSON."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from pydantic import BaseModel

from orchestrator.host_documents.facts import AgentStop, HostFacts, RetryDecisions, SelfStopRecord, Verdicts
from orchestrator.host_documents.framing import load, validate
from orchestrator.host_documents.health import HealthDocument, ReapDocument
from orchestrator.host_documents.results import (
    CollectDocument,
    FileHashes,
    ManifestDocument,
    Pointer,
    SnapshotPointer,
)
from orchestrator.host_documents.status import StatusDocument

M = TypeVar("M", bound=BaseModel)


def _reader(what: str, model: type[M]) -> Callable[[str, str], M]:
    def read(host: str, stdout: str) -> M:
        return validate(host, what, model, load(host, stdout))

    read.__name__ = f"read_{what.replace(' ', '_')}"
    read.__doc__ = f"The {what} document a host printed, checked; ProtocolError when it is not one."
    return read


read_status: Callable[[str, str], StatusDocument] = _reader("status", StatusDocument)
read_health: Callable[[str, str], HealthDocument] = _reader("health", HealthDocument)
read_reap: Callable[[str, str], ReapDocument] = _reader("reap", ReapDocument)
read_collect: Callable[[str, str], CollectDocument] = _reader("collect", CollectDocument)
read_manifest: Callable[[str, str], ManifestDocument] = _reader("manifest", ManifestDocument)
read_snapshot: Callable[[str, str], SnapshotPointer] = _reader("snapshot", SnapshotPointer)
read_facts: Callable[[str, str], HostFacts] = _reader("host audit", HostFacts)
read_pointer: Callable[[str, str], Pointer] = _reader("checkpoint pointer", Pointer)
read_verdicts: Callable[[str, str], Verdicts] = _reader("verdicts", Verdicts)
read_retry_decisions: Callable[[str, str], RetryDecisions] = _reader("retry decisions", RetryDecisions)
read_agent_stop: Callable[[str, str], AgentStop] = _reader("agent stop", AgentStop)
read_file_hashes: Callable[[str, str], FileHashes] = _reader("file hashes", FileHashes)
read_selfstop: Callable[[str, str], SelfStopRecord] = _reader("self-stop record", SelfStopRecord)

READERS: Mapping[str, Callable[[str, str], BaseModel]] = {
    "status": read_status, "health": read_health, "reap": read_reap, "collect": read_collect,
    "manifest": read_manifest, "snapshot": read_snapshot, "pointer": read_pointer,
    "verdicts": read_verdicts, "retry decisions": read_retry_decisions, "facts": read_facts,
    "agent stop": read_agent_stop,
    "file hashes": read_file_hashes,
    "self-stop record": read_selfstop,
}
