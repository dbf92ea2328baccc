"""Slurm mode, on the login node: hand attempts to ``sbatch`` and take them back with ``scancel``
(gpuq_slurm.py says what Slurm mode is).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
from typing import Any, Mapping

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write, atomic_write_json, exit_record, mkdirs, read_json, utc
from gpuq_base.gpuq_jobspec import JobSpec, attempt_of, read_spec, spec_or_reason
from gpuq_slurmmode.gpuq_slurm import (
    ALIVE,
    JOB_FILE,
    JOB_ID,
    SCRIPT_FILE,
    SUBMIT_TIMEOUT_S,
    attempt_comment,
    config,
    job_name,
    job_nodes,
    slurm_states,
)


# The only variables of the login node's environment a job gets (besides Slurm's own SLURM_*): sbatch's
# default --export=ALL would hand the whole environment to slurmctld, which stores it with the job.  The
# batch script needs PATH (python3, srun); the wrapper builds the trainer's environment from scratch.
EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TMPDIR", "TZ")


def export_option(environ: Mapping[str, str] | None = None) -> str:
    """``--export=`` naming the ``EXPORTED`` (and ``LC_*``) variables that are set (never NONE: that
    makes slurmd run the user's login shell to build an environment)."""
    environ = os.environ if environ is None else environ
    names = [k for k in EXPORTED if k in environ] + sorted(k for k in environ if k.startswith("LC_"))
    return "--export=%s" % ",".join(names or ["PATH"])


def sbatch_argv(lay: Layout, spec: JobSpec, conf: dict[str, Any], dependency: str = "") -> list[str]:
    """The sbatch command line for one attempt (the script path last)."""
    job_id, n = spec.job_id, spec.attempt
    adir = lay.attempt(job_id, n)
    gpus = spec.gpus
    grace = int(conf.get("signal_grace_s") or 0) or max(60, int(spec.kill_grace_s or 30) + 30)
    argv = ["sbatch", "--parsable", "--job-name", job_name(spec), "--comment", attempt_comment(job_id, n),
            "--output", os.path.join(adir, P.JOB_LOG), "--open-mode=append", "--chdir", lay.root, export_option()]
    nodes = job_nodes(spec)
    argv += ["--nodes=%d" % nodes, "--ntasks-per-node=1"] if nodes > 1 else ["--nodes=1", "--ntasks=1"]
    argv += ["--requeue", "--signal=B:USR1@%d" % grace]
    if gpus > 0 and conf.get("gres", True):
        argv.append("--gres=gpu:%d" % gpus)
    for key, flag in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"),
                      ("time_limit", "--time")):
        if conf.get(key):
            argv += [flag, str(conf[key])]
    if dependency:
        argv.append("--dependency=afterany:%s" % dependency)
    argv += [str(a) for a in conf.get("sbatch_args") or []]
    argv.append(os.path.join(adir, SCRIPT_FILE))
    return argv


def batch_script(lay: Layout, spec: JobSpec, conf: dict[str, Any], agent_file: str) -> str:
    job_id, n = spec.job_id, spec.attempt
    python = str(spec.python or conf.get("python") or "python3")
    argv = [python, agent_file, "--root", lay.root, "wrap", job_id, str(n)]
    nodes = job_nodes(spec)
    if nodes > 1:  # one wrapper per node, each starting torchrun for its node rank; one failing ends them all
        gpus = spec.gpus
        step = ["srun", "--nodes=%d" % nodes, "--ntasks=%d" % nodes, "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if gpus > 0 and conf.get("gres", True):
            step.append("--gres=gpu:%d" % gpus)
        argv = step + argv
    return ("#!/bin/sh\n"
            "# gpuq: attempt %d of job %s (%s). Slurm runs this on a compute node, and again after a requeue.\n"
            "exec %s\n" % (n, job_id, spec.name, " ".join(shlex.quote(a) for a in argv)))


def previous_alive(lay: Layout, job_id: str, n: int) -> str:
    """The Slurm id of an earlier attempt of this job that Slurm may still run ("" when none):
    the new attempt waits for it with --dependency=afterany, never two at once."""
    for k in range(n - 1, 0, -1):
        if os.path.exists(lay.attempt(job_id, k, P.EXIT_FILE)):
            continue
        rec = read_json(lay.attempt(job_id, k, JOB_FILE))
        if isinstance(rec, dict) and JOB_ID.match(str(rec.get("job_id", ""))):
            return str(rec["job_id"])
    return ""


def submit(lay: Layout, job_id: str, spec: JobSpec, conf: dict[str, Any], agent_file: str) -> str:
    """Hand one claimed spec to sbatch.  ``launch.json`` is written first: an attempt is launched once
    whatever happens after (a lost sbatch reply leaves an attempt status reports dead, never a second
    job).  Returns a log line."""
    n = spec.attempt
    adir = lay.attempt(job_id, n)
    if os.path.exists(os.path.join(adir, P.LAUNCH_FILE)):
        return "REFUSED %s a%d: attempt already launched once; never run twice" % (job_id, n)
    mkdirs(adir, lay.job(job_id, P.CKPT_DIR), lay.job(job_id, P.RESULT_DIR))
    atomic_write_json(lay.job(job_id, P.SPEC_FILE), spec.document)
    if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
        atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(
            job_id, n, P.EXIT_SIGNAL_BASE + 15, "setup", "cancelled before launch", sig=15))
        return "CANCELLED %s a%d before launch" % (job_id, n)
    gpus = spec.gpus
    device = "cpu" if conf.get("train_device") == "cpu" or gpus == 0 else "cuda"
    atomic_write_json(os.path.join(adir, P.LAUNCH_FILE), {
        "time": utc(), "slots": [], "kind": "slurm", "device": device, "total_slots": max(1, gpus),
        "agent_pid": os.getpid(), "index": "?", "count": "?", "slurm": True})
    atomic_write(os.path.join(adir, SCRIPT_FILE), batch_script(lay, spec, conf, agent_file))
    os.chmod(os.path.join(adir, SCRIPT_FILE), 0o755)
    argv = sbatch_argv(lay, spec, conf, previous_alive(lay, job_id, n))
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=SUBMIT_TIMEOUT_S,
                             cwd=lay.root)
        code, stdout, stderr = out.returncode, out.stdout.decode("utf-8", "replace"), out.stderr.decode(
            "utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as e:
        code, stdout, stderr = -1, "", str(e)
    slurm_id = stdout.strip().split(";")[0]
    if code != 0 or not JOB_ID.match(slurm_id):
        why = (stderr.strip() or stdout.strip() or "exit %d" % code)[-500:]
        atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(
            job_id, n, P.EXIT_SETUP, "setup", "sbatch refused the job: %s" % why))
        return "FAILED %s a%d: sbatch refused the job: %s" % (job_id, n, why)
    atomic_write_json(os.path.join(adir, JOB_FILE), {"job_id": slurm_id, "submitted_at": utc(), "argv": argv})
    return "SUBMITTED %s a%d as Slurm job %s" % (job_id, n, slurm_id)


