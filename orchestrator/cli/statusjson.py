"""``gpuq status --json`` (and the jobs of ``gpuq wait --json``): the status view models
(``orchestrator/views/``) as the pydantic document of ``orchestrator/cli/documents.py``, schema
``gpuq.cli.status/1`` (generated into ``docs/schemas/status.schema.json``).  Costs are the view's
(``orchestrator/money/cost.py``), so the document agrees with ``gpuq results --json`` and ``gpuq report``; each
sweep's ``budget`` spent is the sum of its jobs' costs (``orchestrator/money/budget.py``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from orchestrator.cli import documents
from orchestrator.core.specs import known_epochs
from orchestrator.views import JobView, alert_views, job_views

if TYPE_CHECKING:
    from orchestrator.api import Snapshot

STATUS_SCHEMA = "gpuq.cli.status/1"


def _shown(part: BaseModel | None) -> dict[str, Any]:
    """A part of a host's checked status document, as the host sent it (its unknown fields too)."""
    return {} if part is None else dict(part.model_dump(mode="json", exclude_unset=True))


def status_model(snap: Snapshot) -> documents.StatusDocument:
    """The ``--json`` document (``docs/schemas/status.schema.json``, generated from the model)."""
    hosts = []
    for row in snap.hosts:
        probe = snap.probes.get(row.name)
        doc = probe.doc if probe and probe.ok else None
        hosts.append(documents.HostStatus(
            name=row.name, kind=row.kind, reachable=bool(probe and probe.ok),
            error=probe.error if probe and not probe.ok else "",
            unreachable_since=row.unreachable_since, last_probe_at=row.last_probe_at,
            probe_s=probe.duration_s if probe else None,
            agent_alive=doc.agent.alive if doc is not None else None,
            health=row.health, health_detail=row.health_detail, hold_reason=row.hold_text,
            price_per_hour=row.price_per_hour, provider=row.provider, instance_id=row.instance_id, spot=row.spot,
            lease_state=row.lease_state, lease_reason=row.lease_reason,
            slots=_shown(doc.slots if doc else None), gpus=[_shown(g) for g in (doc.gpus if doc else [])],
            disk=_shown(doc.disk if doc else None), memory=_shown(doc.memory if doc else None),
        ))
    sweeps = [documents.SweepStatus(id=sweep.id, queue_path=sweep.queue_path, created_at=sweep.created_at,
                                    jobs=sweep.job_count, states=snap.counts.get(sweep.id, {}),
                                    budget=_budget(snap, sweep.id, sweep.budget_usd),
                                    parts=[documents.SweepPartStatus(number=p.number, joined_at=p.created_at,
                                                                     queue_path=p.queue_path, jobs=p.job_count,
                                                                     bundle_sha=p.bundle_sha)
                                           for p in snap.parts.get(sweep.id, [])])
              for sweep in snap.sweeps]  # the raw strings: JSON escapes every control character
    alerts = [documents.Alert(time=a.time, severity=a.severity, rule=a.rule, subject=a.subject, message=a.message,
                              action=a.action) for a in alert_views(snap)]
    return documents.StatusDocument(schema_=STATUS_SCHEMA, generated_at=snap.generated_at, hosts=hosts,
                                    sweeps=sweeps, jobs=[job_model(v) for v in job_views(snap)], alerts=alerts)


def _budget(snap: Snapshot, sweep_id: str, cap: float | None) -> documents.SweepBudget:
    now = snap.budgets.get(sweep_id)
    if now is None:  # a snapshot built without budgets: what the ledger's cap says, nothing counted
        return documents.SweepBudget(cap=cap, spent=0.0, committed=0.0)
    return documents.SweepBudget(cap=now.cap, spent=now.spent, committed=now.committed)


def job_model(view: JobView) -> documents.JobStatus:
    job, att = view.job, view.attempt
    return documents.JobStatus(
        id=job.id, sweep_id=job.sweep_id, name=job.name, task=job.task, epochs=known_epochs(job.epochs), gpus=job.gpus,
        state=job.state, host=job.host, host_gpus=view.host_gpus, attempt=job.attempt_count,
        step=att.step if att else None, total_steps=att.total_steps if att else None,
        epoch=att.epoch if att else None, loss=att.loss if att else None, eta_s=view.eta_s,
        heartbeat_age_s=view.heartbeat_age_s, cost=view.cost, exit_code=att.exit_code if att else None,
        message=att.message if att else "", waiting=view.waiting, node_hosts=att.node_hosts() if att else [],
    )


def status_doc(snap: Snapshot) -> dict[str, Any]:
    """The ``--json`` document as a dict."""
    return status_model(snap).as_dict()


def status_json(snap: Snapshot) -> None:
    sys.stdout.write(status_model(snap).dump())
