"""The SQLite ledger: what gpuq believes.  The only package that imports sqlmodel."""

from orchestrator.ledger.refs import JobRef
from orchestrator.ledger.store import Ledger, PricedAttempt, attempt_price
from orchestrator.ledger.tables import Artifact, Attempt, Checkpoint, Event, HostRow, Job, Metric, Pull, Sweep

__all__ = [
    "Artifact",
    "Attempt",
    "Checkpoint",
    "Event",
    "HostRow",
    "Job",
    "JobRef",
    "Ledger",
    "Metric",
    "PricedAttempt",
    "Pull",
    "Sweep",
    "attempt_price",
]
