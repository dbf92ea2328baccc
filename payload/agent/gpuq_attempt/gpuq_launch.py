"""What one attempt runs: its environment, its argv and its run dir (docs/your-project.md).

The run dir ``jobs/<job_id>/run/`` is the trainer's working directory for every job: each top-level
entry of the bundle's workdir (the project) is linked in as a symlink, so relative reads of project
files work as in the project root, while every relative write lands in the job's own directory.
Names that begin an ``outputs`` or ``checkpoint`` glob are never linked (the job gets real dirs).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
from typing import Any

from gpuq_base import gpuq_argv
from gpuq_records import gpuq_own
from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, read_json
from gpuq_base.gpuq_hostfacts import thread_cap
from gpuq_attempt.gpuq_setup import project_root

TORCHRUN_SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_DEFAULT_SHUTDOWN_S = 30


def kill_grace(spec: dict[str, Any]) -> float:
    """Seconds between the SIGTERM the wrapper relays and its SIGKILL of the rest of the group."""
    try:
        return max(0.0, float(spec.get("kill_grace_s", P.DEFAULT_KILL_GRACE_S) or 0))
    except (TypeError, ValueError):
        return float(P.DEFAULT_KILL_GRACE_S)


def sigterm_grace(spec: dict[str, Any]) -> str:
    """GPUQ_SIGTERM_GRACE_S for the trainer: the seconds it can count on between a SIGTERM and the
    SIGKILL after it.  The spec's ``sigterm_grace_s`` (a platform's spot grace, e.g. RunPod's 5 s)
    when given, else ``kill_grace_s``; never more than ``kill_grace_s``, since the wrapper (and a
    cancel) kills the group then.  ``sigterm_grace_s: ""`` passes "" (unknown: the payload saves
    regardless)."""
    kill = kill_grace(spec)
    raw = spec.get("sigterm_grace_s")
    if raw == "":
        return ""
    grace = kill
    if raw is not None:
        with contextlib.suppress(TypeError, ValueError):
            grace = min(kill, max(0.0, float(raw)))
    return "%g" % grace


def run_section(spec: dict[str, Any]) -> dict[str, Any] | None:
    run = spec.get("run")
    return run if isinstance(run, dict) else None


def _globs(run: dict[str, Any] | None, key: str) -> list[str]:
    raw = (run or {}).get(key) or []
    return [raw] if isinstance(raw, str) else [str(g) for g in raw if g]


def newest_checkpoint(run_dir: str, run: dict[str, Any] | None) -> str | None:
    """Absolute path of the job's newest own checkpoint under ``run_dir`` (gpuq_own: a real file, a link
    to one of its own files, or a complete directory; never anything reached through the project)."""
    found = gpuq_own.newest_checkpoint(run_dir, _globs(run, "checkpoint"))
    return os.path.join(run_dir, *found.rel.split("/")) if found is not None else None


FROM_SCRATCH = "gpuq: restarted from scratch: no file matched checkpoint"


def resume_note(run_dir: str, run: dict[str, Any] | None, attempt: int) -> str | None:
    """The log line that says what this attempt starts from (a project's own trainer with ``checkpoint``
    globs): the checkpoint passed as ``{checkpoint}``, or, for a retry, that there was none (the tick's
    scan turns that line into an alert: a resume that did not happen is loud)."""
    globs = _globs(run, "checkpoint")
    if not globs:
        return None
    found = newest_checkpoint(run_dir, run)
    if found is not None:
        return "gpuq: resuming from checkpoint %s" % os.path.relpath(found, run_dir)
    if attempt > 1:
        return "%s %s in the run dir" % (FROM_SCRATCH, json.dumps(globs))
    return None


DATA_TREE_RE = re.compile(r"^[0-9a-f]{64}$")
DATA_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def data_paths(lay: Layout, spec: dict[str, Any]) -> dict[str, str]:
    """{NAME: its path on this host} of the spec's ``run.data`` ([data] in gpuq.toml): the read-only tree
    the controller synced to bundles/.data/trees/<tree>, or the file in it."""
    out: dict[str, str] = {}
    data = (run_section(spec) or {}).get("data")
    for name, ref in (data.items() if isinstance(data, dict) else []):
        if not isinstance(ref, dict) or not DATA_NAME_RE.match(str(name)):
            continue
        tree, file = str(ref.get("tree") or ""), str(ref.get("file") or "")
        if not DATA_TREE_RE.match(tree) or "/" in file or file in (".", ".."):
            continue
        path = lay.p(P.BUNDLES_DIR, ".data", "trees", tree)
        out[str(name)] = os.path.join(path, file) if file else path
    return out


def reserved_names(run: dict[str, Any] | None) -> set[str]:
    """Top-level names never linked: the first path component of each outputs/checkpoint glob and
    of the metrics setting (a trainer's log dir such as lightning_logs/ is the job's own)."""
    out = set()
    metrics = [m for m in _globs(run, "metrics") if m != "log"]
    for pattern in _globs(run, "outputs") + _globs(run, "checkpoint") + metrics:
        path = pattern.replace("\\", "/")
        while path.startswith("./") or path.startswith("/"):  # "./x" and "/x" name x; ".cache" stays .cache
            path = path[2:] if path.startswith("./") else path[1:]
        first = path.split("/", 1)[0]
        if first not in ("", ".", "..") and not any(c in first for c in "*?["):
            out.add(first)
    return out


def link_project(workdir: str, run_dir: str, run: dict[str, Any] | None) -> None:
    """(Re)link the project's top-level entries into the run dir; real files are never touched.
    Safe when several wrappers of one job do it at once (the nodes of a multi-node job share the
    run dir): an entry another one made meanwhile is kept."""
    os.makedirs(run_dir, exist_ok=True)
    skip = reserved_names(run)
    try:
        names = sorted(os.listdir(workdir))
    except OSError:
        names = []
    for name in names:
        if name in skip:
            continue
        target = os.path.join(workdir, name)
        link = os.path.join(run_dir, name)
        if os.path.islink(link):
            if os.readlink(link) == target:
                continue
            os.unlink(link)  # a stale link (another bundle): replace it
        elif os.path.lexists(link):
            continue  # the job's own file or dir
        try:
            os.symlink(target, link)
        except FileExistsError:
            continue  # another wrapper of this job made it a moment ago


def build_env(lay: Layout, job_id: str, attempt: int, spec: dict[str, Any],
              launch: dict[str, Any], adir: str | None = None) -> dict[str, str]:
    """run.env: what the trainer gets on top of PATH/HOME/...; never a secret.  ``adir``: where this
    wrapper keeps its attempt files (a multi-node job's other nodes: attempts/<n>/node-<r>)."""
    sha = str(spec.get("bundle_sha", ""))
    workdir = project_root(lay, spec)  # the bundle's project, as its setup hook left it
    jdir = lay.job(job_id)
    adir = adir or lay.attempt(job_id, attempt)
    kind = launch.get("kind", "cpu")
    slots = launch.get("slots") or []
    resume = spec.get("resume_from")
    if resume is None:
        resume = ""
    elif not isinstance(resume, str):
        resume = json.dumps(resume, sort_keys=True)
    env: dict[str, str] = {}
    for k, v in (spec.get("env") or {}).items():
        env[str(k)] = str(v)
    if "PYTHONPYCACHEPREFIX" not in env:
        # Libraries load the bytecode their installer compiled (torch: ~2.3 s less CPU per process than
        # compiling it again under a cache prefix); the project, read-only, is compiled in memory, and no
        # __pycache__ is ever written into the bundle (bundle_check.py would take it for tampering).
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    threads = str(thread_cap(int(launch.get("total_slots") or len(slots) or 1)))
    pythonpath = workdir + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": pythonpath,
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", threads),
        "MKL_NUM_THREADS": env.get("MKL_NUM_THREADS", threads),
        "HF_HOME": lay.p(P.CACHE_DIR, "huggingface"),
        "PIP_CACHE_DIR": lay.p(P.CACHE_DIR, "pip"),
        P.ENV_JOB_ID: job_id,
        P.ENV_JOB_NAME: str(spec.get("name", "")),
        P.ENV_QUEUE_ID: str(spec.get("queue_id", "")),
        P.ENV_ATTEMPT: str(attempt),
        P.ENV_CONFIG: os.path.join(workdir, str(spec.get("config", ""))),
        P.ENV_TASK: str(spec.get("task", "")),
        P.ENV_EPOCHS: str(spec.get("epochs") or ""),
        P.ENV_CKPT_DIR: os.path.join(jdir, P.CKPT_DIR),
        P.ENV_RESULT_DIR: os.path.join(jdir, P.RESULT_DIR),
        P.ENV_RUN_DIR: os.path.join(jdir, P.RUN_DIR),
        P.ENV_LOG: os.path.join(adir, P.JOB_LOG),
        P.ENV_HEARTBEAT: os.path.join(adir, P.HEARTBEAT_FILE),
        P.ENV_HEARTBEAT_S: str(spec.get("heartbeat_s") or P.DEFAULT_HEARTBEAT_S),
        P.ENV_RESUME_FROM: resume,
        P.ENV_CKPT_INTERVAL_S: str(spec.get("ckpt_interval_s") or P.DEFAULT_CKPT_INTERVAL_S),
        P.ENV_DURABLE_DIR: str(spec.get("durable_dir") or ""),
        P.ENV_SPEC_HASH: str(spec.get("spec_hash", "")),
        P.ENV_BUNDLE_SHA: sha,
        P.ENV_DEVICE: str(launch.get("device") or ("cuda" if kind == "gpu" else "cpu")),
        P.ENV_EXIT_FILE: os.path.join(adir, P.TRAINER_EXIT_FILE),
        P.ENV_SIGTERM_GRACE_S: sigterm_grace(spec),
    })
    if launch.get("master_port"):
        env["MASTER_PORT"] = str(launch["master_port"])
    # Rich (Lightning's default progress bar when rich is installed) draws nothing into a file until
    # the bar ends; TTY_COMPATIBLE=1 makes it redraw into the log as it goes, so the log shows progress
    # and grows while the trainer works (docs/your-project.md).  The project's [run] env may say otherwise.
    env.setdefault("TTY_COMPATIBLE", "1")
    # torchrun SIGKILLs its workers 30 s after relaying a SIGTERM unless told otherwise: never
    # before the wrapper's own kill_grace_s (a torch that ignores this keeps 30 s, and the
    # payload then counts on 30 s at most)
    env.setdefault(TORCHRUN_SHUTDOWN_ENV, str(max(TORCHRUN_DEFAULT_SHUTDOWN_S, math.ceil(kill_grace(spec)))))
    for name, path in data_paths(lay, spec).items():
        env["GPUQ_DATA_" + name.upper()] = path
    env.pop(P.ENV_SEED, None)
    if spec.get("seed") is not None:
        env[P.ENV_SEED] = str(spec["seed"])
    if kind == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop("CUDA_DEVICE_ORDER", None)
    return env


