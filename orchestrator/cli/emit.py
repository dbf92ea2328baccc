"""``--json`` output of submit, results, hosts list|show, pull and wait: api results turned into
the documents of ``orchestrator/cli/documents.py`` and printed on stdout (nothing else is)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from orchestrator.cli import documents as d

if TYPE_CHECKING:
    from orchestrator.api import HostDetail, PullReport, ResultRow, Snapshot, SubmitResult
    from orchestrator.ledger import HostRow


def _out(doc: d.Doc) -> None:
    sys.stdout.write(doc.dump())


def submitted(result: SubmitResult) -> None:
    jobs = [d.SubmittedJob(id=j.id, name=j.name, host=result.placements.get(j.id)) for j in result.jobs]
    _out(d.SubmitDocument(schema_="gpuq.cli.submit/1", sweep=result.sweep_id, jobs=jobs,
                          launch_error=result.launch_error))


def results(rows: list[ResultRow]) -> None:
    jobs = []
    for row in rows:
        j, c = row.job, row.cost
        jobs.append(d.ResultJob(
            id=j.id, sweep_id=j.sweep_id, name=j.name, task=j.task, epochs=j.epochs, state=j.state,
            attempts=j.attempt_count, final=row.final, best=row.best,
            gpu_hours=c.gpu_hours if c else None, cost=c.cost if c else None,
            lost_gpu_hours=c.lost_gpu_hours if c else None, preemptions=c.preemptions if c else None,
            pulled=row.pulled, local_dir=row.local_dir, error=row.error,
            restarts_from_scratch=row.restarts_from_scratch,
        ))
    _out(d.ResultsDocument(schema_="gpuq.cli.results/1", sweep=rows[0].job.sweep_id,
                            metric=rows[0].metric, mode=rows[0].mode, jobs=jobs))


def host_entry(row: HostRow) -> d.HostEntry:
    return d.HostEntry(name=row.name, kind=row.kind, target=row.target, profile=row.profile, root=row.root,
                       slots_total=row.slots_total, slots_kind=row.slots_kind, last_probe_at=row.last_probe_at,
                       unreachable_since=row.unreachable_since, health=row.health, hold_reason=row.hold_reason,
                       price_per_hour=row.price_per_hour, provider=row.provider)


def hosts(rows: list[HostRow]) -> None:
    _out(d.HostsDocument(schema_="gpuq.cli.hosts/1", hosts=[host_entry(r) for r in rows]))


def host(detail: HostDetail) -> None:
    row = detail.row
    events = [d.HostEvent(time=e.time, state=e.new or "", message=e.message) for e in detail.events]
    _out(d.HostDocument(schema_="gpuq.cli.host/1", host=host_entry(row), python=row.python, port=row.port,
                        fingerprint=detail.fingerprint, agent_bundle=row.agent_bundle,
                        active_jobs=[j.id for j in detail.active], unverified_jobs=[j.id for j in detail.unverified],
                        events=events))


def pulled(report: PullReport) -> None:
    jobs = [d.PulledJob(id=o.job_id, name=o.name, host=o.host, state=o.state, verified=o.verified, reason=o.reason,
                        files=o.files, bytes=o.bytes, transferred=o.transferred, local_dir=o.local_dir)
            for o in report.outcomes]
    _out(d.PullDocument(schema_="gpuq.cli.pull/1", sweep=report.sweep_id, results_dir=str(report.results_dir),
                        ok=report.ok, jobs=jobs))


def waited(snap: Snapshot, sweep_id: str) -> None:
    from orchestrator.cli.statusjson import job_model
    from orchestrator.views import job_views

    states: dict[str, int] = {}
    for job in snap.jobs:
        states[job.state] = states.get(job.state, 0) + 1
    _out(d.WaitDocument(schema_="gpuq.cli.wait/1", sweep=sweep_id, ok=all(j.state == "SUCCEEDED" for j in snap.jobs),
                        states=states, jobs=[job_model(v) for v in job_views(snap)]))
