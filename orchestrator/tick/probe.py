"""Probing: one read-only ``status --json`` round trip per host, in parallel (docs/health.md).

A probe that fails at the transport level marks the host "unreachable since T" and changes no job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator import host_documents
from orchestrator.agent import client
from orchestrator.core.config import Settings
from orchestrator.core.errors import HostError
from orchestrator.host_documents import StatusDocument
from orchestrator.hosts.base import Host


@dataclass
class Probe:
    host: str
    ok: bool
    doc: StatusDocument | None = None  # the host's checked status document (ok: always one)
    error: str = ""
    round_trips: int = 1
    duration_s: float = 0.0
    reachable: bool = False  # the transport worked (ok adds: the agent answered with a status document)

    @property
    def document(self) -> StatusDocument:
        """The status document, or an empty one when the probe brought none."""
        return self.doc if self.doc is not None else StatusDocument.empty()


def probe(host: Host, agent_bundle: str, settings: Settings, results_for: Sequence[str] = (),
          extra: Sequence[str] = ()) -> Probe:
    """One read-only round trip to the host's agent.

    ``results_for``: the jobs the ledger believes active there; any of them that exited 0
    comes back with its collected results, so finishing jobs cost no second round trip.
    ``extra``: more ``status`` arguments (the patrol's ``--scan`` offsets, ``--kernel-since``).
    """
    started = time.monotonic()
    if not agent_bundle:  # nothing of ours there yet: the round trip only proves reachability
        try:
            host.run(["true"], timeout=settings.status_timeout_s)
        except HostError as exc:
            return Probe(host.name, False, error=str(exc), duration_s=time.monotonic() - started)
        return Probe(host.name, False, error="no bundle placed yet", duration_s=time.monotonic() - started,
                     reachable=True)
    try:
        wanted = ["--results-for", *results_for] if results_for else []
        doc = client.status(host, agent_bundle, [*wanted, *extra], timeout=settings.status_timeout_s)
    except client.AgentRefused as exc:
        return Probe(host.name, False, error=f"status exited {exc.code}: {exc.said}",
                     duration_s=time.monotonic() - started, reachable=True)
    except host_documents.ProtocolError as exc:
        return Probe(host.name, False, error=f"protocol error: {exc.detail}", duration_s=time.monotonic() - started,
                     reachable=True)
    except HostError as exc:  # unreachable, or a key/auth refusal: either way no verdict on any job
        return Probe(host.name, False, error=str(exc), duration_s=time.monotonic() - started)
    return Probe(host.name, True, doc=doc, duration_s=time.monotonic() - started, reachable=True)


ProbeRequest = tuple[Host, str, Sequence[str], Sequence[str]]  # host, agent bundle, active job ids, extra args


def probe_all(hosts: Sequence[ProbeRequest], settings: Settings) -> list[Probe]:
    """Probe every host in parallel: one round trip each, at most 8 connections at once
    (reconnect storms trip sshd MaxStartups, docs/health.md)."""
    if len(hosts) <= 1:
        return [probe(h, sha, settings, ids, extra) for h, sha, ids, extra in hosts]
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        return list(pool.map(lambda item: probe(item[0], item[1], settings, item[2], item[3]), hosts))
