"""What one attempt runs: its environment, its argv and its run dir (docs/your-project.md).

The run dir ``jobs/<job_id>/run/`` is the trainer's working directory for every job: each top-level
entry of the bundle's workdir (the project) is linked in as a symlink, so relative reads of project
files work as in the project root, while every relative write lands in the job's own directory.
Names that begin an ``outputs`` or ``checkpoint`` glob are never linked (the job gets real dirs).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

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
from gpuq_base.gpuq_jobspec import JobSpec, RunSection
from gpuq_attempt.gpuq_setup import project_root

TORCHRUN_SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_DEFAULT_SHUTDOWN_S = 30


def _number(value: float) -> str:
    """A spec's number as the environment has always carried it: 10, not 10.0."""
    return str(int(value)) if value == int(value) else str(value)


def kill_grace(spec: JobSpec) -> float:
    """Seconds between the SIGTERM the wrapper relays and its SIGKILL of the rest of the group."""
    return spec.kill_grace_s


def sigterm_grace(spec: JobSpec) -> str:
    """GPUQ_SIGTERM_GRACE_S for the trainer: the seconds it can count on between a SIGTERM and the
    SIGKILL after it.  The spec's ``sigterm_grace_s`` (a platform's spot grace, e.g. RunPod's 5 s)
    when given, else ``kill_grace_s``; never more than ``kill_grace_s``, since the wrapper (and a
    cancel) kills the group then."""
    kill = kill_grace(spec)
    grace = kill if spec.sigterm_grace_s is None else min(kill, spec.sigterm_grace_s)
    return "%g" % grace


def _globs(run: RunSection | None, key: str) -> list[str]:
    if run is None:
        return []
    raw = run.metrics if key == "metrics" else getattr(run, key)
    return [raw] if isinstance(raw, str) else [g for g in raw if g]


def newest_checkpoint(run_dir: str, run: RunSection | None) -> str | None:
    """Absolute path of the job's newest own checkpoint under ``run_dir`` (gpuq_own: a real file, a link
    to one of its own files, or a complete directory; never anything reached through the project)."""
    found = gpuq_own.newest_checkpoint(run_dir, _globs(run, "checkpoint"))
    return os.path.join(run_dir, *found.rel.split("/")) if found is not None else None


FROM_SCRATCH = "gpuq: restarted from scratch: no file matched checkpoint"


def resume_note(run_dir: str, run: RunSection | None, attempt: int) -> str | None:
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


def data_paths(lay: Layout, spec: JobSpec) -> dict[str, str]:
    """{NAME: its path on this host} of the spec's ``run.data`` ([data] in gpuq.toml): the read-only tree
    the controller synced to bundles/.data/trees/<tree>, or the file in it."""
    out: dict[str, str] = {}
    for name, ref in (spec.run.data.items() if spec.run is not None else []):
        if not DATA_NAME_RE.match(name):
            continue
        tree, file = ref.tree, ref.file
        if not DATA_TREE_RE.match(tree) or "/" in file or file in (".", ".."):
            continue
        path = lay.p(P.BUNDLES_DIR, ".data", "trees", tree)
        out[str(name)] = os.path.join(path, file) if file else path
    return out


def reserved_names(run: RunSection | None) -> set[str]:
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


def link_project(workdir: str, run_dir: str, run: RunSection | None) -> None:
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


def build_env(lay: Layout, job_id: str, attempt: int, spec: JobSpec,
              launch: dict[str, Any], adir: str | None = None) -> dict[str, str]:
    """run.env: what the trainer gets on top of PATH/HOME/...; never a secret.  ``adir``: where this
    wrapper keeps its attempt files (a multi-node job's other nodes: attempts/<n>/node-<r>)."""
    workdir = project_root(lay, spec)  # the bundle's project, as its setup hook left it
    adir = adir or lay.attempt(job_id, attempt)
    env: dict[str, str] = dict(spec.env)
    if "PYTHONPYCACHEPREFIX" not in env:
        # Libraries load the bytecode their installer compiled (torch: ~2.3 s less CPU per process than
        # compiling it again under a cache prefix); the project, read-only, is compiled in memory, and no
        # __pycache__ is ever written into the bundle (bundle_check.py would take it for tampering).
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.update(python_env(lay, env, workdir, launch))
    env.update(gpuq_env(lay, job_id, attempt, spec, launch, workdir, adir))
    trainer_defaults(env, spec, launch)
    for name, path in data_paths(lay, spec).items():
        env["GPUQ_DATA_" + name.upper()] = path
    env.pop(P.ENV_SEED, None)
    if spec.seed is not None:
        env[P.ENV_SEED] = str(spec.seed)
    visible_devices(env, launch)
    return env


def python_env(lay: Layout, env: dict[str, str], workdir: str, launch: dict[str, Any]) -> dict[str, str]:
    """Python's and its libraries' settings: unbuffered output, the project's directory first on PYTHONPATH
    (then the [run] env's), thread caps by slot share unless the project set them, the host's caches."""
    threads = str(thread_cap(int(launch.get("total_slots") or len(launch.get("slots") or []) or 1)))
    pythonpath = workdir + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return {
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": pythonpath,
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", threads),
        "MKL_NUM_THREADS": env.get("MKL_NUM_THREADS", threads),
        "HF_HOME": lay.p(P.CACHE_DIR, "huggingface"),
        "PIP_CACHE_DIR": lay.p(P.CACHE_DIR, "pip"),
    }


