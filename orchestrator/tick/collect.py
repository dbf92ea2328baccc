"""Results collection: finished jobs' summaries and file hashes into the ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.agent import client
from orchestrator.core.errors import GpuqError
from orchestrator.health import observed
from orchestrator.host_documents import Results, StatusDocument, Summary
from orchestrator.hosts.base import Host
from orchestrator.ledger import Ledger
from orchestrator.tick.probe import Probe


def collect(ledger: Ledger, host: Host, agent_bundle: str, job_ids: Sequence[str],
            report: Probe | None = None) -> None:
    """Read finished jobs' summaries and file hashes into the ledger: from the probe's document
    when it carried them, else in one ``collect`` round trip for the rest."""
    doc = report.document if report is not None else StatusDocument.empty()
    carried = {j.job_id: j.results for j in doc.jobs if j.results is not None}
    record_collected(ledger, {jid: carried[jid] for jid in job_ids if jid in carried})
    rest = [jid for jid in job_ids if jid not in carried]
    if not rest:
        return
    try:
        collected = client.collect(host, agent_bundle, rest)
    except client.AgentRefused as exc:
        raise GpuqError(f"host {host.name}: collecting results failed: {exc.said}") from exc
    record_collected(ledger, collected.root)


def metrics_warnings(ledger: Ledger, docs: Mapping[str, Results]) -> None:
    """A succeeded job whose ``[run] metrics`` gave no value of the headline metric gets a warning that
    names the setting (once per job and words), never a silent "-" (observed.metrics_problem)."""
    for job_id, doc in docs.items():
        job = ledger.job(job_id)
        sweep = ledger.sweep(job.sweep_id)
        problem = observed.metrics_problem(sweep.run_config() if sweep is not None else None, doc.summary)
        if not problem:
            continue
        message = f"{job.name}: succeeded, but {problem}"
        seen = ledger.open_findings([job_id]).get((job_id, observed.METRICS_RULE))
        if seen is not None and seen.message == message:
            continue
        ledger.record_finding("job", job_id, severity="warn", rule=observed.METRICS_RULE, message=message,
                              action=f"fix [run] metrics in gpuq.toml; the trainer's files: gpuq logs {job_id}",
                              reason=problem)


direction = observed.direction  # the one rule, in health/observed.py (pure: `gpuq results` draws with it)


def own_bests(summary: Summary) -> dict[str, tuple[float, int | None]]:
    """Each metric's own best by its direction, and its step, over every value the summary carries of it
    (the headline's best row, the final row, the learning curve's points, whose extremes the agent keeps)."""
    seen: dict[str, list[tuple[float, int | None]]] = {}
    for row in (summary.best, summary.final):
        for name, value in (row.metrics() if row is not None else {}).items():
            seen.setdefault(name, []).append((value, row.step_int() if row is not None else None))
    for name, points in summary.curves.items():
        seen.setdefault(name, []).extend((value, int(step)) for step, value in points)
    out: dict[str, tuple[float, int | None]] = {}
    for name, values in seen.items():
        way = direction(name, summary)
        if way:  # the first of equal values: the best row's own
            out[name] = min(values, key=lambda v: v[0]) if way == "min" else max(values, key=lambda v: v[0])
    return out


def record_collected(ledger: Ledger, docs: Mapping[str, Results]) -> None:
    """Each job's results as the ledger keeps them: finite metrics of the final and best rows, the
    learning curves, the files' hashes (the attempt's end record: what it left as it ended) and the
    checkpoint (all checked at the edge)."""
    for job_id, doc in docs.items():
        summary = doc.summary if doc.summary is not None else Summary()
        metrics: list[tuple[str, str, float, int | None, int | None]] = []
        for scope, row in (("final", summary.final), ("best_row", summary.best)):
            if row is not None:
                metrics += [(scope, name, value, row.step_int(), row.epoch_int())
                            for name, value in row.metrics().items()]
        metrics += [("best", name, value, step, None) for name, (value, step) in own_bests(summary).items()]
        for name, points in summary.curves.items():
            metrics += [("curve", name, value, int(step), None) for step, value in points]
        ledger.record_results(job_id, doc.attempt, metrics=metrics, artifacts=doc.artifacts(), checkpoint=doc.ckpt)
    metrics_warnings(ledger, docs)
