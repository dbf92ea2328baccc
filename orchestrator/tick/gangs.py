"""Multi-node jobs over SSH hosts: one attempt, one part per node, each part on its own host.

A ``nodes=K gpus=G`` job that no Slurm host takes runs on K SSH hosts at once (docs/multinode.md):

* the scheduler reserves the K hosts together (``list_scheduling._gang``); a gang is sent only when every
  node can start now, and the jobs planned after it on those hosts wait with it (``hold_back``), so it
  is never half started and never starved by the jobs behind it;
* the ledger records one attempt whose ``nodes`` names the host of each node rank (rank 0 is the
  job's host, where checkpoints and results are written);
* every host gets the same spec plus a ``node`` section: its rank, the node count, the head's
  addresses and the rendezvous port (``node_section``); the wrapper starts torchrun with a static
  rendezvous there, after checking that the head's port can be reached (payload/agent/gpuq_base/gpuq_gang.py);
* each tick reads every part from its host's status document (``parts_this_tick``); the attempt is
  judged on all of them at once (``standing_entry``): one part failing fails the attempt, the other
  parts are stopped (``stop_parts``), and the job resumes on K healthy hosts from the newest
  checkpoint, which the controller places on every node.

Nothing here does placement arithmetic (scheduler.py) or writes the ledger's states (tick/attempts.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from orchestrator.agent import client, handed
from orchestrator.agent.launcher import enqueue, job_spec, on_each_host, run_readable
from orchestrator.agent.spec import NodeSection, OutboundSpec
from orchestrator.core import protocol
from orchestrator.core.config import Settings
from orchestrator.core.errors import GpuqError, HostError, IllegalTransition
from orchestrator.core.specs import Assignment
from orchestrator.fleet.registry import Fleet
from orchestrator.host_documents import ExitRecord, JobEntry, StatusDocument
from orchestrator.hosts.base import Host
from orchestrator.ledger import Attempt, Job, Ledger
from orchestrator.scheduling.placements import Plan

RENDEZVOUS_PORTS = (20000, 50000)
"""Rendezvous ports are drawn from this range by job and attempt, so every node knows the port without
asking; a new attempt gets a new one (a port still held by a dying attempt is never reused at once)."""



@dataclass(frozen=True)
class Part:
    """One node of a multi-node attempt as this tick saw it."""

    rank: int
    host: str
    probed: bool  # the host answered this tick
    entry: JobEntry | None  # the part's status entry (None: the host does not hold this attempt)

    @property
    def state(self) -> str:
        """"unknown" (host not probed) | "missing" | the agent's state for the part."""
        if not self.probed:
            return "unknown"
        if self.entry is None:
            return "missing"
        return self.entry.state

    def ended_badly(self) -> bool:
        if self.state == "dead":
            return True
        if self.state != "exited":
            return False
        return self.entry is None or self.entry.exit_or_empty.code != protocol.EXIT_OK


def rendezvous_port(job_id: str, attempt: int) -> int:
    low, high = RENDEZVOUS_PORTS
    digest = hashlib.sha256(f"{job_id}:a{attempt}".encode()).digest()
    return low + int.from_bytes(digest[:4], "big") % (high - low)


def node_section(rank: int, hosts: Sequence[str], addresses: Sequence[str], port: int,
                 timeout_s: float) -> NodeSection:
    """The spec's ``node`` section for node ``rank`` (docs/host-protocol.md)."""
    return NodeSection(rank=rank, nodes=len(hosts), hosts=tuple(hosts), master_addrs=tuple(addresses),
                       master_port=port, timeout_s=timeout_s)


def head_addresses(host: Host) -> list[str]:
    """The address the other nodes reach the head on: the one gpuq itself reaches it by (its SSH
    endpoint's host name, after ``~/.ssh/config``, as the user or the provider's API gave it).

    Never what the head says about itself: node 0 is one rented host of the job, and a host that
    lies would point the other nodes' torchrun at a machine of its choosing.  [] when that name is
    not one other hosts can use (loopback, ``localhost``, not a well-formed name): the job is then
    not started (``deliver``)."""
    endpoint = getattr(host, "endpoint", None)
    name = str(getattr(endpoint, "hostname", "") or "")
    if not _HOSTNAME.fullmatch(name) or name.lower().rstrip(".") in ("localhost", "localhost.localdomain"):
        return []
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return [name]
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
        return []
    return [str(ip)]


