"""The ledger rows' own methods, in plain Python: the table models (``tables.py``) inherit them, and so do
the read path's records (``reader.py``), so a row read either way answers the same."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from orchestrator.core.states import HoldKind, LeaseState, hold_text
from orchestrator.ledger.sweeprun import SweepRun, parse_run


class HostMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        lease_state: str
        hold_kind: str
        hold_detail: str

    @property
    def lease(self) -> LeaseState:
        """Where its lease stands (NONE: not rented)."""
        return LeaseState(self.lease_state)

    @property
    def hold(self) -> HoldKind:
        """Why it gets no new job (NONE: it is not held)."""
        return HoldKind(self.hold_kind)

    @property
    def held(self) -> bool:
        """Whether it is held: no new job goes there."""
        return self.hold is not HoldKind.NONE

    @property
    def hold_text(self) -> str:
        """Its hold as one line for people ("" when not held)."""
        return hold_text(self.hold, self.hold_detail)


class SweepMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        hosts: str
        run: str

    def host_set(self) -> set[str]:
        return {h for h in self.hosts.split(",") if h}

    def run_config(self) -> SweepRun | None:
        """The sweep's ``[run]`` table (None without one; ``unreadable`` set when its stored text is not
        one): ``sweeprun.parse_run``, the one reader of ``Sweep.run``."""
        return parse_run(self.run)


class PartMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        number: int
        created_at: float
        queue_path: str
        job_count: int

    @property
    def joined(self) -> str:
        """``joined: part 2, 2026-12-02 16:10 UTC``: when the part joined its sweep (``submit --into``)."""
        return f"joined: part {self.number}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(self.created_at))}"

    @property
    def line(self) -> str:
        """Its ``joined`` with the queue and the jobs it added."""
        return f"{self.joined} ({self.queue_path}, {self.job_count} job{'s' if self.job_count != 1 else ''})"


class JobMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        args: str

    def arg_list(self) -> list[str]:
        return [str(a) for a in json.loads(self.args or "[]")]


class AttemptMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        nodes: str

    def node_hosts(self) -> list[str]:
        """The hosts of a multi-node attempt by node rank ([] for a one-host attempt)."""
        if not self.nodes:
            return []
        found = json.loads(self.nodes)
        return [str(h) for h in found] if isinstance(found, list) else []


UNKNOWN_SIGNATURES = "unknown"  # v17: an older gpuq's crash finding whose action did not name its signatures


class EventMethods:
    __slots__ = ()
    if TYPE_CHECKING:
        signatures: str

    @property
    def signature_names(self) -> tuple[str, ...]:
        """A crash finding's crash signature names; none for any other event, and none where an older gpuq's
        finding did not say them (``signatures`` is then "unknown")."""
        if self.signatures in ("", UNKNOWN_SIGNATURES):
            return ()
        return tuple(str(name) for name in json.loads(self.signatures))
