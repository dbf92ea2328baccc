"""What an attempt pays: the share of its hosts' prices it fixes when it starts, and the columns a budget
reckons its money from.  Plain Python (no ORM): the ledger, the budget and the read path share it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from orchestrator.ledger.tables import HostRow



class PricedAttempt(NamedTuple):
    """The columns of an attempt its money is reckoned from (``cost.Billed``), and whose it is."""

    job_id: str
    state: str
    started_at: float | None
    ended_at: float | None
    price_per_hour: float | None
    gpu_share: float


def attempt_price(gpus: int, rows: Sequence[HostRow | None]) -> tuple[float, float] | None:
    """(price per hour, share) an attempt of ``gpus`` GPUs on these hosts (node rank 0 first) fixes when it
    starts: the host's price and the attempt's share of its GPUs (or slots).  A multi-node attempt pays its
    share of every node's host: the sum, as one price at a share of 1.  None when no host has a price.  The
    one place the price share is decided: the ledger when an attempt starts, and a budget's projections."""
    shares = []
    for row in rows:
        if row is None or row.price_per_hour is None:
            continue
        slots = row.gpu_count or row.slots_total or gpus
        shares.append((row.price_per_hour, min(1.0, gpus / max(1, slots))))
    if not shares:
        return None
    if len(rows) == 1:
        return shares[0]
    return sum(price * share for price, share in shares), 1.0
