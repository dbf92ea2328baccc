"""The alerts and the per-sweep counts ``gpuq status`` shows below its tables: ``AlertView``, ``SweepView``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.views.text import printable

if TYPE_CHECKING:
    from orchestrator.api import Snapshot
    from orchestrator.money.budget import Standing


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
    budget: Standing | None = None  # its cap, spent and committed (orchestrator/money/budget.py)
    joined: tuple[str, ...] = ()  # one line per part that joined it later (submit --into), printable

    @property
    def line(self) -> str:
        """``sweep ID  N jobs  STATE=n ...  (queue)``, a line per part that joined it later, and its budget line
        when it has a cap."""
        summary = "  ".join(f"{state}={n}" for state, n in sorted(self.states.items()))
        lines = [f"sweep {self.id}  {self.jobs} jobs  {summary}  ({self.queue_path})", *self.joined]
        lines += [self.budget_line] if self.budget_line else []
        return "\n  ".join(lines)

    @property
    def budget_line(self) -> str:
        """``budget $5.00: $3.10 spent + $1.20 committed of $5.00 (86%)``; "" without a cap."""
        if self.budget is None or self.budget.cap is None:
            return ""
        stopped = "; dispatch stopped" if self.budget.level == "stop" else ""
        return f"budget {self.id}: {self.budget.line()}{stopped}"


def alert_views(snap: Snapshot) -> list[AlertView]:
    """The latest findings, newest first (``Snapshot.alerts``: ledger events with a severity)."""
    return [AlertView(time=e.time, severity=e.severity or "info", rule=printable(e.rule),
                      subject=printable(e.subject), message=printable(e.message), action=printable(e.action))
            for e in snap.alerts]


def sweep_views(snap: Snapshot) -> list[SweepView]:
    return [SweepView(id=s.id, queue_path=printable(s.queue_path), created_at=s.created_at, jobs=s.job_count,
                      states=snap.counts.get(s.id, {}), budget=snap.budgets.get(s.id),
                      joined=tuple(printable(p.line) for p in snap.parts.get(s.id, []) if p.number > 1))
            for s in snap.sweeps]
