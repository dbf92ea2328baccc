"""The pure patrol / verdicts / host_lines / observed / stops rules fed the way a tick feeds them: a document
written as the host would send it (plain JSON data) goes through the edge models first (host_documents), then to
the rule.  Tests keep writing documents as the agent prints them; the rules see only checked models."""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import host_documents as hd
from orchestrator.health import host_lines as _host_lines
from orchestrator.health import observed as _observed
from orchestrator.health import patrol as _patrol
from orchestrator.health import stops as _stops
from orchestrator.health import verdicts as _verdicts


def status(doc: Mapping[str, Any] | hd.StatusDocument | None) -> hd.StatusDocument | None:
    if doc is None or isinstance(doc, hd.StatusDocument):
        return doc
    return hd.StatusDocument.model_validate({"schema": "gpuq.status/1", **_with_ids(doc)})


def entry(doc: Mapping[str, Any] | hd.JobEntry | None) -> hd.JobEntry | None:
    if doc is None or isinstance(doc, hd.JobEntry):
        return doc
    return hd.JobEntry.model_validate({"job_id": "c000000000000", **doc})


def exit_record(doc: Mapping[str, Any] | None) -> hd.ExitRecord | None:
    return None if doc is None else hd.ExitRecord.model_validate(doc)


def hits(items: Sequence[Mapping[str, str] | hd.ScanHit]) -> list[hd.ScanHit]:
    return [h if isinstance(h, hd.ScanHit) else hd.ScanHit.model_validate(h) for h in items]


def _module(real: types.ModuleType, **wrapped: Any) -> types.SimpleNamespace:
    names = {n: getattr(real, n) for n in dir(real) if not n.startswith("__")}
    return types.SimpleNamespace(**{**names, **wrapped})


patrol = _module(
    _patrol,
    host_findings=lambda host, doc, th: _patrol.host_findings(host, status(doc), th),
    job_findings=lambda host, job, e, now, th: _patrol.job_findings(host, job, entry(e), now, th),
)
verdicts = _module(
    _verdicts,
    classify=lambda code, trainer, h, *a, **kw: _verdicts.classify(code, trainer, hits(h), *a, **kw),
)
host_lines = _module(
    _host_lines,
    host_line=lambda host, doc, findings, **kw: _host_lines.host_line(host, status(doc), findings, **kw),
)
observed = _module(
    _observed,
    attempt_progress=lambda e: _observed.attempt_progress(entry(e)),
    progress_fraction=lambda e: _observed.progress_fraction(entry(e)),
    last_line=lambda e, *a, **kw: _observed.last_line(entry(e), *a, **kw),
    liveness_ages=lambda e, now: _observed.liveness_ages(entry(e), now),
    elapsed_s=lambda e, *a, **kw: _observed.elapsed_s(entry(e), *a, **kw),
    slurm_wait=lambda e: _observed.slurm_wait(entry(e)),
)
stops = _module(
    _stops,
    wrapper_signal=lambda e: _stops.wrapper_signal(exit_record(e)),
    interrupted=lambda e: _stops.interrupted(entry(e)),
    kernel_oom_kills=lambda doc: _stops.kernel_oom_kills(status(doc)),
)


def _with_ids(doc: Mapping[str, Any]) -> dict[str, Any]:
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        return dict(doc)
    return {**doc, "jobs": [{"job_id": f"c{i:012x}", **j} if isinstance(j, dict) else j for i, j in enumerate(jobs)]}