def parts_this_tick(jobs: Sequence[Job], attempts: Mapping[str, Attempt],
                    docs: Mapping[str, StatusDocument | None]) -> dict[str, list[Part]]:
    """{job id: its parts by rank} for every active multi-node attempt; ``docs`` maps each host to its
    status document this tick (None: not probed, or its probe failed)."""
    out: dict[str, list[Part]] = {}
    for job in jobs:
        attempt = attempts.get(job.id)
        if attempt is None or attempt.number != job.attempt_count or not attempt.nodes:
            continue
        parts = []
        for rank, name in enumerate(attempt.node_hosts()):
            doc = docs.get(name)
            entry = doc.entry(job.id, attempt.number) if doc is not None else None
            parts.append(Part(rank, name, doc is not None, entry))
        out[job.id] = parts
    return out


def standing_entry(parts: Sequence[Part]) -> JobEntry | None:
    """The status entry that stands for the whole attempt, or None while nothing can be said.

    Node 0's entry carries progress, checkpoints and results.  When a part ended badly the attempt has
    failed, whatever node 0 says: the cause is a part that died or was killed (the others then fail
    because their peer is gone), else node 0 if it failed, else the first part that failed; its exit
    (or death) stands for the attempt, named by node and host."""
    head = parts[0]
    if head.entry is None:
        return None
    bad = [p for p in parts if p.ended_badly()]
    if not bad or (head.state == "exited" and not head.ended_badly()):
        return head.entry
    cause = next((p for p in bad if _outside_stop(p)), None) or (head if head in bad else bad[0])
    assert cause.entry is not None
    where = f"node {cause.rank} on {cause.host}"
    if cause.state == "dead":
        return head.entry.model_copy(update={"state": "dead", "exit": None, "gang_cause": where})
    exit_doc = cause.entry.exit_or_empty
    exit_doc = exit_doc.model_copy(update={"message": f"{where}: {exit_doc.message or 'failed'}"})
    update: dict[str, Any] = {"state": "exited", "exit": exit_doc, "gang_cause": where}
    if cause is not head:
        update["scan"] = cause.entry.scan
    return head.entry.model_copy(update=update)


def _outside_stop(part: Part) -> bool:
    """The part died, vanished or was killed by a signal (not a trainer error of its own)."""
    if part.state == "dead":
        return True
    exit_doc = part.entry.exit_or_empty if part.entry is not None else ExitRecord()
    return exit_doc.vanished or exit_doc.code > protocol.EXIT_SIGNAL_BASE or bool(exit_doc.wrapper_signal)


def waiting(parts: Sequence[Part]) -> list[Part]:
    """Parts not started yet (still in their host's inbox or claimed) while another part runs."""
    if not any(p.state in ("running", "exited", "dead") for p in parts):
        return []
    return [p for p in parts if p.state in ("queued", "claimed", "missing")]


def hold_back(decided: Plan) -> tuple[Plan, list[tuple[str, str]]]:
    """Send a multi-node job only when all its nodes start now; one that must wait keeps its hosts: the
    jobs planned to start on them at or after its start wait too (they would take the slots it waits
    for).  Returns the plan to deliver and (job id, why) for each job held back."""
    held: list[tuple[str, str]] = []
    reserved: dict[str, float] = {}  # host → the earliest start of a gang waiting for it
    for a in decided.assignments:
        if a.peers and a.start_s > 0:
            for name in (a.host, *a.peers):
                reserved[name] = min(reserved.get(name, a.start_s), a.start_s)
    keep = []
    for a in decided.assignments:
        if a.peers and a.start_s > 0:
            held.append((a.job_id, f"waiting for {1 + len(a.peers)} hosts with its GPUs free at once "
                                   f"({', '.join((a.host, *a.peers))}, in about {a.start_s / 60:.0f} min)"))
            continue
        blocking = [n for n in (a.host, *a.peers) if n in reserved and a.start_s >= reserved[n]]
        if blocking:
            held.append((a.job_id, f"waiting behind a multi-node job that reserved {', '.join(blocking)}"))
            continue
        keep.append(a)
    return replace(decided, assignments=tuple(keep)), held


# --- delivery ---------------------------------------------------------------------------------


def part_spec(ledger: Ledger, fleet: Fleet, settings: Settings, job: Job, attempt: Attempt, rank: int,
              addresses: Sequence[str]) -> OutboundSpec:
    """The spec node ``rank`` of ``attempt`` gets: the job's spec plus its ``node`` section."""
    names = attempt.node_hosts()
    row = ledger.host(names[rank])
    spec = job_spec(job, attempt, settings, sweep=ledger.sweep(job.sweep_id), host=row,
                    handed_over=handed.handed_paths(ledger, job, row))  # each node got the checkpoints (handover)
    return replace(spec, node=node_section(rank, names, addresses, rendezvous_port(job.id, attempt.number),
                                           settings.gang_timeout_s))


