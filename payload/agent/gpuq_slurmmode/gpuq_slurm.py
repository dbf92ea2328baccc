"""Slurm mode: on a Slurm login node the agent hands every attempt to ``sbatch`` instead of
starting it itself, and reads Slurm's view of its jobs inside the same ``status`` call.

A root is in Slurm mode when ``ROOT/slurm.json`` exists (written by ``gpuq hosts add --slurm``):
``{"partition", "account", "qos", "time_limit", "sbatch_args", "max_jobs", "gres", "signal_grace_s",
"train_device", "python"}``.  There is no long-lived agent on a login node (sites police those):
``enqueue`` claims each spec at once and submits it; Slurm is the queue.

One attempt is one Slurm job running ``gpuq_agent.py wrap JOB N`` from the job's bundle on the
shared root, so exit records, heartbeats, checkpoints and logs are the ones every host writes.
``--requeue``: when Slurm requeues the job (preemption, node failure, ``scontrol requeue``) it runs
the same attempt again; the wrapper sets the stale exit record aside and the trainer resumes from
the job's newest checkpoint.  ``status`` keeps such an attempt alive while Slurm does, so gpuq
never starts a second copy.

This module holds what the three sides share (the settings, the files, Slurm's states, the one
squeue query); gpuq_slurm_submit.py submits and cancels on the login node, gpuq_slurm_view.py
corrects ``status``, gpuq_slurm_node.py is the wrapper's side on a compute node.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import getpass
import os
import subprocess
from typing import Any, Iterable

from gpuq_base.gpuq_lazyre import lazy
from gpuq_base.gpuq_files import Layout, read_json
from gpuq_base.gpuq_jobspec import JobSpec

CONFIG_FILE = "slurm.json"  # under the root: its presence puts the root in Slurm mode
JOB_FILE = "slurm.json"  # under attempts/<n>/: {"job_id", "submitted_at", "argv"}
NODE_FILE = "node.json"  # under attempts/<n>/ (rank 0) and attempts/<n>/node-<r>/: {"rank", "host", ...}
SCRIPT_FILE = "sbatch.sh"  # under attempts/<n>/: the batch script Slurm runs (and re-runs on requeue)
ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                   "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
SUBMIT_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 60.0
MAX_QUERY_BYTES = 32 << 20
JOB_ID = lazy(r"^[0-9]{1,12}$")
NAME_CHARS = lazy(r"[^A-Za-z0-9_.-]")
UNSUBMITTED_GRACE_S = 120.0  # launched, no Slurm id recorded: sbatch is still running this long


def config(lay: Layout) -> dict[str, Any] | None:
    """The root's Slurm settings, or None when the root is not in Slurm mode."""
    doc = read_json(lay.p(CONFIG_FILE))
    return doc if isinstance(doc, dict) else None


def job_name(spec: JobSpec) -> str:
    name = "gpuq-%s-%s" % (spec.queue_id, spec.name or spec.job_id)
    return NAME_CHARS.sub("_", name)[:120]


def job_nodes(spec: JobSpec) -> int:
    return spec.nodes


def attempt_comment(job_id: str, attempt: int) -> str:
    """The ``--comment`` an attempt's Slurm job carries: how an orphan (sbatch submitted it, but its
    reply with the job id was lost) is found again."""
    return "gpuq %s a%d" % (job_id, attempt)


def slurm_states(lay: Layout, ids: list[str], comments: Iterable[str] = ()) -> dict[str, dict[str, str]]:
    """One squeue call: {slurm id: {"state", "reason", "nodes", "comment"}} for the ids Slurm still knows,
    and for the jobs whose comment is one of ``comments``.
    Raises OSError when squeue cannot answer (then nothing may be concluded about any job)."""
    if not ids and not comments:
        return {}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    argv = ["squeue", "--noheader", "--states=all", "--user", user, "--format=%i|%T|%r|%N|%k"]
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise OSError("squeue did not answer: %s" % e) from None
    if out.returncode != 0:
        raise OSError("squeue exited %d: %s" % (out.returncode, out.stderr.decode("utf-8", "replace").strip()[-300:]))
    wanted, notes = set(ids), set(comments)
    seen: dict[str, dict[str, str]] = {}
    for line in out.stdout[:MAX_QUERY_BYTES].decode("utf-8", "replace").splitlines():
        parts = line.strip().split("|", 4)  # the comment last: it may hold "|"
        if len(parts) < 4 or not JOB_ID.match(parts[0]):
            continue
        comment = parts[4].strip() if len(parts) > 4 else ""
        if parts[0] not in wanted and comment not in notes:
            continue
        seen[parts[0]] = {"state": parts[1].split()[0] if parts[1] else "", "reason": parts[2][:200],
                          "nodes": parts[3][:200], "comment": comment[:200]}
    return seen


def restart_count() -> int:
    """SLURM_RESTART_COUNT of this batch run (0 on the first run, n after n requeues)."""
    try:
        return max(0, int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    except ValueError:
        return 0
