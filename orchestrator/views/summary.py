"""The alerts and the per-sweep counts ``gpuq status`` shows below its tables: ``AlertView``, ``SweepView``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.views.text import printable

if TYPE_CHECKING:
    from orchestrator.api import Snapshot


@dataclass(frozen=True)
class AlertView:
    time: float
    severity: str  # "info" | "warn" | "escalate"
    rule: str
    subject: str
    message: str  # printable: a finding may quote a host
    action: str


@dataclass(frozen=True)
class SweepView:
    id: str
    queue_path: str
    created_at: float
    jobs: int
    states: dict[str, int]  # job state -> how many

    @property
    def line(self) -> str:
        """``sweep ID  N jobs  STATE=n ...  (queue)``."""
        summary = "  ".join(f"{state}={n}" for state, n in sorted(self.states.items()))
        return f"sweep {self.id}  {self.jobs} jobs  {summary}  ({self.queue_path})"


def alert_views(snap: Snapshot) -> list[AlertView]:
    """The latest findings, newest first (``Snapshot.alerts``: ledger events with a severity)."""
    return [AlertView(time=e.time, severity=e.severity or "info", rule=printable(e.rule),
                      subject=printable(e.subject), message=printable(e.message), action=printable(e.action))
            for e in snap.alerts]


def sweep_views(snap: Snapshot) -> list[SweepView]:
    return [SweepView(id=s.id, queue_path=printable(s.queue_path), created_at=s.created_at, jobs=s.job_count,
                      states=snap.counts.get(s.id, {})) for s in snap.sweeps]