def secrets_for(lay: Layout, spec: dict[str, Any]) -> dict[str, str]:
    """The forwarded values this job's run.forward_env names (from secrets/<queue_id>.json)."""
    names = (run_section(spec) or {}).get("forward_env") or []
    if not names:
        return {}
    qid = str(spec.get("queue_id", ""))
    if not qid or "/" in qid or qid.startswith("."):
        return {}
    stored = read_json(lay.p(P.SECRETS_DIR, qid + ".json"))
    if not isinstance(stored, dict):
        return {}
    return {str(n): str(stored[n]) for n in names if n in stored}


def job_argv(lay: Layout, job_id: str, attempt: int, spec: dict[str, Any], run_env: dict[str, str],
             python: str, nproc: int, rendezvous: list[str] | None = None) -> list[str]:
    """The trainer's argv: the legacy payload command when spec "run" is absent, else the
    project's template rendered by gpuq_argv.  ``rendezvous``: torchrun's multi-node arguments
    (``--nnodes --node-rank --master-addr --master-port``) instead of ``--standalone --nnodes=1``."""
    sha = str(spec.get("bundle_sha", ""))
    entry = lay.p(P.BUNDLES_DIR, sha, str(spec.get("entry") or P.TRAIN_ENTRY))
    run = run_section(spec)
    launcher = str((run or {}).get("launcher") or spec.get("launcher") or "torchrun")
    extra = local_addr_args() if launcher == "torchrun" and rendezvous is None else []
    command = [str(a) for a in ((run or {}).get("command") or [])]
    if not command:
        literal = entry.replace("{", "{{").replace("}", "}}")
        command = [literal, "--config", "{config}", "--task", "{task}", "--epochs", "{epochs}"]
    run_dir = run_env[P.ENV_RUN_DIR]
    values = {
        "config": run_env[P.ENV_CONFIG], "task": run_env[P.ENV_TASK], "epochs": run_env[P.ENV_EPOCHS],
        "name": str(spec.get("name", "")), "seed": "" if spec.get("seed") is None else str(spec["seed"]),
        "job_id": job_id, "attempt": str(attempt), "run_dir": run_dir,
        "ckpt_dir": run_env[P.ENV_CKPT_DIR], "master_port": run_env.get("MASTER_PORT", ""),
    }
    values.update({"data." + name: path for name, path in data_paths(lay, spec).items()})
    args = [str(a) for a in (spec.get("args") or [])]
    ckpt = newest_checkpoint(run_dir, run) if run else None
    resume_args = [str(a) for a in ((run or {}).get("resume_args") or [])]
    return gpuq_argv.job_argv(launcher=launcher, python=python, nproc=nproc, command=command, args=args,
                              resume_args=resume_args, values=values, checkpoint=ckpt,
                              launcher_extra=extra, rendezvous=rendezvous)


def local_addr_args() -> list[str]:
    """``--local-addr=127.0.0.1`` when this host's own name does not resolve.

    torchrun hands its workers the agent's hostname as MASTER_ADDR; on containers without an
    /etc/hosts entry for it the workers retry name resolution forever and the job hangs before
    its first step.  Single-node jobs only talk over loopback, so pin it.  (Only added when
    needed: the flag needs torch >= 2.2.)
    """
    try:
        socket.getaddrinfo(socket.gethostname(), None)
        return []
    except OSError:
        return ["--local-addr=127.0.0.1"]
