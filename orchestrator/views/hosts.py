"""One host as ``gpuq status`` and the live dashboard show it: ``HostView`` (and ``GpuView`` per device).

Everything a host's status document says is read here once, bounded to numbers and printable text
(``views/text.py``); the tables in ``cli/`` draw these fields and never read the document.  The
reachability line and the flags come with the rich style they are drawn in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.core.states import LEASE_REVIVABLE, HoldKind, LeaseState
from orchestrator.views.jobs import slot_jobs
from orchestrator.views.text import clock, duration, one_line, printable

if TYPE_CHECKING:
    from orchestrator.api import Snapshot
    from orchestrator.host_documents import Gpu
    from orchestrator.ledger import HostRow
    from orchestrator.tick.probe import Probe

HEALTH_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class GpuView:
    index: int | None
    model: str  # "A100-SXM4-80GB": the host's name for it, without "NVIDIA ", printable
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    temp_c: float | None
    job_id: str | None  # the job whose attempt holds this GPU


@dataclass(frozen=True)
class HostView:
    row: HostRow
    probe: Probe | None
    state: tuple[str, str]  # (text, style): host_state
    flags: list[tuple[str, str]]  # (text, style): host_flags
    answered: bool  # this tick's probe returned a valid document
    slots: str  # "free/total kind" ("?" where the document did not say)
    has_slots: bool
    gpus: list[GpuView] = field(default_factory=list)
    cpu_jobs: list[tuple[str, list[int]]] = field(default_factory=list)  # a CPU host: job id, the slots it holds
    disk_pct: float | None = None
    inodes_pct: float | None = None
    mem_pct: float | None = None


def host_views(snap: Snapshot) -> list[HostView]:
    return [host_view(row, snap.probes.get(row.name), now=snap.generated_at, idle_since=snap.idle.get(row.name))
            for row in snap.hosts]


def host_view(row: HostRow, probe: Probe | None, *, now: float | None = None,
              idle_since: float | None = None) -> HostView:
    doc = probe.doc if probe is not None and probe.ok else None
    held = slot_jobs(doc)
    gpus = [_gpu(g, held) for g in doc.gpus] if doc is not None else []
    cpu_jobs: dict[str, list[int]] = {}
    if not gpus:
        for slot, job_id in sorted(held.items()):
            cpu_jobs.setdefault(printable(job_id), []).append(slot)
    return HostView(
        row=row, probe=probe, state=host_state(row, probe), flags=host_flags(row, now=now, idle_since=idle_since),
        answered=doc is not None,
        slots=printable(f"{doc.slots.free}/{doc.slots.total} {doc.slots.kind}") if doc is not None else "",
        has_slots=doc is not None, gpus=gpus, cpu_jobs=list(cpu_jobs.items()),
        disk_pct=number(doc.disk.used_pct) if doc is not None else None,
        inodes_pct=number(doc.disk.inodes_used_pct) if doc is not None else None,
        mem_pct=number(doc.memory.used_pct) if doc is not None and doc.memory is not None else None,
    )


def _gpu(gpu: Gpu, held: dict[int, str]) -> GpuView:
    job_id = held.get(gpu.index) if gpu.index is not None else None
    return GpuView(index=gpu.index, model=printable(gpu.name).removeprefix("NVIDIA "),
                   util_pct=number(gpu.util_pct), mem_used_mib=number(gpu.mem_used_mib),
                   mem_total_mib=number(gpu.mem_total_mib), temp_c=number(gpu.temp_c),
                   job_id=printable(job_id) if job_id else None)


def host_state(row: HostRow, probe: Probe | None) -> tuple[str, str]:
    """(text, style) of a host's reachability: ok; unreachable since T (never "dead": a transport
    failure says nothing about the jobs); reachable without an agent answer; not probed this tick;
    a rented machine not up yet: provisioning (never probed)."""
    if row.provider and row.lease is LeaseState.PROVISIONING:
        return "provisioning (not probed)", "yellow"  # the flags say since when
    if probe is not None and probe.ok:
        return "ok", "green"
    if probe is not None and probe.reachable and probe.error.startswith("protocol error"):
        return one_line(probe.error, 100), "bold red"  # the host answered with no valid document
    if probe is not None and probe.reachable:
        return f"reachable ({one_line(probe.error, 100)})", "yellow"
    if probe is None and not row.unreachable_since:
        return "not probed", "dim"
    since = clock(row.unreachable_since) if row.unreachable_since else "now"
    notes = [f"{row.probe_failures} failures"] if row.probe_failures > 1 else []
    if row.next_probe_at:
        notes.append(f"next try {clock(row.next_probe_at)}")
    text = f"unreachable since {since}" + (f" ({', '.join(notes)})" if notes else "")
    return (f"{text}: {one_line(probe.error, 100)}" if probe is not None and probe.error else text), "red"


def lease_text(row: HostRow, now: float | None = None) -> str:
    """A rented host's lease as people read it: "provisioning for 3m" (since gpuq recorded it, before its
    create call; with ``now``), "terminated: <why>"; "" for a host the user brought or one running."""
    if not row.provider or row.lease in (LeaseState.NONE, LeaseState.RUNNING):
        return ""
    if row.lease is LeaseState.PROVISIONING:
        age = f" for {duration(now - row.created_at)}" if now is not None and row.created_at else ""
        what = printable(row.instance_id) if row.instance_id else "no instance id yet"
        return f"provisioning{age} ({what})"
    why = f": {one_line(row.lease_reason, 60)}" if row.lease_reason else ""
    return f"{row.lease.value}{why}{disk_bills(row)}"


def disk_bills(row: HostRow) -> str:
    """``"; still bills its disk ..."`` for a stopped or preempted machine whose provider bills a stopped
    machine's disk (RunPod, vast.ai: only terminate stops the meter; providers/registry.stop_bills_storage), else ""."""
    from orchestrator.providers.registry import stop_bills_storage

    if not row.provider or row.lease not in LEASE_REVIVABLE or row.hold is HoldKind.TERMINATED:
        return ""
    if not stop_bills_storage(row.provider):
        return ""
    return f"; still bills its disk (`gpuq down {printable(row.name)}` ends it)"


