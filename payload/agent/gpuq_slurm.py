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

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import fcntl
import getpass
import os
import re
import shlex
import socket
import subprocess
import sys
from typing import Any

import gpuq_protocol as P
from gpuq_files import (
    Layout,
    atomic_write,
    atomic_write_json,
    exit_record,
    mkdirs,
    mtime,
    read_json,
    spec_attempt,
    utc,
)

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
JOB_ID = re.compile(r"^[0-9]{1,12}$")
NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
UNSUBMITTED_GRACE_S = 120.0  # launched, no Slurm id recorded: sbatch is still running this long


def config(lay: Layout) -> dict[str, Any] | None:
    """The root's Slurm settings, or None when the root is not in Slurm mode."""
    doc = read_json(lay.p(CONFIG_FILE))
    return doc if isinstance(doc, dict) else None


def job_name(spec: dict[str, Any]) -> str:
    name = "gpuq-%s-%s" % (spec.get("queue_id") or "", spec.get("name") or spec.get("job_id"))
    return NAME_CHARS.sub("_", name)[:120]


def sbatch_argv(lay: Layout, spec: dict[str, Any], conf: dict[str, Any], dependency: str = "") -> list[str]:
    """The sbatch command line for one attempt (the script path last)."""
    job_id, n = str(spec["job_id"]), spec_attempt(spec)
    adir = lay.attempt(job_id, n)
    gpus = int(spec.get("gpus") or 0)
    grace = int(conf.get("signal_grace_s") or 0) or max(60, int(float(spec.get("kill_grace_s") or 30)) + 30)
    argv = ["sbatch", "--parsable", "--job-name", job_name(spec), "--comment", "gpuq %s a%d" % (job_id, n),
            "--output", os.path.join(adir, P.JOB_LOG), "--open-mode=append", "--chdir", lay.root]
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


def batch_script(lay: Layout, spec: dict[str, Any], conf: dict[str, Any], agent_file: str) -> str:
    job_id, n = str(spec["job_id"]), spec_attempt(spec)
    python = str(spec.get("python") or conf.get("python") or "python3")
    argv = [python, agent_file, "--root", lay.root, "wrap", job_id, str(n)]
    nodes = job_nodes(spec)
    if nodes > 1:  # one wrapper per node, each starting torchrun for its node rank; one failing ends them all
        gpus = int(spec.get("gpus") or 0)
        step = ["srun", "--nodes=%d" % nodes, "--ntasks=%d" % nodes, "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if gpus > 0 and conf.get("gres", True):
            step.append("--gres=gpu:%d" % gpus)
        argv = step + argv
    return ("#!/bin/sh\n"
            "# gpuq: attempt %d of job %s (%s). Slurm runs this on a compute node, and again after a requeue.\n"
            "exec %s\n" % (n, job_id, spec.get("name", ""), " ".join(shlex.quote(a) for a in argv)))


def job_nodes(spec: dict[str, Any]) -> int:
    try:
        return max(1, int(spec.get("nodes") or 1))
    except (TypeError, ValueError):
        return 1


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


def submit(lay: Layout, job_id: str, spec: dict[str, Any], conf: dict[str, Any], agent_file: str) -> str:
    """Hand one claimed spec to sbatch.  ``launch.json`` is written first: an attempt is launched once
    whatever happens after (a lost sbatch reply leaves an attempt status reports dead, never a second
    job).  Returns a log line."""
    n = spec_attempt(spec)
    adir = lay.attempt(job_id, n)
    if os.path.exists(os.path.join(adir, P.LAUNCH_FILE)):
        return "REFUSED %s a%d: attempt already launched once; never run twice" % (job_id, n)
    mkdirs(adir, lay.job(job_id, P.CKPT_DIR), lay.job(job_id, P.RESULT_DIR))
    atomic_write_json(lay.job(job_id, P.SPEC_FILE), spec)
    if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
        atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(
            job_id, n, P.EXIT_SIGNAL_BASE + 15, "setup", "cancelled before launch", sig=15))
        return "CANCELLED %s a%d before launch" % (job_id, n)
    gpus = int(spec.get("gpus") or 0)
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
        spec = read_json(lay.p(P.INBOX_DIR, name))
        created = spec.get("created_at", 0) if isinstance(spec, dict) else 0
        entries.append((float(created) if isinstance(created, (int, float)) else 0.0, name[:-5], spec))
    entries.sort(key=lambda e: (e[0], e[1]))
    for _created, job_id, spec in entries:
        try:
            os.rename(lay.p(P.INBOX_DIR, job_id + ".json"), lay.p(P.CLAIMED_DIR, job_id + ".json"))
        except FileNotFoundError:
            continue  # withdrawn meanwhile
        if not isinstance(spec, dict):
            n = 1
            mkdirs(lay.attempt(job_id, n))
            atomic_write_json(lay.attempt(job_id, n, P.EXIT_FILE),
                              exit_record(job_id, n, P.EXIT_SETUP, "setup", "job spec is not a JSON object"))
            continue
        lines.append(submit(lay, job_id, spec, conf, agent_file))
    return lines


