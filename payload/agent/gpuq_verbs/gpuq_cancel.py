"""``cancel JOB_ID...``: withdraw queued jobs, then kill running ones (identity-checked); then the
forwarded secrets of a sweep with no job left queued or alive go (gpuq_secrets.py).

Killing is always by the recorded process group (the attempt's pgid file), and only after the
group proves it is still that attempt's wrapper: same boot, same start ticks, the job id in the
leader's command line.  TERM first, KILL after the job's kill_grace_s.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base import gpuq_secrets
from gpuq_slurmmode import gpuq_slurm
from gpuq_slurmmode import gpuq_slurm_submit
from gpuq_base.gpuq_files import Layout, mkdirs, read_json, touch
from gpuq_base.gpuq_jobspec import JobSpec, read_spec
from gpuq_base.gpuq_procs import group_alive, proc_cmdline, proc_stat, signal_group


def _withdraw(lay: Layout, job_id: str) -> bool:
    inbox = lay.p(P.INBOX_DIR, job_id + ".json")
    if not os.path.exists(inbox):
        return False
    mkdirs(lay.p(P.WITHDRAWN_DIR))
    try:
        os.rename(inbox, lay.p(P.WITHDRAWN_DIR, job_id + ".json"))
        return True
    except FileNotFoundError:
        return False  # the agent claimed it a moment ago: cancel it where it is now


def recorded_group(lay: Layout, job_id: str,
                   attempt: int | None = None) -> tuple[JobSpec | None, dict[str, Any], str]:
    """(the claimed spec, the attempt's recorded group, "") when that group still lives and passes the
    identity check (same boot and start ticks, the job id in its leader's command line); else
    (None, {}, "not running ..." saying why).  ``attempt``: only that attempt (else the claimed one)."""
    spec = read_spec(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    n = spec.attempt if spec is not None else 1
    if attempt is not None and n != attempt:
        return None, {}, "not running (the claimed attempt is %d, not %d; nothing killed)" % (n, attempt)
    rec = read_json(lay.attempt(job_id, n, P.PGID_FILE))
    if spec is None or not isinstance(rec, dict) or not group_alive(rec):
        return None, {}, "not running"
    pgid = rec["pgid"]
    leader = proc_stat(pgid)
    if leader is not None and leader[0] not in ("Z", "X") and (
            leader[2] != rec.get("start_ticks") or job_id not in proc_cmdline(pgid)):
        return None, {}, "not running (recorded group %d failed the identity check; nothing killed)" % pgid
    return spec, rec, ""


def _kill_claimed(lay: Layout, job_id: str, attempt: int | None = None) -> str:
    spec, rec, why = recorded_group(lay, job_id, attempt)
    if why or spec is None:
        return why
    pgid = rec["pgid"]
    grace = spec.kill_grace_s
    signal_group(pgid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and group_alive(rec):
        time.sleep(0.1)
    if group_alive(rec):
        signal_group(pgid, signal.SIGKILL)
    return "killed"


def drop_secrets(lay: Layout) -> None:
    """Delete the forwarded secrets of every sweep none of whose jobs is queued or lives: a claimed
    job lives until its attempt's exit record, unless it was cancelled (a cancelled job never
    starts again, and its group has been killed by now)."""
    gpuq_secrets.drop_unused(lay, lambda j, s: not os.path.exists(lay.job(j, P.CANCEL_FILE))
                             and not os.path.exists(lay.attempt(j, s.attempt, P.EXIT_FILE)))


def cmd_cancel(lay: Layout, job_ids: list[str]) -> int:
    """Three phases, so cancelling many jobs never lets a freed slot start one of them:
    withdraw every job still in the inbox; mark every claimed one; only then kill."""
    for job_id in job_ids:
        if not job_id or "/" in job_id or job_id.startswith("."):
            print(f"gpuq cancel: bad job id {job_id!r}", file=sys.stderr)
            return 1
    verdicts: dict[str, str] = {}
    for job_id in job_ids:
        if _withdraw(lay, job_id):
            verdicts[job_id] = "withdrawn"
    unknown = []
    for job_id in job_ids:
        if job_id in verdicts:
            continue
        if not os.path.exists(lay.p(P.CLAIMED_DIR, job_id + ".json")):
            unknown.append(job_id)
            continue
        mkdirs(lay.job(job_id))
        touch(lay.job(job_id, P.CANCEL_FILE))
    on_slurm = gpuq_slurm.config(lay) is not None
    for job_id in job_ids:
        if job_id not in verdicts and job_id not in unknown:
            verdicts[job_id] = (gpuq_slurm_submit.cancel(lay, job_id) or "not running") if on_slurm \
                else _kill_claimed(lay, job_id)
    drop_secrets(lay)
    for job_id in unknown:
        print(f"gpuq cancel: unknown job {job_id} (not in inbox/ or claimed/ under {lay.root})",
              file=sys.stderr)
    for job_id in job_ids:
        if job_id in verdicts:
            print(verdicts[job_id] if len(job_ids) == 1 else "%s %s" % (job_id, verdicts[job_id]))
    return 1 if unknown else 0


def cmd_kill(lay: Layout, job_id: str, attempt: int) -> int:
    """Kill one attempt's group (a stalled one) without a cancel file: the job may run again as
    attempt n+1.  The wrapper relays TERM to the trainer and writes exit.json as for any signal.  When
    this host's agent had already decided to retry the attempt itself (a stall it healed: gpuq_stall.py),
    the line starts with KILL_HOST_RETRIED: attempt n+1 is the host's."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        print(f"gpuq kill: bad job id {job_id!r}", file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    if gpuq_slurm.config(lay) is not None:
        spec = read_spec(lay.p(P.CLAIMED_DIR, job_id + ".json"))
        n = spec.attempt if spec is not None else 1
        verdict = gpuq_slurm_submit.cancel(lay, job_id) if n == attempt else ""
        verdict = "killed" if verdict.startswith("cancelled in Slurm") else verdict or "not running"
    else:
        # gpuq's own kill: what follows the attempt is the controller's, never a host retry
        from gpuq_watch import gpuq_retry
        got = gpuq_retry.forgo(lay, job_id, attempt, "gpuq killed attempt %d" % attempt)
        verdict = _kill_claimed(lay, job_id, attempt)
        if got.get("by") == gpuq_retry.BY_HOST:
            # this agent healed the stall first (gpuq_stall.py): attempt n+1 is the host's; the group dies anyway
            print("%s: attempt %s (%s); %s" % (P.KILL_HOST_RETRIED, got.get("attempt"), got.get("class"), verdict))
            return 0
    print(verdict)
    return 0 if verdict == "killed" else 1


def cmd_withdraw(lay: Layout, job_ids: list[str]) -> int:
    """Work stealing: take unstarted jobs back out of the inbox by atomic rename.

    Prints {job_id: "withdrawn" | "claimed" | "unknown"}; only "withdrawn" jobs may be placed
    elsewhere (the agent claims by rename too, so exactly one of the two renames wins).
    """
    import json

    verdicts = {}
    for job_id in job_ids:
        if not job_id or "/" in job_id or job_id.startswith("."):
            print(f"gpuq withdraw: bad job id {job_id!r}", file=sys.stderr)
            return 1
        if _withdraw(lay, job_id):
            verdicts[job_id] = "withdrawn"
        elif os.path.exists(lay.p(P.CLAIMED_DIR, job_id + ".json")):
            verdicts[job_id] = "claimed"
        else:
            verdicts[job_id] = "unknown"
    drop_secrets(lay)
    print(json.dumps(verdicts))
    return 0
