"""A finished job's own summary on the host: its spec as claimed (or as its job dir keeps it), and for a
project's own trainer (spec ``run.metrics``) its metrics summarized like the payload's summary.json
(gpuq_runmetrics.py).  Read by collect (gpuq_inbox.py), the end record (gpuq_outputs.py) and the manifest."""

from __future__ import annotations

import os
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import atomic_write_json
from gpuq_base.gpuq_jobspec import JobSpec, read_spec
from gpuq_records.gpuq_runmetrics import run_summary


def job_spec(root: str, job_id: str) -> JobSpec | None:
    """The job's claimed spec, else its job dir's spec.json (None: neither reads as a sound spec)."""
    spec = read_spec(os.path.join(root, P.CLAIMED_DIR, job_id + ".json"))
    return spec if spec is not None else read_spec(os.path.join(root, P.JOBS_DIR, job_id, P.SPEC_FILE))


def project_summary(root: str, job_id: str, spec: JobSpec | None, write: bool) -> Any:
    """For a job whose spec has ``run.metrics``: its metrics summarized like the payload's
    summary.json (gpuq_runmetrics.py), written to result/summary.json when ``write`` and it has a
    value (a summary that found nothing still travels, for the controller's warning); else None."""
    if spec is None or spec.run is None or not spec.run.metrics:
        return None
    job_dir = os.path.join(root, P.JOBS_DIR, job_id)
    summary = run_summary(job_dir, spec.run, spec.attempt)
    if summary is not None and summary.get("final") is not None and write:
        try:
            os.makedirs(os.path.join(job_dir, P.RESULT_DIR), exist_ok=True)
            atomic_write_json(os.path.join(job_dir, P.RESULT_DIR, P.SUMMARY_FILE), summary)
        except OSError:
            pass  # the summary still travels in the answer
    return summary
