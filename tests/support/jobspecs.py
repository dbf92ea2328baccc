"""Job specs for tests: the controller's ``OutboundSpec`` with every field set, and its wire JSON
(what an agent test writes into an inbox or a job dir, ``spec_doc``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.agent.spec import NodeSection, OutboundSpec, RetryPolicy, RunSection
from orchestrator.core import protocol
from orchestrator.ledger.sweeprun import DataRef

JOB = "c0123456789ab"


def outbound_spec(**fields: Any) -> OutboundSpec:
    """A spec with every field set (``run``, ``retry``, ``node``, ``sigterm_grace_s`` included)."""
    spec = OutboundSpec(
        schema=protocol.SPEC_SCHEMA, protocol=protocol.PROTOCOL_VERSION, job_id=JOB, name="lr/3", queue_id="q1",
        attempt=2, task="cls", epochs=3, gpus=2, nodes=2, seed=7, config="configs/a.yaml", bundle_sha="ab" * 32,
        entry="workdir/train.py", launcher="torchrun", python="/usr/bin/python3", verify=("metrics", "best_ckpt"),
        heartbeat_s=10, ckpt_interval_s=600, kill_grace_s=30, min_free_gb=1.5, scratch_gb=2, durable_dir="/d",
        resume_from="ckpt/last.pt", spec_hash="f" * 64, env={"NCCL_DEBUG": "WARN"}, created_at=1700000000.5,
        args=("--lr", "3"),
        run=RunSection(command=("train.py", "{args}"), launcher="python", resume_args=("--resume", "{ckpt}"),
                       checkpoint=("ckpt/*.pt",), outputs=("out/**",), metrics="metrics.csv",
                       metrics_regex=r"loss=(\S+)", metric="val_loss", mode="min", progress=r"step (\d+)",
                       setup="pip install -e .", setup_key="cd" * 32, forward_env=("HF_TOKEN",),
                       data={"train": DataRef(tree="e" * 64, file="train.bin")}),
        sigterm_grace_s=5.0,
        retry=RetryPolicy(left=2, on=("killed", "stalled"), signals=(9, 11), deadlock_left=1, stall_after_s=900.0,
                          startup_grace_s=600.0, start_stall_after_s=300.0),
        node=NodeSection(rank=1, nodes=2, hosts=("h0", "h1"), master_addrs=("10.0.0.1",), master_port=29400,
                         timeout_s=300.0))
    return replace(spec, **fields)


def spec_doc(**fields: Any) -> dict[str, Any]:
    """The wire JSON of a plain single-node spec (no run, retry, node or grace), ``fields`` set over it."""
    doc = outbound_spec(run=None, retry=None, node=None, sigterm_grace_s=None, nodes=1, attempt=1,
                        gpus=1).as_document()
    doc.update(fields)
    return doc