def gpuq_env(lay: Layout, job_id: str, attempt: int, spec: JobSpec, launch: dict[str, Any],
             workdir: str, adir: str) -> dict[str, str]:
    """The contract's GPUQ_* variables (gpuq_protocol.py): who the attempt is, where its files go, its
    heartbeat and checkpoint cadence, what it resumes from, its device and its SIGTERM grace."""
    jdir = lay.job(job_id)
    kind = launch.get("kind", "cpu")
    return {
        P.ENV_JOB_ID: job_id,
        P.ENV_JOB_NAME: spec.name,
        P.ENV_QUEUE_ID: spec.queue_id,
        P.ENV_ATTEMPT: str(attempt),
        P.ENV_CONFIG: os.path.join(workdir, spec.config),
        P.ENV_TASK: spec.task,
        P.ENV_EPOCHS: str(spec.epochs or ""),
        P.ENV_CKPT_DIR: os.path.join(jdir, P.CKPT_DIR),
        P.ENV_RESULT_DIR: os.path.join(jdir, P.RESULT_DIR),
        P.ENV_RUN_DIR: os.path.join(jdir, P.RUN_DIR),
        P.ENV_LOG: os.path.join(adir, P.JOB_LOG),
        P.ENV_HEARTBEAT: os.path.join(adir, P.HEARTBEAT_FILE),
        P.ENV_HEARTBEAT_S: _number(spec.heartbeat_s),
        P.ENV_RESUME_FROM: spec.resume_from or "",
        P.ENV_CKPT_INTERVAL_S: _number(spec.ckpt_interval_s),
        P.ENV_DURABLE_DIR: spec.durable_dir,
        P.ENV_SPEC_HASH: spec.spec_hash,
        P.ENV_BUNDLE_SHA: spec.bundle_sha,
        P.ENV_DEVICE: str(launch.get("device") or ("cuda" if kind == "gpu" else "cpu")),
        P.ENV_EXIT_FILE: os.path.join(adir, P.TRAINER_EXIT_FILE),
        P.ENV_SIGTERM_GRACE_S: sigterm_grace(spec),
    }


def trainer_defaults(env: dict[str, str], spec: JobSpec, launch: dict[str, Any]) -> None:
    """What the trainer's tools need under gpuq, unless the project's [run] env says otherwise: the
    attempt's MASTER_PORT, a Rich progress bar that draws into the log, torchrun's shutdown grace."""
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


def visible_devices(env: dict[str, str], launch: dict[str, Any]) -> None:
    """The GPUs the attempt sees: its slots on a GPU host (in PCI bus order, as nvidia-smi numbers
    them), none on a CPU one."""
    if launch.get("kind", "cpu") == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in launch.get("slots") or [])
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop("CUDA_DEVICE_ORDER", None)


def secrets_for(lay: Layout, spec: JobSpec) -> dict[str, str]:
    """The forwarded values this job's run.forward_env names (from secrets/<queue_id>.json)."""
    names = spec.run.forward_env if spec.run is not None else ()
    if not names:
        return {}
    qid = spec.queue_id
    if not qid or "/" in qid or qid.startswith("."):
        return {}
    stored = read_json(lay.p(P.SECRETS_DIR, qid + ".json"))
    if not isinstance(stored, dict):
        return {}
    return {str(n): str(stored[n]) for n in names if n in stored}


def job_argv(lay: Layout, job_id: str, attempt: int, spec: JobSpec, run_env: dict[str, str],
             python: str, nproc: int, rendezvous: list[str] | None = None) -> list[str]:
    """The trainer's argv: the legacy payload command when spec "run" is absent, else the
    project's template rendered by gpuq_argv.  ``rendezvous``: torchrun's multi-node arguments
    (``--nnodes --node-rank --master-addr --master-port``) instead of ``--standalone --nnodes=1``."""
    entry = lay.p(P.BUNDLES_DIR, spec.bundle_sha, spec.entry or P.TRAIN_ENTRY)
    run = spec.run
    launcher = (run.launcher if run is not None else "") or spec.launcher or "torchrun"
    extra = local_addr_args() if launcher == "torchrun" and rendezvous is None else []
    command = list(run.command) if run is not None else []
    if not command:
        literal = entry.replace("{", "{{").replace("}", "}}")
        command = [literal, "--config", "{config}", "--task", "{task}", "--epochs", "{epochs}"]
    run_dir = run_env[P.ENV_RUN_DIR]
    values = {
        "config": run_env[P.ENV_CONFIG], "task": run_env[P.ENV_TASK], "epochs": run_env[P.ENV_EPOCHS],
        "name": spec.name, "seed": "" if spec.seed is None else str(spec.seed),
        "job_id": job_id, "attempt": str(attempt), "run_dir": run_dir,
        "ckpt_dir": run_env[P.ENV_CKPT_DIR], "master_port": run_env.get("MASTER_PORT", ""),
    }
    values.update({"data." + name: path for name, path in data_paths(lay, spec).items()})
    args = list(spec.args)
    ckpt = newest_checkpoint(run_dir, run) if run else None
    resume_args = list(run.resume_args) if run is not None else []
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
