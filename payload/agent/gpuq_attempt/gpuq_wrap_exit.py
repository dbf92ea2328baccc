"""The attempt's exit record, ``exit.json`` (docs/host-protocol.md), which the wrapper (gpuq_wrap.py)
writes last: how the attempt ended, the stop the wrapper got from outside whatever the trainer's code,
Slurm's job, restart and time limit, and the forwarded secret values redacted (gpuq_secrets.py) from
every host text in it (the setup tail, the trainer's word).

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base import gpuq_secrets
from gpuq_base.gpuq_files import Layout, atomic_write_json, exit_record, read_json, sha256_file


def hidden_values(lay: Layout, held: list[str], more: dict[str, str] | None = None) -> list[str]:
    """The secret values to redact: ``held`` (those held when the wrapper started), those held now and
    ``more``, longest first."""
    now = gpuq_secrets.held_values(lay)
    extra = [v for v in (more or {}).values() if len(v) >= gpuq_secrets.MIN_REDACT_CHARS]
    return sorted(set(held) | set(now) | set(extra), key=lambda v: (-len(v), v))


def write_exit(lay: Layout, adir: str, jdir: str, job_id: str, attempt: int, code: int, message: str, *,
               phase: str, started: float, trainer_code: int | None, sig: int | None,
               extra: dict[str, Any] | None, wrapper_signal: int | None, slurm_restart: int,
               time_limit_near: bool, held: list[str]) -> None:
    """``exit.json`` of attempt ``attempt`` in ``adir``: the record, ``extra`` on top (its ``best_sha256``
    instead of the best checkpoint's hash), the secret values redacted (``hidden_values``)."""
    hb = read_json(os.path.join(adir, P.HEARTBEAT_FILE))
    extra = dict(extra or {})
    best = extra.pop("best_sha256", None) or sha256_file(os.path.join(jdir, P.CKPT_DIR, P.BEST_CKPT))
    rec = exit_record(job_id, attempt, code, phase, message, started_at=started,
                      trainer_code=trainer_code, sig=sig, heartbeat=hb, best_sha256=best)
    rec["wrapper_signal"] = wrapper_signal  # a stop from outside, whatever the trainer's code
    if os.environ.get("SLURM_JOB_ID"):
        rec["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
        rec["slurm_restart"] = slurm_restart
        if time_limit_near:
            rec["slurm_time_limit"] = True
            rec["message"] = "Slurm time limit near (SIGUSR1): checkpointed and stopped; " + rec["message"]
    rec.update(extra)
    rec = gpuq_secrets.redact_doc(rec, hidden_values(lay, held))  # host text: the setup tail, the trainer's word
    atomic_write_json(os.path.join(adir, P.EXIT_FILE), rec)