def addresses_of_head(fleet: Fleet, name: str) -> list[str]:
    return head_addresses(fleet.named(name))


_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")


def deliver(ledger: Ledger, fleet: Fleet, settings: Settings, assignments: Sequence[Assignment],
            jobs: Mapping[str, Job], bundle_sha: str) -> dict[str, str]:
    """Record each multi-node attempt (its node hosts in rank order, ledger first: exactly-once), then
    enqueue one part on every node host.  Returns {host: error} for the enqueues that failed: those
    parts are re-sent by the next tick (``resend_missing``), the agent's enqueue being idempotent."""
    failed: dict[str, str] = {}
    for a in assignments:
        job = jobs[a.job_id]
        names = [a.host, *a.peers]
        if not run_readable(ledger, job, ledger.sweep(job.sweep_id)):
            continue
        addresses = addresses_of_head(fleet, a.host)
        if not addresses:
            ledger.record_event("job", job.id, f"not started on {', '.join(names)}: gpuq reaches node 0's host "
                                f"{a.host} by a name the other nodes cannot use (loopback, a tunnel); "
                                "give it a HostName the other hosts reach", unless_repeated=True)
            continue
        try:
            attempt = ledger.start_attempt(job.id, host=a.host, bundle_sha=bundle_sha, peers=a.peers)
        except IllegalTransition as exc:
            ledger.record_event("job", job.id, f"not started on {', '.join(names)}: {exc}", unless_repeated=True)
            continue
        port = rendezvous_port(job.id, attempt.number)
        ledger.record_event("job", job.id, f"attempt {attempt.number} runs on {len(names)} nodes: "
                            + ", ".join(f"node {r} on {n}" for r, n in enumerate(names))
                            + f" (rendezvous port {port} on {names[0]})")
        work = []
        for rank, name in enumerate(names):
            ledger.update_host(name, agent_bundle=bundle_sha)
            spec = part_spec(ledger, fleet, settings, job, attempt, rank, addresses)
            work.append((fleet.named(name), partial(enqueue, fleet.named(name), bundle_sha, [spec], settings)))
        failed.update(on_each_host(work))
    return failed


def resend_missing(ledger: Ledger, fleet: Fleet, settings: Settings, job: Job, attempt: Attempt,
                   parts: Sequence[Part]) -> None:
    """Parts whose host answered without them (their enqueue never arrived): send them again."""
    missing = [p for p in parts if p.state == "missing"]
    if not missing:
        return
    addresses = addresses_of_head(fleet, parts[0].host)
    for part in missing:
        spec = part_spec(ledger, fleet, settings, job, attempt, part.rank, addresses)
        try:
            verdicts = enqueue(fleet.named(part.host), attempt.bundle_sha, [spec], settings)
        except GpuqError as exc:
            ledger.record_event("job", job.id, f"node {part.rank} not re-sent to {part.host}: {exc}",
                                unless_repeated=True)
            continue
        if verdicts.of(job.id) == "queued":
            ledger.record_event("job", job.id, f"node {part.rank} re-enqueued on {part.host} (its spec was never "
                                "delivered)")


def stop_parts(ledger: Ledger, fleet: Fleet, job: Job, attempt: Attempt, parts: Sequence[Part],
               why: str) -> list[str]:
    """Take every part of ``attempt`` still waiting out of its inbox and kill every one still alive
    (identity-checked, no cancel mark: the job runs again as attempt n+1).  Returns what was done."""
    done = []
    for part in parts:
        if part.state in ("exited", "dead", "withdrawn"):
            continue
        host = fleet.named(part.host)
        row = ledger.host(part.host)
        bundle = row.agent_bundle if row is not None else attempt.bundle_sha
        try:
            if part.state in ("queued", "missing", "unknown"):
                client.withdraw(host, bundle, [job.id])
            verdict = client.kill(host, bundle, job.id, attempt.number, timeout=120).text[-200:] or "not running"
        except HostError as exc:
            verdict = f"could not be reached ({exc})"
        done.append(f"node {part.rank} on {part.host}: {verdict}")
    if done:
        ledger.record_event("job", job.id, f"attempt {attempt.number}: {why}; stopped the other nodes: "
                            + "; ".join(done))
    return done
