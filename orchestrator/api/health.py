"""Health verbs: ``doctor`` (GPU preflight on demand) and ``reap`` (VRAM zombies); ``watch`` is in ``watching.py``."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent import client
from orchestrator.agent.bundle import build_bundle
from orchestrator.agent.launcher import ensure_bundle
from orchestrator.context import Context
from orchestrator.core.errors import GpuqError, HostError, UsageError
from orchestrator.core.states import LEASE_UNPROBED
from orchestrator.host_documents import ReapCandidate, ReapDocument
from orchestrator.ledger import HostRow
from orchestrator.tick.preflight import HealthVerdict, preflight_all


def _rows(ctx: Context, names: Sequence[str]) -> list[HostRow]:
    rows = ctx.ledger.hosts()
    if not names:
        if not rows:
            raise UsageError("no host registered yet; `gpuq hosts add NAME user@address` or `gpuq submit` first")
        # a rented machine not up yet, or gone, has nothing to check (named, it is tried and says so)
        return [r for r in rows if r.lease not in LEASE_UNPROBED]
    known = {r.name: r for r in rows}
    missing = [n for n in names if n not in known]
    if missing:
        raise UsageError(f'unknown host "{missing[0]}"; `gpuq hosts list` shows the registered ones')
    return [known[n] for n in dict.fromkeys(names)]


def _agent_bundle(ctx: Context, row: HostRow) -> str:
    """The bundle whose agent answers on ``row``; a host that never got work gets the bare payload
    (an empty project, content-addressed, so every later doctor reuses it)."""
    if row.agent_bundle:
        return row.agent_bundle
    with tempfile.TemporaryDirectory(prefix="gpuq-doctor-") as empty:
        bundle = build_bundle(Path(empty), ctx.settings.bundle_cache)
    ensure_bundle(ctx.fleet.host(row), bundle)
    ctx.ledger.update_host(row.name, agent_bundle=bundle.sha256)
    return bundle.sha256


def doctor(ctx: Context, names: Sequence[str] = ()) -> list[HealthVerdict]:
    """Run the GPU preflight on these hosts (default: all) in parallel and record each verdict:
    a FAIL holds the host, a later PASS or WARN releases it."""
    rows = _rows(ctx, names)
    out: list[HealthVerdict] = []
    ready: list[str] = []
    for row in rows:
        try:
            _agent_bundle(ctx, row)
            ready.append(row.name)
        except GpuqError as exc:
            out.append(HealthVerdict(row.name, "unreachable", str(exc)))
    verdicts = preflight_all(ctx.ledger, ctx.fleet, ctx.settings, ready, "")
    out += [verdicts[n] for n in ready]
    order = {r.name: i for i, r in enumerate(rows)}
    return sorted(out, key=lambda v: order[v.host])


@dataclass
class ReapReport:
    host: str
    doc: ReapDocument | None  # None: the agent printed no reap document (see ``error``)
    exit_code: int
    error: str = ""

    @property
    def candidates(self) -> list[ReapCandidate]:
        return list(self.doc.candidates) if self.doc is not None else []


def reap(ctx: Context, name: str, *, force: bool = False) -> ReapReport:
    """The agent's VRAM-zombie detection on ``name`` (two samples); with ``force`` it detects again
    at that moment and kills what it finds (never from a stale list)."""
    row = _rows(ctx, [name])[0]
    host = ctx.fleet.host(row)
    sha = _agent_bundle(ctx, row)
    argv = ["reap", "--min-age-s", str(ctx.settings.reap_min_age_s), "--resample-s", str(ctx.settings.reap_resample_s)]
    if force:
        argv.append("--force")
    try:
        reaped = client.reap(host, sha, argv[1:], timeout=ctx.settings.reap_resample_s + 120)
    except HostError as exc:
        raise GpuqError(f"host {name}: {exc}") from exc
    doc = reaped.doc
    if doc is None:
        return ReapReport(name, None, reaped.code, reaped.said)
    if force:
        ctx.ledger.record_event("host", name, "reaped: " + (", ".join(f"{k.pid} {k.outcome}"
                                                                      for k in doc.killed) or "nothing"))
    return ReapReport(name, doc, reaped.code, reaped.said)
