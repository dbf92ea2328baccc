"""Carry out assignments on a host: place the bundle, write inbox specs, ensure the agent.

Order matters for exactly-once: the ledger records attempt n (STARTING) before
the spec reaches the host, and the agent's ``enqueue`` refuses a spec whose
job/attempt already exists anywhere under the root.  So a controller killed
between the two steps leaves an attempt the next reconcile re-enqueues, never
a job that runs without the ledger knowing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from orchestrator import protocol
from orchestrator.bundle import Bundle
from orchestrator.config import Settings
from orchestrator.errors import AgentError, BundleError
from orchestrator.hosts.base import Host
from orchestrator.ledger import Attempt, Job, Ledger

# Unpack into a private temp dir, then rename: a live bundle is never overwritten.
UNPACK_SCRIPT = (
    'set -eu; cd "$1"; mkdir -p bundles; d="bundles/.$2.unpack.$$"; rm -rf "$d"; mkdir -p "$d"; '
    'tar -xf "$3" -C "$d"; if [ -d "bundles/$2" ]; then rm -rf "$d"; else mv "$d" "bundles/$2"; fi; rm -f "$3"'
)


def agent_path(host: Host, bundle_sha: str) -> str:
    return host.path(protocol.BUNDLES_DIR, bundle_sha, protocol.AGENT_ENTRY)


def agent_argv(host: Host, bundle_sha: str, *args: str) -> list[str]:
    return [host.python, agent_path(host, bundle_sha), "--root", host.root, *args]


def ensure_bundle(host: Host, bundle: Bundle) -> bool:
    """Place the bundle on the host unless it is there; True when bytes were pushed."""
    present = host.run(["test", "-f", host.path(protocol.BUNDLES_DIR, bundle.sha256, protocol.BUNDLE_MANIFEST)])
    if present.exit_code == 0:
        return False
    remote_tar = host.path(protocol.BUNDLES_DIR, f".{bundle.sha256}.tar")
    host.put(bundle.path, remote_tar)
    result = host.run(["sh", "-c", UNPACK_SCRIPT, "sh", host.root, bundle.sha256, remote_tar], timeout=300)
    if result.exit_code != 0:
        raise BundleError(f"host {host.name}: unpacking bundle {bundle.sha256[:12]} failed: {result.stderr.strip()}")
    return True


def job_spec(job: Job, attempt: Attempt, settings: Settings, *, created_at: float | None = None) -> dict[str, Any]:
    """The inbox document for one attempt (protocol.py, "Job spec")."""
    return {
        "schema": protocol.SPEC_SCHEMA,
        "protocol": protocol.PROTOCOL_VERSION,
        "job_id": job.id,
        "name": job.name,
        "queue_id": job.sweep_id,
        "attempt": attempt.number,
        "task": job.task,
        "epochs": job.epochs,
        "gpus": job.gpus,
        "nodes": job.nodes,
        "seed": job.seed,
        "config": job.config,
        "bundle_sha": attempt.bundle_sha,
        "entry": protocol.TRAIN_ENTRY,
        "launcher": "torchrun",
        "python": "",
        "verify": ["metrics", "best_ckpt"],
        "heartbeat_s": settings.heartbeat_s,
        "ckpt_interval_s": settings.ckpt_interval_s,
        "kill_grace_s": settings.kill_grace_s,
        "min_free_gb": settings.min_free_gb,
        "scratch_gb": 0,
        "durable_dir": "",
        "resume_from": attempt.resume_from,
        "spec_hash": job.spec_hash,
        "env": {},
        "created_at": created_at if created_at is not None else attempt.created_at,
    }


def _serve_args(settings: Settings) -> list[str]:
    return [
        "--idle-exit-s",
        str(settings.agent_idle_exit_s),
        *(["--cpu-slots", str(settings.local_cpu_slots)] if settings.local_cpu_slots else []),
    ]


def ensure_agent(host: Host, bundle_sha: str, settings: Settings) -> str:
    """Start the host's agent unless one runs (the agent's flock makes this safe to repeat)."""
    result = host.run(agent_argv(host, bundle_sha, "serve", "--detach", *_serve_args(settings)), timeout=90)
    if result.exit_code != 0:
        raise AgentError(f"host {host.name}: the agent did not start: {result.stderr.strip()[-300:]}")
    return result.stdout.strip()


def enqueue(host: Host, bundle_sha: str, specs: Sequence[dict[str, Any]], settings: Settings) -> dict[str, str]:
    """Write specs into the host's inbox (idempotent) and make sure its agent runs.

    Returns the agent's verdict per job id ("queued", "exists").
    """
    argv = agent_argv(host, bundle_sha, "enqueue", "--serve", *_serve_args(settings))
    result = host.run(argv, stdin=json.dumps(list(specs)).encode(), timeout=60)
    if result.exit_code != 0:
        raise AgentError(f"host {host.name}: the agent refused the jobs: {result.stderr.strip() or result.stdout}")
    try:
        verdicts = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AgentError(f"host {host.name}: unreadable reply from the agent: {result.stdout[:200]!r}") from exc
    return {str(k): str(v) for k, v in verdicts.items()}


def launch(ledger: Ledger, host: Host, bundle: Bundle, jobs: Sequence[Job], settings: Settings) -> dict[str, str]:
    """Record an attempt for each job, then hand the specs to the host in one round trip."""
    ensure_bundle(host, bundle)
    ledger.update_host(host.name, agent_bundle=bundle.sha256)
    now = time.time()
    specs = []
    for index, job in enumerate(jobs):
        attempt = ledger.start_attempt(job.id, host=host.name, bundle_sha=bundle.sha256)
        # queue order on the host follows the queue file's line order
        specs.append(job_spec(job, attempt, settings, created_at=now + index * 1e-3))
    return enqueue(host, bundle.sha256, specs, settings) if specs else {}
