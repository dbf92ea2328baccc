"""Moving files between hosts and this machine: ``gpuq pull``, evidence, checkpoints, ``[data]``, transfer progress.

:mod:`~orchestrator.transfer.pull` asks a host for its manifests, :mod:`~orchestrator.transfer.job_copy` fetches
and retries one job's files; :mod:`~orchestrator.transfer.verify`
decides whether a local copy may be called verified.  Imports core, queue, hosts, host_documents and the ledger.

Plain re-exports, imported on first use (PEP 562): ``transfer.progress`` is for ``gpuq status`` too, which
must not load the ledger's ORM through ``transfer.pull``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.core.lazyexports import lazy_exports

if TYPE_CHECKING:
    from orchestrator.transfer.job_copy import (
        ALREADY,
        INCOMPLETE,
        NOT_PULLED,
        QUARANTINED,
        STAGING_SUFFIX,
        VERIFIED,
        PullOutcome,
        backoff_delay,
    )
    from orchestrator.transfer.pull import pull_jobs, request_manifests, still_verified, sweep_lock
    from orchestrator.transfer.verify import PROVENANCE, PULL_VERIFIED, Manifest, Problem, verify_copy

_JOB_COPY = ("ALREADY", "INCOMPLETE", "NOT_PULLED", "QUARANTINED", "STAGING_SUFFIX", "VERIFIED", "PullOutcome",
             "backoff_delay")
_PULL = ("pull_jobs", "request_manifests", "still_verified", "sweep_lock")
_VERIFY = ("PROVENANCE", "PULL_VERIFIED", "Manifest", "Problem", "verify_copy")
_HOME = {**{name: "orchestrator.transfer.job_copy" for name in _JOB_COPY},
         **{name: "orchestrator.transfer.pull" for name in _PULL},
         **{name: "orchestrator.transfer.verify" for name in _VERIFY}}

__all__ = [
    "ALREADY", "INCOMPLETE", "NOT_PULLED", "PROVENANCE", "PULL_VERIFIED", "QUARANTINED", "STAGING_SUFFIX",
    "VERIFIED", "Manifest", "Problem", "PullOutcome", "backoff_delay", "pull_jobs", "request_manifests",
    "still_verified", "sweep_lock", "verify_copy",
]

__getattr__, __dir__ = lazy_exports(__name__, _HOME)
