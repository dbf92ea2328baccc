"""``--json`` output of submit, results, hosts list|show, pull and wait: api results turned into
the documents of ``orchestrator/cli/documents.py`` and printed on stdout (nothing else is).

Every document is written as ``Doc.dump`` writes it (``json.dumps(indent=2, sort_keys=True)``), by
``jsontext.dumps``: the same text, a second sooner for ``gpuq results --json`` on 10,000 jobs.  The
results document is validated as a whole, in one call, from plain dicts (not one model per row), and
written from them when its dump could not differ (``results``).
"""

from __future__ import annotations

import sys
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from orchestrator.cli import docbase, documents, jsontext
from orchestrator.core.specs import known_epochs

if TYPE_CHECKING:
    from orchestrator.api import Context, HostDetail, PullReport, ResultRow, Snapshot, SubmitResult
    from orchestrator.host_documents import Provenance
    from orchestrator.ledger import HostRow


def _out(doc: docbase.Doc) -> None:
    sys.stdout.write(jsontext.dumps(doc.as_dict()) + "\n")


def submitted(result: SubmitResult) -> None:
    jobs = [documents.SubmittedJob(id=j.id, name=j.name, host=result.placements.get(j.id)) for j in result.jobs]
    _out(documents.SubmitDocument(schema_="gpuq.cli.submit/1", sweep=result.sweep_id, jobs=jobs,
                                  launch_error=result.launch_error, part=result.part))


def _ran_fields(host: str, ran: Provenance | None) -> dict[str, Any] | None:
    """What ``host`` said an attempt ran with, as ``RanWith``'s fields (None: it has not said)."""
    if ran is None:
        return None
    return {"host": host, "slot_kind": ran.slot_kind, "gpu_model": ran.gpu_model, "gpu_count": ran.gpu_count,
            "driver": ran.driver, "cuda": ran.cuda, "torch": ran.torch, "nccl": ran.nccl, "python": ran.python}


def _ran(host: str, ran: Provenance | None) -> documents.RanWith | None:
    fields = _ran_fields(host, ran)
    return documents.RanWith(**fields) if fields is not None else None


def results(rows: list[ResultRow]) -> None:
    """One ``ResultJob`` per row, every field given (``exclude_unset`` shows them all), as plain dicts
    validated by ``ResultsDocument`` in one call.  Where they pass its strict validation with a float
    in every float field, its dump would be these very dicts, and they are written as they are; else
    (an int where a float goes, a str enum, ...) the lax validation's dump is, as ever."""
    from pydantic import ValidationError

    from orchestrator.context import gc_paused

    with gc_paused():  # tens of thousands of live dicts: full collections would find nothing
        jobs = _result_jobs(rows)
        doc: dict[str, Any] = {"schema": "gpuq.cli.results/1", "sweep": rows[0].job.sweep_id,
                               "metric": rows[0].metric, "mode": rows[0].mode, "jobs": jobs}
        try:
            documents.ResultsDocument.model_validate(doc, strict=True)
            exact = _floats_only(jobs)
        except ValidationError:
            exact = False
        if not exact:
            doc = documents.ResultsDocument.model_validate(doc).as_dict()
        sys.stdout.write(jsontext.dumps(doc) + "\n")


FLOAT_FIELDS = ("gpu_hours", "cost", "lost_gpu_hours", "cpu_hours", "joined_at")  # ResultJob's fields of float | None
FLOAT_MAPS = ("final", "best", "best_row")  # ... and of dict[str, float]


def _floats_only(jobs: list[dict[str, Any]]) -> bool:
    """Whether every float field of ``jobs`` holds a float or None (strict validation takes an int there,
    which the dump would write as a float)."""
    kinds: set[type] = set()
    for name in FLOAT_FIELDS:
        kinds.update(map(type, map(itemgetter(name), jobs)))
    for name in FLOAT_MAPS:
        kinds.update(map(type, chain.from_iterable(map(dict.values, map(itemgetter(name), jobs)))))
    return kinds <= {float, type(None)}


