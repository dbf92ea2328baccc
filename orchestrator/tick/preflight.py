"""The GPU preflight (the agent's ``health`` verb, docs/health.md): run, record, hold a failing host."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator.agent import client
from orchestrator.core.config import Settings
from orchestrator.core.errors import HostError
from orchestrator.core.states import HoldChange, HoldKind
from orchestrator.fleet.registry import Fleet
from orchestrator.host_documents import HealthDocument
from orchestrator.hosts.base import Host
from orchestrator.ledger import HostFields, HostRow, Ledger
from orchestrator.scheduling.gpumatch import ANY_GPU, GpuNeed, facts_json


@dataclass
class HealthVerdict:
    host: str
    verdict: str  # "pass" | "warn" | "fail" | "unreachable" (no verdict) | "mismatch" (below)
    detail: str  # the warning/failing checks, one line
    doc: HealthDocument | None = None  # the host's verdict document (None: it printed none)


def needs_preflight(row: HostRow | None) -> bool:
    """A host's first job waits for its GPU preflight; a Slurm login node has no GPUs of its own to
    check (Slurm's node health is the cluster's business)."""
    return row is not None and row.health == "" and row.kind != "slurm"


def preflight(host: Host, agent_bundle: str, settings: Settings, row: HostRow | None = None,
              need: GpuNeed = ANY_GPU) -> HealthVerdict:
    """The agent's ``health`` verb (GPU preflight, docs/health.md): one round trip, a few seconds of
    GPU sampling.  A transport failure raises HostError; the agent's verdict is returned.

    ``need``: what the jobs planned there ask of its GPUs (``gpu=`` / ``gpu_mem=``), passed on as
    ``--gpu-model`` / ``--min-gpu-mem-mib``.  When that is all that fails (the GPUs are not what the
    ledger last saw), the verdict is "mismatch": the host is not unhealthy, only not for those jobs."""
    argv = ["health", "--samples", str(settings.preflight_samples)]
    if row is not None:
        argv += ["--min-free-gb", str(max(row.min_free_gb, settings.min_free_gb))]
        if row.python and row.train_device != "cpu":  # a rehearsal host trains on CPU: no CUDA torch expected
            argv += ["--python", row.python]
    for model in need.models:
        argv += ["--gpu-model", model]
    if need.mem_mib is not None:
        argv += ["--min-gpu-mem-mib", f"{need.mem_mib:.1f}"]
    answer = client.health(host, agent_bundle, argv[1:], timeout=60 + 2 * settings.preflight_samples)
    doc = answer.doc
    if doc is None:
        return HealthVerdict(host.name, "fail", f"the health check printed no verdict (exit {answer.code}, "
                                                f"{answer.unread}")
    bad = [f"{c.check}: {c.detail}" for c in doc.problems()]
    if need and doc.verdict == "fail" and all(c.check == "identity" for c in doc.checks if c.status == "fail"):
        return HealthVerdict(host.name, "mismatch", "; ".join(bad), doc)
    return HealthVerdict(host.name, doc.verdict, "; ".join(bad) or "all checks passed", doc)


def record_health(ledger: Ledger, verdict: HealthVerdict) -> None:
    """Store a preflight verdict; a FAIL holds the host (no new jobs) until a later PASS or WARN."""
    row = ledger.host(verdict.host)
    if row is None:
        return
    fields: HostFields = {"health": verdict.verdict, "health_at": time.time(), "health_detail": verdict.detail}
    hold = HoldChange(HoldKind.UNHEALTHY, verdict.detail) if verdict.verdict == "fail" else \
        HoldChange.lift(HoldKind.UNHEALTHY)
    ledger.change_hold(verdict.host, hold, **fields)
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
                  agent_bundle: str, needs: Mapping[str, GpuNeed] | None = None) -> dict[str, HealthVerdict]:
    """Preflight these hosts in parallel and record each verdict; an unreachable host fails.  ``needs``:
    what the jobs planned on each host ask of its GPUs; a "mismatch" is recorded as an event only (no
    verdict, no hold: the host's next first job is preflighted again)."""
    def one(name: str) -> HealthVerdict:
        row = ledger.host(name)
        try:
            return preflight(fleet.named(name), agent_bundle or (row.agent_bundle if row else ""), settings, row,
                             (needs or {}).get(name, ANY_GPU))
        except HostError as exc:  # no verdict on its GPUs: not recorded, but no job goes there now
            return HealthVerdict(name, "unreachable", str(exc))

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        verdicts = list(pool.map(one, names))
    for verdict in verdicts:
        if verdict.verdict == "mismatch":  # the ledger's picture of its GPUs was stale: the preflight's is not
            if verdict.doc is not None and verdict.doc.gpus:
                ledger.update_host(verdict.host, gpu_facts=facts_json(
                    (g.name or "", g.memory_total_mib) for g in verdict.doc.gpus))
            ledger.record_event("host", verdict.host, f"GPU preflight: not what the jobs planned here need "
                                                      f"({verdict.detail}); they are planned elsewhere",
                                unless_repeated=True)
        elif verdict.verdict != "unreachable":
            record_health(ledger, verdict)
    return {v.host: v for v in verdicts}
