"""Slurm mode, on a compute node: what the wrapper of a Slurm attempt does differently (the GPUs Slurm
gave, a requeued run's stale record, a multi-node job's rendezvous); gpuq_slurm.py says what Slurm
mode is.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
import socket
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import append_line, atomic_write_json, mkdirs, utc
from gpuq_base.gpuq_gang import interface_to
from gpuq_slurmmode.gpuq_slurm import NODE_FILE, restart_count


def enter_node(adir: str, launch: dict[str, Any]) -> tuple[str, int]:
    """The wrapper's first step on a compute node: (the attempt dir this node writes, the restart
    count).  A multi-node job's other nodes keep their own files (``node-<rank>/``); every node of a
    multi-node job records which machine got which rank (node.json); a requeued run sets the
    stopped run's exit record aside and says so in the job log."""
    rank = node_rank()
    if rank > 0 and os.path.isdir(adir):
        adir = os.path.join(adir, "node-%d" % rank)
        mkdirs(adir)
        atomic_write_json(os.path.join(adir, P.LAUNCH_FILE), launch)
    restart = restart_count()
    if int(os.environ.get("SLURM_NNODES") or 1) > 1:  # which machine got which node rank
        atomic_write_json(os.path.join(adir, NODE_FILE), {
            "rank": rank, "host": socket.gethostname(), "slurm_job_id": os.environ["SLURM_JOB_ID"],
            "restart": restart, "time": utc()})
    stale = set_aside_stale_exit(adir)
    if restart:
        append_line(os.path.join(adir, P.JOB_LOG), "=== gpuq: Slurm job %s runs this attempt again "
                    "(restart %d)%s; resuming from the newest checkpoint ===" % (
                        os.environ["SLURM_JOB_ID"], restart,
                        ", the stopped run's record is " + os.path.basename(stale) if stale else ""))
    return adir, restart


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
