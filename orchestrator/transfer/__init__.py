"""Moving results between hosts and this machine: ``gpuq pull`` (docs/results.md).

:mod:`~orchestrator.transfer.pull` fetches and retries; :mod:`~orchestrator.transfer.verify`
decides whether a local copy may be called verified.
"""

from orchestrator.transfer.pull import (
    ALREADY,
    INCOMPLETE,
    NOT_PULLED,
    QUARANTINED,
    STAGING_SUFFIX,
    VERIFIED,
    PullOutcome,
    backoff_delay,
    pull_jobs,
    request_manifests,
    sweep_lock,
)
from orchestrator.transfer.verify import PROVENANCE, PULL_VERIFIED, Manifest, Problem, verify_copy

__all__ = [
    "ALREADY", "INCOMPLETE", "NOT_PULLED", "PROVENANCE", "PULL_VERIFIED", "QUARANTINED", "STAGING_SUFFIX",
    "VERIFIED", "Manifest", "Problem", "PullOutcome", "backoff_delay", "pull_jobs", "request_manifests", "sweep_lock",
    "verify_copy",
]
