"""Results collection: finished jobs' summaries and file hashes into the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator import host_documents
from orchestrator.errors import GpuqError
from orchestrator.hosts.base import Host
from orchestrator.launcher import agent_argv
from orchestrator.ledger import Ledger
from orchestrator.tick.probe import Probe


def collect(ledger: Ledger, host: Host, agent_bundle: str, job_ids: Sequence[str],
            report: Probe | None = None) -> None:
    """Read finished jobs' summaries and file hashes into the ledger: from the probe's document
    when it carried them, else in one ``collect`` round trip for the rest."""
    carried = {str(j["job_id"]): j["results"] for j in (report.doc.get("jobs", []) if report else [])
               if isinstance(j.get("results"), dict)}
    record_collected(ledger, {jid: carried[jid] for jid in job_ids if jid in carried})
    rest = [jid for jid in job_ids if jid not in carried]
    if not rest:
        return
    result = host.run(agent_argv(host, agent_bundle, "collect", *rest), timeout=120)
    if result.exit_code != 0:
        raise GpuqError(f"host {host.name}: collecting results failed: {result.stderr.strip()[-300:]}")
    record_collected(ledger, host_documents.read_collect(host.name, result.stdout))


def record_collected(ledger: Ledger, docs: dict[str, Any]) -> None:
    for job_id, doc in docs.items():
        summary = doc.get("summary") or {}
        metrics: list[tuple[str, str, float, int | None, int | None]] = []
        for scope in ("final", "best"):
            row = summary.get(scope) or {}
            for name, value in row.items():
                if name in ("step", "epoch", "time", "kind") or not isinstance(value, (int, float)):
                    continue
                metrics.append((scope, name, float(value), row.get("step"), row.get("epoch")))
        for name, points in (summary.get("curves") or {}).items():  # checked finite and bounded at the edge
            metrics += [("curve", name, float(value), int(step), None) for step, value in points]
        artifacts = [(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in doc.get("files", [])]
        ledger.record_results(job_id, int(doc.get("attempt", 0)), metrics=metrics, artifacts=artifacts,
                              checkpoint=doc.get("ckpt"))