def _result_jobs(rows: list[ResultRow]) -> list[dict[str, Any]]:
    jobs = []
    ran: dict[tuple[str, int], dict[str, Any] | None] = {}  # rows share their Provenance (api.jobs.ran_with)
    for row in rows:
        j, c, att = row.job, row.cost, row.attempt
        if att is not None and (att.host, id(row.provenance)) not in ran:
            ran[att.host, id(row.provenance)] = _ran_fields(att.host, row.provenance)
        jobs.append({
            "id": j.id, "sweep_id": j.sweep_id, "name": j.name, "task": j.task, "epochs": known_epochs(j.epochs),
            "state": j.state, "attempts": j.attempt_count, "final": row.final, "best": row.best,
            "best_row": row.best_row,
            "gpu_hours": c.gpu_hours if c else None, "cost": c.cost if c else None,
            "lost_gpu_hours": c.lost_gpu_hours if c else None, "preemptions": c.preemptions if c else None,
            "pulled": row.pulled, "local_dir": row.local_dir, "error": row.error,
            "restarts_from_scratch": row.restarts_from_scratch, "cpu_hours": c.cpu_hours if c else None,
            "ran_with": ran[att.host, id(row.provenance)] if att is not None else None,
            "git_commit": row.git[0] or None, "git_dirty": row.git[1], "reused_from": j.reused_from,
            "part": j.part, "joined_at": row.joined_at,
        })
    return jobs


def host_entry(row: HostRow) -> documents.HostEntry:
    return documents.HostEntry(name=row.name, kind=row.kind, target=row.target, profile=row.profile, root=row.root,
                               slots_total=row.slots_total, slots_kind=row.slots_kind, last_probe_at=row.last_probe_at,
                               unreachable_since=row.unreachable_since, health=row.health, hold_reason=row.hold_text,
                               price_per_hour=row.price_per_hour, provider=row.provider)


def hosts(rows: list[HostRow]) -> None:
    _out(documents.HostsDocument(schema_="gpuq.cli.hosts/1", hosts=[host_entry(r) for r in rows]))


def host(detail: HostDetail) -> None:
    row = detail.row
    events = [documents.HostEvent(time=e.time, state=e.new or "", message=e.message) for e in detail.events]
    _out(documents.HostDocument(schema_="gpuq.cli.host/1", host=host_entry(row), python=row.python, port=row.port,
                                fingerprint=detail.fingerprint, agent_bundle=row.agent_bundle,
                                active_jobs=[j.id for j in detail.active],
                                unverified_jobs=[j.id for j in detail.unverified], events=events,
                                ran_with=_ran(row.name, detail.ran_with)))


def pulled(report: PullReport) -> None:
    jobs = [documents.PulledJob(id=o.job_id, name=o.name, host=o.host, state=o.state, verified=o.verified,
                                reason=o.reason, files=o.files, bytes=o.bytes, transferred=o.transferred,
                                local_dir=o.local_dir)
            for o in report.outcomes]
    _out(documents.PullDocument(schema_="gpuq.cli.pull/1", sweep=report.sweep_id, results_dir=str(report.results_dir),
                                ok=report.ok, jobs=jobs))


def wait(ctx: Context, sweep_id: str, timeout_s: float | None, *, as_json: bool) -> Snapshot:
    """``api.wait``; when ``--timeout`` runs out first, a ``--json`` caller still gets its document (the
    jobs as they stood, ``timed_out: true``) before the one-line error and exit 4."""
    from orchestrator import api
    from orchestrator.api import Snapshot as Snap
    from orchestrator.core.errors import WaitTimeout

    try:
        return api.wait(ctx, sweep=sweep_id, timeout_s=timeout_s)
    except WaitTimeout as exc:
        if as_json and isinstance(exc.snapshot, Snap):
            waited(exc.snapshot, sweep_id, timed_out=True)
        raise


def waited(snap: Snapshot, sweep_id: str, *, timed_out: bool = False) -> None:
    from orchestrator.cli.statusjson import job_model
    from orchestrator.views import job_views

    states: dict[str, int] = {}
    for job in snap.jobs:
        states[job.state] = states.get(job.state, 0) + 1
    _out(documents.WaitDocument(schema_="gpuq.cli.wait/1", sweep=sweep_id,
                                ok=all(j.state == "SUCCEEDED" for j in snap.jobs), timed_out=timed_out,
                                states=states, jobs=[job_model(v) for v in job_views(snap)]))
