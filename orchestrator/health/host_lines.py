"""PURE: the patrol's one line per host for `gpuq status` (``PATROL h1 busy [warn] disk=..``): its usage
figures and the worst finding."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator.health.patrol import SEVERITY_RANK, Finding, Severity
from orchestrator.host_documents import Memory, StatusDocument


@dataclass
class HostLine:
    host: str
    state: str  # "ok" | "unreachable" | "backoff" | "no agent yet"
    detail: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        parts = [f"PATROL {self.host} {self.state}"] + [f"{k}={v}" for k, v in self.detail.items() if v != ""]
        return " ".join(parts)


def _shown(pct: float | None) -> str:
    """A percentage as the host reported it (an integral one without ".0"), "?" when unknown."""
    if pct is None:
        return "?"
    return str(int(pct)) if pct == int(pct) else str(pct)


def host_line(host: str, doc: StatusDocument | None, findings: Iterable[Finding], *, error: str = "",
              unreachable_since: float | None = None, failures: int = 0, next_try: float | None = None,
              done: tuple[int, int] | None = None) -> str:
    if doc is None:
        if unreachable_since is None and not failures:
            return HostLine(host, error or "not probed").render()
        since = time.strftime("%H:%MZ", time.gmtime(unreachable_since)) if unreachable_since else "now"
        nxt = f", next try {time.strftime('%H:%M:%SZ', time.gmtime(next_try))}" if next_try else ""
        return HostLine(host, f"unreachable since {since} ({failures} failures{nxt})").render()
    jobs = [j for j in doc.jobs if j.state == "running"]
    mem = doc.memory if doc.memory is not None else Memory()
    util = [g.util_pct for g in doc.gpus if g.util_pct is not None]
    detail: dict[str, str] = {}
    for j in jobs[:3]:
        beat = j.beat
        label = f"{j.name or j.job_id}:a{j.attempt}"
        if beat is not None:
            detail[label] = f"step={beat.step} ep={beat.epoch}/{beat.epochs}"
        else:
            detail[label] = "starting"
    if len(jobs) > 3:
        detail["more"] = str(len(jobs) - 3)
    detail["disk"] = f"{_shown(doc.disk.used_pct)}%"
    detail["ino"] = f"{_shown(doc.disk.inodes_used_pct)}%"
    detail["mem"] = f"{_shown(mem.used_pct)}%"
    if util:
        detail["gpu"] = f"{sum(util) / len(util):.0f}%"
    if done is not None:
        detail["done"] = f"{done[0]}/{done[1]}"
    worst = max((f.severity for f in findings), key=SEVERITY_RANK.__getitem__, default=None)
    state = "running" if jobs else "idle"
    if worst is not None and worst != Severity.INFO:
        state += f" [{worst.value}]"
    return HostLine(host, state, detail).render()