def host_flags(row: HostRow, *, now: float | None = None, idle_since: float | None = None) -> list[tuple[str, str]]:
    """(text, style) flags a person must not miss: an unhealthy verdict, a hold on new jobs, a lease
    that is not running (a machine still provisioning bills too)."""
    flags = []
    detail = f": {one_line(row.health_detail, 80)}" if row.health_detail else ""
    if row.health == "fail":
        flags.append((f"UNHEALTHY{detail}", HEALTH_STYLE["fail"]))
    elif row.health == "warn":
        flags.append((f"health warn{detail}", HEALTH_STYLE["warn"]))
    if row.held:
        flags.append((f"HELD: {one_line(row.hold_text, 80)}", "bold yellow"))
    if row.provider and row.lease is LeaseState.PROVISIONING:
        flags.append(("PROVISIONING" + lease_text(row, now).removeprefix("provisioning"), "bold yellow"))
    elif row.provider and row.lease not in (LeaseState.NONE, LeaseState.RUNNING):
        why = f": {one_line(row.lease_reason, 60)}" if row.lease_reason else ""
        flags.append((f"{row.lease.value.upper()}{why}{disk_bills(row)}", "bold red"))
    if row.provider and idle_since is not None and now is not None:  # a rented host with no work bills all the same
        flags.append((f"IDLE {duration(now - idle_since)}: `gpuq down {printable(row.name)}` ends it", "bold yellow"))
    if row.provider and row.price_per_hour is not None:
        flags.append((f"{printable(row.provider)}{' spot' if row.spot else ''} ${row.price_per_hour:.2f}/h", "dim"))
    return flags