def cancel(lay: Layout, job_id: str) -> str:
    """scancel the Slurm job of a claimed attempt; "" when there is none to cancel."""
    spec = read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    n = spec_attempt(spec if isinstance(spec, dict) else {})
    rec = read_json(lay.attempt(job_id, n, JOB_FILE))
    if not isinstance(rec, dict) or not JOB_ID.match(str(rec.get("job_id", ""))):
        return ""
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


def slurm_states(lay: Layout, ids: list[str]) -> dict[str, dict[str, str]]:
    """One squeue call: {slurm id: {"state", "reason", "nodes"}} for the ids Slurm still knows.
    Raises OSError when squeue cannot answer (then nothing may be concluded about any job)."""
    if not ids:
        return {}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    argv = ["squeue", "--noheader", "--states=all", "--user", user, "--format=%i|%T|%r|%N"]
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise OSError("squeue did not answer: %s" % e) from None
    if out.returncode != 0:
        raise OSError("squeue exited %d: %s" % (out.returncode, out.stderr.decode("utf-8", "replace").strip()[-300:]))
    wanted = set(ids)
    seen: dict[str, dict[str, str]] = {}
    for line in out.stdout[:MAX_QUERY_BYTES].decode("utf-8", "replace").splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or parts[0] not in wanted:
            continue
        seen[parts[0]] = {"state": parts[1].split()[0] if parts[1] else "", "reason": parts[2][:200],
                          "nodes": parts[3][:200]}
    return seen


