"""The outbound job spec: what the controller writes into a host's inbox for one attempt.

One frozen dataclass per part (the spec, its ``run`` table, its ``retry`` policy, a multi-node
job's ``node`` section), built by ``launcher.job_spec`` and turned into the wire JSON in one place,
``OutboundSpec.as_document`` (docs/host-protocol.md, "Job spec"; protocol.py).  The host's agent
parses the same JSON into its own frozen dataclasses (payload/agent/gpuq_base/gpuq_jobspec.py) once, at the
edge.  The document is the wire format of protocol 1.x: its keys and values never depend on how
the controller holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.ledger.sweeprun import DataRef


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSection:
    """The spec's ``run``: the project's ``[run]`` table as the host needs it (names of forwarded
    variables only, never values), with the setup key and ``[data]`` trees recorded at submit."""

    command: tuple[str, ...] = ()
    launcher: str = "torchrun"
    resume_args: tuple[str, ...] = ()
    checkpoint: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    metrics: str = ""
    metrics_regex: str = ""
    metric: str = ""
    mode: str = "max"
    progress: str = ""
    setup: str = ""
    setup_key: str = ""
    forward_env: tuple[str, ...] = ()
    data: Mapping[str, DataRef] = field(default_factory=dict)  # {NAME: tree and file}: transfer/datasync.py

    def as_document(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": list(self.command), "launcher": self.launcher, "resume_args": list(self.resume_args),
            "checkpoint": list(self.checkpoint), "outputs": list(self.outputs), "metrics": self.metrics,
            "metrics_regex": self.metrics_regex, "metric": self.metric, "mode": self.mode,
            "progress": self.progress, "setup": self.setup, "setup_key": self.setup_key,
            "forward_env": list(self.forward_env)}
        if self.data:  # only when there is some, as the spec has always carried it
            out["data"] = {name: ref.model_dump() for name, ref in self.data.items()}
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """The spec's ``retry``: what the host's agent may retry by itself (docs/checkpoints.md)."""

    left: int
    on: tuple[str, ...]
    signals: tuple[int, ...]
    deadlock_left: int
    stall_after_s: float
    startup_grace_s: float
    start_stall_after_s: float

    def as_document(self) -> dict[str, Any]:
        return {"left": self.left, "on": list(self.on), "signals": list(self.signals),
                "deadlock_left": self.deadlock_left, "stall_after_s": self.stall_after_s,
                "startup_grace_s": self.startup_grace_s, "start_stall_after_s": self.start_stall_after_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSection:
    """The spec's ``node``: one node of a multi-node job over SSH hosts (docs/multinode.md)."""

    rank: int
    nodes: int
    hosts: tuple[str, ...]
    master_addrs: tuple[str, ...]
    master_port: int
    timeout_s: float

    def as_document(self) -> dict[str, Any]:
        return {"rank": self.rank, "nodes": self.nodes, "hosts": list(self.hosts),
                "master_addrs": list(self.master_addrs), "master_port": self.master_port,
                "timeout_s": self.timeout_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboundSpec:
    """One attempt's inbox spec (protocol.py, "Job spec")."""

    schema: str
    protocol: str
    job_id: str
    name: str
    queue_id: str
    attempt: int
    task: str
    epochs: int | None  # None: nothing gave the job epochs (GPUQ_EPOCHS is then empty)
    gpus: int
    nodes: int
    seed: int | None
    config: str
    bundle_sha: str
    entry: str
    launcher: str
    python: str
    verify: tuple[str, ...]
    heartbeat_s: float
    ckpt_interval_s: float
    kill_grace_s: float
    min_free_gb: float
    scratch_gb: float
    durable_dir: str
    resume_from: str | None
    spec_hash: str
    env: Mapping[str, str]
    created_at: float
    args: tuple[str, ...]
    run: RunSection | None
    sigterm_grace_s: float | None = None  # spot hosts only
    retry: RetryPolicy | None = None
    node: NodeSection | None = None

    @property
    def data(self) -> Mapping[str, DataRef]:
        """The ``[data]`` trees the job reads ({} without a ``run``): synced before the spec goes."""
        return self.run.data if self.run is not None else {}

    def as_document(self) -> dict[str, Any]:
        """The wire JSON object (the optional keys only when set, ahead of the rest as ever, ``node`` last)."""
        out: dict[str, Any] = {}
        if self.sigterm_grace_s is not None:
            out["sigterm_grace_s"] = self.sigterm_grace_s
        if self.retry is not None:
            out["retry"] = self.retry.as_document()
        out.update({
            "schema": self.schema, "protocol": self.protocol, "job_id": self.job_id, "name": self.name,
            "queue_id": self.queue_id, "attempt": self.attempt, "task": self.task, "epochs": self.epochs,
            "gpus": self.gpus, "nodes": self.nodes, "seed": self.seed, "config": self.config,
            "bundle_sha": self.bundle_sha, "entry": self.entry, "launcher": self.launcher, "python": self.python,
            "verify": list(self.verify), "heartbeat_s": self.heartbeat_s, "ckpt_interval_s": self.ckpt_interval_s,
            "kill_grace_s": self.kill_grace_s, "min_free_gb": self.min_free_gb, "scratch_gb": self.scratch_gb,
            "durable_dir": self.durable_dir, "resume_from": self.resume_from, "spec_hash": self.spec_hash,
            "env": dict(self.env), "created_at": self.created_at, "args": list(self.args),
            "run": self.run.as_document() if self.run is not None else None})
        if self.node is not None:
            out["node"] = self.node.as_document()
        return out
