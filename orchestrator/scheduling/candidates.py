"""PURE: which hosts a job may go to (its pin, size, nodes, GPUs and disk), or the reason a user can act on
when none may; ``list_scheduling`` places it on the best of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.core.specs import HostSlots
from orchestrator.scheduling.gpumatch import GpuNeed, HostGpus, unmet
from orchestrator.scheduling.placements import GB, PlanJob


def unusable_reason(host: HostSlots) -> str:
    return host.reason or "marked unusable"


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def job_need(gpus: int, host: HostSlots) -> int:
    """Slots one job takes on ``host``: its GPUs, or the host's fixed share per job (a Slurm host
    counts places in its queue, and Slurm packs the GPUs)."""
    return host.job_slots or max(1, gpus)


def host_candidates(
    job: PlanJob,
    need: int,
    hosts: Sequence[HostSlots],
    by_name: Mapping[str, HostSlots],
    usable: Sequence[HostSlots],
    disk_left: Mapping[str, float | None],
    matching: frozenset[str] | None = None,
) -> tuple[list[HostSlots], str]:
    """The hosts ``job`` may go to, or none and the specific reason why (``matching``: the hosts whose GPUs
    match its ``gpu=`` / ``gpu_mem=``; None: it asks for none)."""
    pool, why = _pool(job, hosts, by_name, usable, matching)
    if not why and job.nodes > 1:
        pool, why = _node_pool(job, need, pool)
    if why:
        return [], why
    fits = [h for h in pool if h.total >= job_need(job.gpus, h) and (h.max_gpus is None or need <= h.max_gpus)]
    if not fits:
        most = max(h.total if h.max_gpus is None else h.max_gpus for h in pool)
        where = f"host {job.host_pin} has" if job.host_pin is not None else "the largest usable host has"
        return [], f"needs {need} slots (gpus={need}); {where} {most}"
    return _with_disk(job, fits, disk_left)


def _pool(job: PlanJob, hosts: Sequence[HostSlots], by_name: Mapping[str, HostSlots], usable: Sequence[HostSlots],
          matching: frozenset[str] | None) -> tuple[list[HostSlots], str]:
    """The usable hosts the job's pin and hardware allow, or none and why."""
    if job.host_pin is not None:
        pinned = by_name.get(job.host_pin)
        if pinned is None:
            known = ", ".join(sorted(by_name)) or "none"
            return [], f"pinned to host {job.host_pin}, which is not among the hosts to plan on ({known})"
        if not pinned.usable:
            return [], f"pinned to host {job.host_pin}, which is {unusable_reason(pinned)}"
        if matching is not None and job.host_pin not in matching:
            return [], _unmet(job.need, [pinned])
        # a multi-node job pinned to an SSH host runs its node 0 there, the other nodes on other hosts
        pool = [pinned] + ([h for h in usable if h.gang and h is not pinned] if job.nodes > 1 and pinned.gang else [])
    elif not usable:
        if not hosts:
            return [], "no hosts to run on"
        down = "; ".join(f"{h.host} {unusable_reason(h)}" for h in hosts)
        return [], f"no usable host ({down})"
    else:
        pool = list(usable)
    if matching is not None:
        pool = [h for h in pool if h.host in matching]
        if not pool:
            return [], _unmet(job.need, hosts)
    return pool, ""


def _node_pool(job: PlanJob, need: int, pool: list[HostSlots]) -> tuple[list[HostSlots], str]:
    """For a multi-node job: the Slurm hosts that span its nodes and the SSH hosts of a gang, or why none."""
    if job.host_pin is not None and pool[0].gang and pool[0].total < need:
        return pool[:1], ""  # node 0 goes to its pinned host, which is too small: said by the caller
    spans = [h for h in pool if not h.gang and h.max_nodes >= job.nodes]
    gang = [h for h in pool if h.gang and h.total >= need]
    if len(gang) < job.nodes:
        gang = []
    if not spans and not gang:
        most = max((h.max_nodes for h in pool if not h.gang), default=0)
        wide = sum(1 for h in pool if h.gang and h.total >= need)
        return [], (f"needs {job.nodes} nodes with gpus={need} each: {job.nodes} SSH hosts with {need} slots "
                    f"each ({wide} usable), or a Slurm host with {job.nodes} nodes"
                    + (f" (the most any has is {most})" if most > 1 else ""))
    return spans + gang, ""


def _with_disk(job: PlanJob, fits: list[HostSlots],
               disk_left: Mapping[str, float | None]) -> tuple[list[HostSlots], str]:
    """The hosts of ``fits`` with the disk the job needs left (on every node of a gang), or none and why."""
    room = [h for h in fits if (left := disk_left[h.host]) is None or left >= job.disk_bytes]
    if job.nodes > 1 and room and all(h.gang for h in room):  # a gang needs the disk on every node
        ready = [h.host for h in room]
        if len(ready) < job.nodes or (job.host_pin is not None and job.host_pin not in ready):
            return [], (f"needs {job.nodes} hosts with {_gb(job.disk_bytes)} of disk each"
                        + (f", {job.host_pin} among them" if job.host_pin is not None else "")
                        + f"; {len(ready)} {'has' if len(ready) == 1 else 'have'} that much left ({', '.join(ready)})")
    if not room:
        most_left = max(disk_left[h.host] or 0.0 for h in fits)
        where = (f"host {job.host_pin} has {_gb(most_left)} left" if job.host_pin is not None
                 else f"the most any host has left is {_gb(most_left)}")
        return [], f"needs {_gb(job.disk_bytes)} of disk; {where}"
    return room, ""


def _unmet(need: GpuNeed, hosts: Sequence[HostSlots]) -> str:
    return unmet(need, [HostGpus(h.host, h.gpu_models, h.gpu_mem_mib, h.usable, unusable_reason(h)) for h in hosts])