def claim_and_submit(lay: Layout, conf: dict[str, Any], agent_file: str) -> list[str]:
    """Submit every spec in the inbox, oldest first (one enqueue call at a time: the caller holds
    the root's lock).  Returns log lines."""
    lines = []
    entries = []
    for name in sorted(os.listdir(lay.p(P.INBOX_DIR))):
        if not name.endswith(".json") or name.startswith("."):
            continue
        spec = spec_or_reason(read_json(lay.p(P.INBOX_DIR, name)))  # a str: why the spec is refused
        entries.append((spec.created_at if isinstance(spec, JobSpec) else 0.0, name[:-5], spec))
    entries.sort(key=lambda e: (e[0], e[1]))
    for _created, job_id, spec in entries:
        try:
            os.rename(lay.p(P.INBOX_DIR, job_id + ".json"), lay.p(P.CLAIMED_DIR, job_id + ".json"))
        except FileNotFoundError:
            continue  # withdrawn meanwhile
        if not isinstance(spec, JobSpec):
            n = attempt_of(read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))) or 1
            mkdirs(lay.attempt(job_id, n))
            atomic_write_json(lay.attempt(job_id, n, P.EXIT_FILE),
                              exit_record(job_id, n, P.EXIT_SETUP, "setup", spec))
            continue
        lines.append(submit(lay, job_id, spec, conf, agent_file))
    return lines


def cancel(lay: Layout, job_id: str) -> str:
    """scancel the Slurm job of a claimed attempt; "" when there is none to cancel."""
    spec = read_spec(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    n = spec.attempt if spec is not None else 1
    rec = read_json(lay.attempt(job_id, n, JOB_FILE))
    if not isinstance(rec, dict) or not JOB_ID.match(str(rec.get("job_id", ""))):
        try:  # sbatch's reply was lost: the job is found by its comment
            found = slurm_states(lay, [], [attempt_comment(job_id, n)])
        except OSError:
            found = {}
        if not found:
            return ""
        rec = {"job_id": sorted(found)[0]}
    if os.path.exists(lay.attempt(job_id, n, P.EXIT_FILE)) and slurm_states(lay, [str(rec["job_id"])]).get(
            str(rec["job_id"]), {}).get("state") not in ALIVE:
        return "not running"
    try:
        out = subprocess.run(["scancel", str(rec["job_id"])], stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=SUBMIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        return "scancel failed: %s" % e
    if out.returncode != 0:
        return "scancel %s failed: %s" % (rec["job_id"], out.stderr.decode("utf-8", "replace").strip()[-300:])
    return "cancelled in Slurm (job %s)" % rec["job_id"]


def cmd_submit(lay: Layout, agent_file: str) -> int:
    """``enqueue --serve`` on a Slurm root: submit the inbox under the root's lock (two enqueues at
    once never submit one spec twice: the claim is a rename, and a launched attempt is never
    submitted again)."""
    conf = config(lay) or {}
    mkdirs(lay.p(P.CLAIMED_DIR), lay.p(P.JOBS_DIR))
    fd = os.open(lay.p(P.AGENT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for line in claim_and_submit(lay, conf, agent_file):
            lay.log("[%s] %s" % (utc(), line))
            sys.stderr.write(line + "\n")
    finally:
        os.close(fd)
    return 0
