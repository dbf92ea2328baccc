"""The GPU preflight (the agent's ``health`` verb, docs/health.md): run, record, hold a failing host."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from orchestrator import host_documents
from orchestrator.config import Settings
from orchestrator.errors import HostError
from orchestrator.fleet import Fleet
from orchestrator.host_documents import HealthDocument
from orchestrator.hosts.base import Host
from orchestrator.launcher import agent_argv
from orchestrator.ledger import HostRow, Ledger


@dataclass
class HealthVerdict:
    host: str
    verdict: str  # "pass" | "warn" | "fail" | "unreachable" (no verdict)
    detail: str  # the warning/failing checks, one line
    doc: HealthDocument | None = None  # the host's verdict document (None: it printed none)


def needs_preflight(row: HostRow | None) -> bool:
    """A host's first job waits for its GPU preflight; a Slurm login node has no GPUs of its own to
    check (Slurm's node health is the cluster's business)."""
    return row is not None and row.health == "" and row.kind != "slurm"


def preflight(host: Host, agent_bundle: str, settings: Settings, row: HostRow | None = None) -> HealthVerdict:
    """The agent's ``health`` verb (GPU preflight, docs/health.md): one round trip, a few seconds of
    GPU sampling.  A transport failure raises HostError; the agent's verdict is returned."""
    argv = ["health", "--samples", str(settings.preflight_samples)]
    if row is not None:
        argv += ["--min-free-gb", str(max(row.min_free_gb, settings.min_free_gb))]
        if row.python and row.train_device != "cpu":  # a rehearsal host trains on CPU: no CUDA torch expected
            argv += ["--python", row.python]
    result = host.run(agent_argv(host, agent_bundle, *argv), timeout=60 + 2 * settings.preflight_samples)
    try:
        doc = host_documents.read_health(host.name, result.stdout)
    except host_documents.ProtocolError as exc:
        tail = (result.stderr or result.stdout).strip()[-300:]
        return HealthVerdict(host.name, "fail", f"the health check printed no verdict (exit {result.exit_code}, "
                                                f"{exc.detail}): {tail}")
    bad = [f"{c.check}: {c.detail}" for c in doc.problems()]
    return HealthVerdict(host.name, doc.verdict, "; ".join(bad) or "all checks passed", doc)


def record_health(ledger: Ledger, verdict: HealthVerdict) -> None:
    """Store a preflight verdict; a FAIL holds the host (no new jobs) until a later PASS or WARN."""
    row = ledger.host(verdict.host)
    if row is None:
        return
    fields: dict[str, Any] = {"health": verdict.verdict, "health_at": time.time(), "health_detail": verdict.detail}
    if verdict.verdict == "fail":
        fields["hold_reason"] = f"unhealthy: {verdict.detail}"
    elif row.hold_reason.startswith("unhealthy"):
        fields["hold_reason"] = ""
    ledger.update_host(verdict.host, **fields)
    severity = {"pass": "info", "warn": "warn", "fail": "escalate"}[verdict.verdict]
    action = {"pass": "", "warn": "jobs may run; look at the warnings",
              "fail": "no jobs go to this host until `gpuq doctor` passes; gpuq places work elsewhere"}
    if row.provider and row.instance_id:  # a rented machine bills while it is held
        price = f"${row.price_per_hour:.2f}/h" if row.price_per_hour is not None else "by the hour"
        action["fail"] = (f"no jobs go to it, yet it bills {price}: end it with `gpuq down {row.name}`"
                          + (" (down-when-done ends it once nothing runs there)" if row.down_when_done else "")
                          + f", and rent a replacement with `gpuq up --provider {row.provider} --gpu "
                            f"\"{row.gpu_type}\"`; or `gpuq doctor {row.name}` again if it was passing")
    ledger.record_finding("host", verdict.host, severity=severity, rule="preflight",
                          message=f"GPU preflight {verdict.verdict.upper()}: {verdict.detail}",
                          action=action[verdict.verdict])


def preflight_all(ledger: Ledger, fleet: Fleet, settings: Settings, names: Sequence[str],
                  agent_bundle: str) -> dict[str, HealthVerdict]:
    """Preflight these hosts in parallel and record each verdict; an unreachable host fails."""
    def one(name: str) -> HealthVerdict:
        row = ledger.host(name)
        try:
            return preflight(fleet.named(name), agent_bundle or (row.agent_bundle if row else ""), settings, row)
        except HostError as exc:  # no verdict on its GPUs: not recorded, but no job goes there now
            return HealthVerdict(name, "unreachable", str(exc))

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        verdicts = list(pool.map(one, names))
    for verdict in verdicts:
        if verdict.verdict != "unreachable":
            record_health(ledger, verdict)
    return {v.host: v for v in verdicts}
