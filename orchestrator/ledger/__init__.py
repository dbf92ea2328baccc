"""The SQLite ledger: what gpuq believes.  The only package that imports sqlmodel.

Plain re-exports, imported on first use (PEP 562): the read path (``reader.py``, ``gpuq status
--no-probe``) and the price share (``pricing.py``) load without the ORM; naming ``Ledger`` or a table
model loads it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.core.lazyexports import lazy_exports

if TYPE_CHECKING:
    from orchestrator.ledger.pricing import PricedAttempt, attempt_price
    from orchestrator.ledger.refs import JobRef
    from orchestrator.ledger.store import Ledger
    from orchestrator.ledger.tables import (
        Artifact,
        Attempt,
        Checkpoint,
        Dependency,
        Event,
        HostFields,
        HostRow,
        Job,
        Metric,
        Pull,
        StopLook,
        Sweep,
        SweepPart,
    )

_HOME = {
    "Artifact": "orchestrator.ledger.tables",
    "Attempt": "orchestrator.ledger.tables",
    "Checkpoint": "orchestrator.ledger.tables",
    "Dependency": "orchestrator.ledger.tables",
    "Event": "orchestrator.ledger.tables",
    "HostFields": "orchestrator.ledger.tables",
    "HostRow": "orchestrator.ledger.tables",
    "Job": "orchestrator.ledger.tables",
    "JobRef": "orchestrator.ledger.refs",
    "Ledger": "orchestrator.ledger.store",
    "Metric": "orchestrator.ledger.tables",
    "PricedAttempt": "orchestrator.ledger.pricing",
    "Pull": "orchestrator.ledger.tables",
    "StopLook": "orchestrator.ledger.tables",
    "Sweep": "orchestrator.ledger.tables",
    "SweepPart": "orchestrator.ledger.tables",
    "attempt_price": "orchestrator.ledger.pricing",
}

__all__ = [
    "Artifact",
    "Attempt",
    "Checkpoint",
    "Dependency",
    "Event",
    "HostFields",
    "HostRow",
    "Job",
    "JobRef",
    "Ledger",
    "Metric",
    "PricedAttempt",
    "Pull",
    "StopLook",
    "Sweep",
    "SweepPart",
    "attempt_price",
]


__getattr__, __dir__ = lazy_exports(__name__, _HOME)

