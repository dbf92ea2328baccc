"""What a tick keeps of the hosts' answers (docs/security.md).

The documents are already checked (``orchestrator.host_documents``); here the ledger decides which
parts concern gpuq: a job entry counts only when the ledger gave that job an attempt on that very
host (another controller sharing the box, or a forged id, is ignored, never written), and a host
that answered with no valid document gets a "protocol" finding of its own while the others go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

from orchestrator import host_documents
from orchestrator.health.patrol import Finding, Severity
from orchestrator.ledger import Ledger
from orchestrator.tick.probe import Probe

PROTOCOL_PREFIX = "protocol error: "


def only_known(ledger: Ledger, probes: Sequence[Probe]) -> list[Probe]:
    """The probes with each status document cut to the jobs the ledger placed on that host (for a
    multi-node attempt: on any of its node hosts, each of which reports its own part)."""
    wanted = {j.job_id for p in probes if p.doc is not None for j in p.doc.jobs}
    placed = {(a.job_id, host) for a in (ledger.attempts_of(wanted) if wanted else [])
              for host in (a.host, *a.node_hosts())}
    out = []
    for probe in probes:
        if probe.ok and probe.doc is not None:
            here = {job_id for job_id, host in placed if host == probe.host}
            doc = probe.doc.known_jobs_only(here.__contains__)
            probe = dataclasses.replace(probe, doc=doc) if doc is not probe.doc else probe
        out.append(probe)
    return out


@contextlib.contextmanager
def contained(ledger: Ledger, host: str, lines: list[str]) -> Iterator[None]:
    """A protocol error met while acting on one host's answer (an enqueue, a collect, a snapshot
    answered with garbage) stops the work on that host only; the tick goes on with the others."""
    try:
        yield
    except host_documents.ProtocolError as exc:
        message = PROTOCOL_PREFIX + exc.detail
        lines.append(f"{host}: {message}")
        if (host, "protocol") in ledger.open_findings([host]):
            return  # said when it opened; closed when the host answers well again
        for f in protocol_findings(host, message):
            ledger.record_finding("host", host, severity=f.severity.value, rule=f.rule, message=f.message,
                                  action=f.action)


def protocol_findings(host: str, error: str) -> list[Finding]:
    """A host whose agent answered with no valid document: that host only is marked."""
    if not error.startswith(PROTOCOL_PREFIX):
        return []
    return [Finding("protocol", Severity.WARN, host, error,
                    "the host's answer was ignored: check what its login prints (`gpuq hosts show`), or "
                    "`gpuq hosts rm` it if it keeps answering this way")]
