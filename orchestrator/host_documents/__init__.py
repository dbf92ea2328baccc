"""Every document a host sends, parsed at the edge into strict, bounded, typed models
(docs/security.md, docs/host-protocol.md).

A rented host is someone else's machine: what its agent prints is input from the internet.  Each
reader (``readers``) takes the agent's raw stdout, cuts the framed document out of any shell noise
(``framing``), checks it against its model and returns the model; anything else raises
``ProtocolError``.  The models keep fields they do not name (an agent of a newer minor protocol
adds optional ones), but the controller reads named fields only, each checked here: counts bounded
to sane sizes, floats finite (``bounds``).

- ``status``: the probe (``StatusDocument``, its ``JobEntry`` per job).
- ``results``: checkpoint pointers, collected results and summaries, manifests, snapshots.
- ``health``: the GPU preflight and the reaper.
- ``provenance``: what one attempt ran with (GPUs, driver, CUDA, torch, NCCL, Python).
- ``facts``: the host audit of `gpuq hosts add`, and enqueue/withdraw/cancel verdicts.
"""

from __future__ import annotations

from orchestrator.core.specs import MAX_SLOTS
from orchestrator.host_documents.bounds import (
    MAX_CPUS,
    MAX_CURVE_POINTS,
    MAX_CURVES,
    MAX_DOCUMENT_CHARS,
    MAX_FILES,
    MAX_GPUS,
    MAX_ID,
    MAX_INT,
    MAX_ITEMS,
    MAX_JOBS,
    MAX_NODES,
    MAX_STR,
    finite_number,
)
from orchestrator.host_documents.facts import AgentStop, AuditGpu, HostFacts, RetryDecision, RetryDecisions, Verdicts
from orchestrator.host_documents.framing import (
    BEGIN_MARK,
    END_MARK,
    NOISE_SHOWN,
    ProtocolError,
    load,
    unframe,
    validate,
    warn_noise,
)
from orchestrator.host_documents.health import Check, HealthDocument, ReapCandidate, ReapDocument, ReapEntry
from orchestrator.host_documents.provenance import Provenance
from orchestrator.host_documents.readers import (
    READERS,
    read_agent_stop,
    read_collect,
    read_facts,
    read_file_hashes,
    read_health,
    read_manifest,
    read_pointer,
    read_reap,
    read_retry_decisions,
    read_snapshot,
    read_status,
    read_verdicts,
)
from orchestrator.host_documents.results import (
    CollectDocument,
    ManifestDocument,
    ManifestReply,
    OutputFile,
    Outputs,
    Pointer,
    ResultCheckpoint,
    ResultFile,
    Results,
    SnapshotPointer,
    Summary,
    SummaryRow,
)
from orchestrator.host_documents.status import (
    Agent,
    Disk,
    ExitRecord,
    Gpu,
    Heartbeat,
    HostRetry,
    JobEntry,
    Kernel,
    Memory,
    NodeRank,
    NonFinite,
    OomKill,
    Progress,
    Resumed,
    Scan,
    ScanHit,
    Slots,
    SlurmJob,
    SlurmSection,
    StatusDocument,
    Xid,
)

__all__ = [
    "BEGIN_MARK",
    "END_MARK",
    "MAX_CPUS",
    "MAX_CURVES",
    "MAX_CURVE_POINTS",
    "MAX_DOCUMENT_CHARS",
    "MAX_FILES",
    "MAX_GPUS",
    "MAX_ID",
    "MAX_INT",
    "MAX_ITEMS",
    "MAX_JOBS",
    "MAX_NODES",
    "MAX_SLOTS",
    "MAX_STR",
    "NOISE_SHOWN",
    "READERS",
    "Agent",
    "AgentStop",
    "AuditGpu",
    "Check",
    "CollectDocument",
    "Disk",
    "ExitRecord",
    "Gpu",
    "HealthDocument",
    "Heartbeat",
    "HostFacts",
    "HostRetry",
    "JobEntry",
    "Kernel",
    "ManifestDocument",
    "ManifestReply",
    "Memory",
    "NodeRank",
    "NonFinite",
    "OomKill",
    "OutputFile",
    "Outputs",
    "Pointer",
    "Progress",
    "ProtocolError",
    "Provenance",
    "ReapCandidate",
    "ReapDocument",
    "ReapEntry",
    "ResultCheckpoint",
    "ResultFile",
    "Results",
    "Resumed",
    "RetryDecision",
    "RetryDecisions",
    "Scan",
    "ScanHit",
    "Slots",
    "SlurmJob",
    "SlurmSection",
    "SnapshotPointer",
    "StatusDocument",
    "Summary",
    "SummaryRow",
    "Verdicts",
    "Xid",
    "finite_number",
    "load",
    "read_agent_stop",
    "read_collect",
    "read_facts",
    "read_file_hashes",
    "read_health",
    "read_manifest",
    "read_pointer",
    "read_reap",
    "read_retry_decisions",
    "read_snapshot",
    "read_status",
    "read_verdicts",
    "unframe",
    "validate",
    "warn_noise",
]