def apply_view(lay: Layout, jobs: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Correct the status entries of Slurm attempts with Slurm's view (one squeue call).

    - no exit record: alive in Slurm -> "running" (RUNNING) or "claimed" (pending); ended in Slurm
      or forgotten by it -> "exited" with a record written here (not on disk: status writes nothing)
      naming Slurm's state, marked ``vanished``;
    - an exit record left by a run that Slurm then requeued (the wrapper stopped on a signal, and
      Slurm still runs or queues the job): the attempt goes on, so it is not reported as exited.

    Returns the document's "slurm" section: {"jobs": alive count, "error": ""}."""
    mine = []
    for e in jobs:
        if e["state"] in ("queued", "withdrawn"):
            continue
        rec = read_json(lay.attempt(e["job_id"], e["attempt"], JOB_FILE))
        launch = read_json(lay.attempt(e["job_id"], e["attempt"], P.LAUNCH_FILE))
        if isinstance(rec, dict) and JOB_ID.match(str(rec.get("job_id", ""))):
            mine.append((e, str(rec["job_id"])))
        elif isinstance(launch, dict) and launch.get("slurm") and e.get("exit") is None:
            e["slurm"] = {"id": "", "state": "SUBMITTING", "reason": "", "nodes": ""}
            launched = mtime(lay.attempt(e["job_id"], e["attempt"], P.LAUNCH_FILE)) or 0.0
            e["state"] = "claimed" if now - launched < UNSUBMITTED_GRACE_S else "dead"
            e["group_alive"] = None
    try:
        view = slurm_states(lay, [sid for _e, sid in mine])
        error = ""
    except OSError as exc:
        view, error = None, str(exc)
    alive = 0
    for e, sid in mine:
        e["group_alive"] = None
        nodes = node_ranks(lay.attempt(e["job_id"], e["attempt"]))
        if nodes:
            e["nodes"] = nodes
        seen = (view or {}).get(sid)
        state = seen["state"] if seen else ""
        e["slurm"] = {"id": sid, "state": state or ("UNKNOWN" if view is None else "GONE"),
                      "reason": seen["reason"] if seen else "", "nodes": seen["nodes"] if seen else ""}
        if view is None:  # Slurm did not answer: say nothing new about the attempt
            if e["state"] == "dead":
                e["state"] = "running" if e.get("heartbeat") else "claimed"
            alive += e["state"] != "exited"
            continue
        ex = e.get("exit")
        if state in ALIVE or (state == "" and ex is None and e.get("heartbeat_age_s") is not None
                              and float(e["heartbeat_age_s"]) < 120):
            alive += 1
            if ex is not None and (ex.get("wrapper_code") == P.EXIT_OK or ex.get("wrapper_signal") is None):
                continue  # a verdict of its own: the run ended, whatever Slurm still tidies up
            e["exit"] = None
            e["state"] = "running" if state in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT") else "claimed"
            continue
        if ex is not None:
            e["state"] = "exited"
            continue
        what = state or "no longer listed by squeue"
        code = P.EXIT_SIGNAL_BASE + 9
        msg = "Slurm job %s ended %s%s before the wrapper wrote exit.json" % (
            sid, what, " (%s)" % seen["reason"] if seen and seen["reason"] not in ("", "None") else "")
        rec = exit_record(e["job_id"], e["attempt"], code, "train", msg, heartbeat=e.get("heartbeat"))
        rec["vanished"] = True
        rec["slurm_state"] = state or "GONE"
        e["exit"] = rec
        e["state"] = "exited"
    return {"jobs": alive, "error": error}


def restart_count() -> int:
    """SLURM_RESTART_COUNT of this batch run (0 on the first run, n after n requeues)."""
    try:
        return max(0, int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    except ValueError:
        return 0


def set_aside_stale_exit(adir: str) -> str:
    """A Slurm requeue re-runs the attempt: the exit record of the run it stopped goes to
    ``exit.slurm-<k>.json`` (k = the restart that stopped it), so this run's record is the one read."""
    path = os.path.join(adir, P.EXIT_FILE)
    if not os.path.exists(path):
        return ""
    k = restart_count()
    target = os.path.join(adir, "exit.slurm-%d.json" % max(0, k - 1))
    os.replace(path, target)
    return target


def launch_on_node(launch: dict[str, Any]) -> dict[str, Any]:
    """The wrapper's view of a Slurm attempt's launch record on the compute node: the GPUs are the
    ones Slurm gave the job (its CUDA_VISIBLE_DEVICES, kept as is), the port a free one here."""
    out = dict(launch)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    ids = [int(v) for v in visible if v.isdigit()]
    if ids:
        out["kind"], out["slots"] = "gpu", ids
    else:
        out["kind"], out["slots"], out["device"] = "cpu", [], "cpu"
    try:
        cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or 0)
    except ValueError:
        cpus = 0
    out["total_slots"] = len(ids) or cpus or int(launch.get("total_slots") or 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        out["master_port"] = int(s.getsockname()[1])
    return out


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


def node_rank() -> int:
    """This node's rank within a multi-node job (SLURM_NODEID; 0 outside one)."""
    try:
        return max(0, int(os.environ.get("SLURM_NODEID") or 0))
    except ValueError:
        return 0


def rendezvous(nodes: int) -> tuple[list[str], dict[str, str]]:
    """torchrun's static rendezvous for this node of a multi-node Slurm job, and the environment every
    node gets alike: node 0 (the one running the batch script) is the master; the port comes from the
    Slurm job id and restart, so every node computes the same one without talking; the socket
    interface is the one that reaches the master (never lo, which the other nodes cannot reach)."""
    master = os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or ""
    try:
        job = int(os.environ.get("SLURM_JOB_ID") or 0)
    except ValueError:
        job = 0
    port = 20000 + (job * 7 + restart_count()) % 30000
    args = ["--nnodes=%d" % nodes, "--node-rank=%d" % node_rank(), "--master-addr=%s" % master,
            "--master-port=%d" % port]
    env = {"MASTER_PORT": str(port), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    iface = interface_to(master)
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
        env["NCCL_SOCKET_IFNAME"] = iface
    return args, env


def interface_to(address: str) -> str:
    """The network interface this node uses to reach ``address`` ("" when unknown): the one holding the
    address when it is this node's own, else the route's device."""
    if not address:
        return ""
    for argv in (["ip", "-o", "-4", "addr", "show", "to", address + "/32"], ["ip", "-o", "route", "get", address]):
        try:
            out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        words = out.stdout.decode("utf-8", "replace").split()
        if argv[3] == "addr" and len(words) > 1:
            return words[1].rstrip(":").split("@")[0]
        if "dev" in words and words.index("dev") + 1 < len(words):
            dev = words[words.index("dev") + 1]
            return "" if dev == "lo" else dev
    return ""


MAX_NODES_SHOWN = 256


def node_ranks(adir: str) -> list[dict[str, Any]]:
    """[{"rank", "host"}] of a multi-node attempt, from the node.json each node's wrapper wrote
    (node 0 in the attempt dir, node r in node-<r>/); [] for a single-node one."""
    found = []
    try:
        names = sorted(n for n in os.listdir(adir) if n.startswith("node-"))[:MAX_NODES_SHOWN]
    except OSError:
        return []
    for where in [adir] + [os.path.join(adir, n) for n in names]:
        doc = read_json(os.path.join(where, NODE_FILE))
        if isinstance(doc, dict) and isinstance(doc.get("rank"), int):
            found.append({"rank": doc["rank"], "host": str(doc.get("host", ""))[:128]})
    return sorted(found, key=lambda d: d["rank"])
