"""What `gpuq up` made of each machine it rented (``UpResult``), and the replacement of one that failed
its GPU preflight (docs/providers.md, "Down when done")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.context import Context
from orchestrator.core.errors import GpuqError
from orchestrator.fleet import hostlease
from orchestrator.ledger import HostRow
from orchestrator.tick.preflight import HealthVerdict


@dataclass
class Unusable:
    """A machine gpuq rented and will not use."""

    host: str
    instance_id: str
    why: str
    ended: bool  # terminated and gone; False: it may still bill, and `gpuq down HOST` ends it
    end_error: str = ""

    def line(self, provider: str) -> str:
        if self.ended:
            return f"{self.host}: {provider} {self.instance_id} {self.why}; gpuq terminated it"
        return (f"{self.host}: {provider} {self.instance_id} {self.why}; terminating it failed "
                f"({self.end_error}): it may still bill, and `gpuq down {self.host}` ends it")


@dataclass
class UpResult:
    provider: str
    lease: str
    wanted: int = 0
    hosts: list[HostRow] = field(default_factory=list)  # registered and usable
    verdicts: dict[str, HealthVerdict] = field(default_factory=dict)
    unusable: list[Unusable] = field(default_factory=list)
    not_created: list[str] = field(default_factory=list)  # hosts whose machine was never created (rows gone)
    noticed: list[str] = field(default_factory=list)  # hosts that notify the user's webhook (no stop of their own)
    shortfall: str = ""  # the provider's words for why they were not
    unknown: dict[str, str] = field(default_factory=dict)  # host -> why gpuq cannot tell whether it bills
    replaced: dict[str, str] = field(default_factory=dict)  # host that failed its preflight -> its replacement

    @property
    def ok(self) -> bool:
        return bool(self.hosts) and not (self.unusable or self.not_created or self.unknown)

    def problems(self) -> list[str]:
        """One line per machine that is not a usable host, and one for those never created."""
        lines = [u.line(self.provider) for u in self.unusable]
        if self.not_created:
            lines.append(f"{len(self.not_created)} of {self.wanted} not created ({', '.join(self.not_created)}): "
                         f"{self.shortfall}")
        lines += [f"{host}: {why}" for host, why in self.unknown.items()]
        return lines


class UpInterrupted(KeyboardInterrupt):
    """``gpuq up`` was interrupted; ``result`` says what became of each machine rented so far."""

    def __init__(self, result: UpResult) -> None:
        super().__init__("gpuq up was interrupted")
        self.result = result


def replace_unhealthy(ctx: Context, out: UpResult, again: Callable[[str], UpResult],
                       say: Callable[[str], None]) -> None:
    """A down-when-done machine that failed its GPU preflight gets no job and would only bill: it is
    terminated now (the teardown gate) and one machine of the same shape is rented in its place."""
    from orchestrator.tick import teardown

    for row in list(out.hosts):
        verdict = out.verdicts.get(row.name)
        if not row.down_when_done or verdict is None or verdict.verdict != "fail":
            continue
        why = f"failed its GPU preflight ({verdict.detail})"
        outcome, gone = teardown.terminate(ctx, row, reason=why)
        out.hosts.remove(row)
        if gone is None:
            out.unusable.append(Unusable(row.name, row.instance_id, why, ended=False, end_error=outcome))
            continue
        say(f"{row.name}: {why}: terminated; renting one in its place")
        try:
            more = again(row.name)
        except GpuqError as exc:
            out.unusable.append(Unusable(row.name, row.instance_id, f"{why}; no replacement: {exc}", ended=True))
            continue
        out.hosts += more.hosts
        out.verdicts.update(more.verdicts)
        out.unusable += more.unusable
        out.not_created += more.not_created
        out.unknown.update(more.unknown)
        if more.hosts:
            out.replaced[row.name] = more.hosts[0].name
        else:
            out.unusable.append(Unusable(row.name, row.instance_id, f"{why}; its replacement never became usable",
                                         ended=True))


def send_leases(ctx: Context, out: UpResult) -> None:
    """Each new machine whose provider cannot stop it from inside gets its lease with the user's webhook
    (fleet/hostlease.py); one that could not be written is said in an event (the machine bills on either way)."""
    for row in out.hosts:
        lease = hostlease.lease_for(row.provider, ctx.settings)
        if lease is None:
            continue
        try:
            hostlease.send_lease(ctx.fleet.host(row), lease)
            out.noticed.append(row.name)
        except GpuqError as exc:
            ctx.ledger.record_event("host", row.name, f"no lease notice set up there: {exc}")
