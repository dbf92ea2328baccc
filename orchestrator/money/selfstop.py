"""What a rented host's own stop cost (pure; docs/cost.md, "When no gpuq command runs").

A rented host whose agent heard from no gpuq command for ``lease_timeout_min`` and has no work stops
its own billing (payload/agent/gpuq_serving/gpuq_selfstop.py).  The controller finds it stopped at its
next command, with the host's own record out of reach on the stopped disk, so it bounds the stop from
what it saw itself: the host could not stop before ``lease`` after both the last gpuq command that
reached it and the end of its last work, and stops within one agent check (``CHECK_S``) of that.  The
idle hours billed are from the end of the last work to that stop, at the host's price.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECK_S = 5.0  # the agent looks at its lease at most this often (gpuq_selfstop.CHECK_EVERY_S)
SELF_STOPPING = ("runpod", "vastai")  # providers whose instances carry a stop of their own (docs/providers.md)


@dataclass(frozen=True)
class SelfStopCost:
    stopped_at: float  # the latest the host can have stopped, by gpuq's clock
    idle_hours: float  # billed with no work: from the end of the last work to the stop
    cost: float | None  # idle_hours at the host's price; None when its price is not known


def can_stop_itself(provider: str) -> bool:
    return provider in SELF_STOPPING


def self_stop_cost(
    last_contact: float, idle_since: float, lease_s: float, price_per_hour: float | None, found_at: float
) -> SelfStopCost:
    """``last_contact``: the last gpuq command that reached the host (its last answered probe);
    ``idle_since``: the end of its last work; ``found_at``: when gpuq saw it stopped (never later)."""
    stopped = min(max(last_contact, idle_since) + lease_s + CHECK_S, max(found_at, idle_since))
    hours = max(0.0, stopped - idle_since) / 3600.0
    return SelfStopCost(stopped, hours, None if price_per_hour is None else hours * price_per_hour)


def unseen_stop_cost(last_contact: float, price_per_hour: float | None, found_at: float) -> SelfStopCost:
    """The host stopped after jobs gpuq last saw running there ended, unseen (no gpuq command ran): their ends
    are on its stopped disk, so the latest it can have stopped is when gpuq found it, and what it billed since
    the last gpuq command that reached it is at most ``found_at - last_contact`` (``idle_hours``: that bound)."""
    hours = max(0.0, found_at - last_contact) / 3600.0
    return SelfStopCost(found_at, hours, None if price_per_hour is None else hours * price_per_hour)
