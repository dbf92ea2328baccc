"""The result cache: a job's content key, and which jobs of a queue reuse a verified success (docs/queue.md).

A job's key is sha256 over its identity (``spec_hash_for``: config path and bytes, task, epochs, gpus,
nodes, seed, name, arguments), the code it runs (every file of the bundle except the queue file and the
config files its lines name: a cell reads its own config, not its neighbours') and the sweep's
``[run]``/``[data]`` record (command, setup, data versions).  So one changed byte of a config reruns exactly
the cells whose line names it; a changed code file reruns every cell.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec, spec_hash_for
from orchestrator.ledger import Job


def code_hash(digests: Sequence[tuple[str, str]], configs: set[str]) -> str:
    """sha256 over the bundle's (name, sha256) pairs, the queue's config files left out."""
    named = {f"{protocol.BUNDLE_WORKDIR}/{c}" for c in configs if c}
    kept = sorted((name, sha) for name, sha in digests if name not in named)
    return hashlib.sha256(json.dumps(kept, separators=(",", ":")).encode()).hexdigest()


def content_keys(
    specs: Sequence[JobSpec], digests: Sequence[tuple[str, str]], run_json: str, queue: str = ""
) -> dict[str, str]:
    """{job name: its content key}; ``queue``: the queue file's path under the project root ("" = outside)."""
    code = code_hash(digests, {spec.config for spec in specs} | {queue})
    return {spec.name: key_of(spec_hash_for(spec), code, run_json) for spec in specs}


def key_of(spec_hash: str, code: str, run_json: str) -> str:
    """The content key of a job of identity ``spec_hash`` running code ``code`` (``code_hash``) with ``run_json``."""
    doc = json.dumps({"spec": spec_hash, "code": code, "run": run_json}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def reuse_of(
    specs: Sequence[JobSpec], keys: Mapping[str, str], done: Mapping[str, Job], *, rerun: bool
) -> dict[str, Job]:
    """{job name: the SUCCEEDED job (verified pull) it reuses}; none with ``rerun`` or a line's ``rerun=true``."""
    if rerun:
        return {}
    return {spec.name: done[keys[spec.name]] for spec in specs if not spec.rerun and keys.get(spec.name, "") in done}
