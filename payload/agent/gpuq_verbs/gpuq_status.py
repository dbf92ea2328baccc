"""``status --json``: the read-only probe, one "gpuq.status/1" document on stdout.

It reads the root and /proc and writes nothing (no file, no .pyc): safe on a read-only bundle,
safe while an agent runs; the one exception is on a Slurm login node, where no agent runs: there it
deletes the forwarded secrets of a sweep none of whose attempts lives (gpuq_slurm_view.py).
The document's fields are listed in gpuq_protocol.py.  The forwarded secret values held on the
host are redacted from every job entry (gpuq_secrets.py).

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from typing import Any

from gpuq_records import gpuq_own
from gpuq_base import gpuq_protocol as P
from gpuq_base import gpuq_secrets
from gpuq_slurmmode import gpuq_slurm
from gpuq_base.gpuq_files import Layout, list_specs, mtime, read_json, read_text, utc
from gpuq_base.gpuq_hostfacts import disk_info, memory_info, query_gpus
from gpuq_watch.gpuq_kernel import kernel_section
from gpuq_watch.gpuq_nonfinite import of_running_job
from gpuq_base.gpuq_jobspec import JobSpec, RunSection, attempt_of, read_spec
from gpuq_records.gpuq_observe import job_progress
from gpuq_base.gpuq_procs import boot_id, group_alive, leader_alive
from gpuq_records.gpuq_runmetrics import metrics_progress
from gpuq_watch.gpuq_scan import MAX_NONFINITE, parse_scan_args, scan_job

LAUNCH_PGID_GRACE_S = 10.0  # launched, pgid not yet written: still "claimed" (launching) this long


def agent_state(lay: Layout) -> tuple[dict[str, Any], Any]:
    rec = read_json(lay.p(P.AGENT_PID))
    if not isinstance(rec, dict):
        return {"alive": False, "pid": None}, None
    alive = leader_alive(rec.get("pid"), rec.get("start_ticks"), rec.get("boot_id"))
    return {"alive": alive, "pid": rec.get("pid")}, rec


def job_entry(lay: Layout, job_id: str, where: str, now: float, wanted: Any = ()) -> dict[str, Any]:
    spec = read_spec(lay.p(where, job_id + ".json"))  # None: unreadable, or refused (the serve loop says why)
    n = spec.attempt if spec is not None else attempt_of(read_json(lay.p(where, job_id + ".json"))) or 1
    e = blank_entry(lay, job_id, spec, n)
    if where == P.INBOX_DIR:
        e["state"] = "queued"
        return e
    if where == P.WITHDRAWN_DIR:
        e["state"] = "withdrawn"
        return e
    adir = lay.attempt(job_id, n)
    launch, rec = read_attempt_files(e, lay, job_id, adir, now)
    e["state"] = attempt_state(e, adir, launch, rec, now)
    final = e["state"] == "exited" and job_id in wanted  # just ended: its last progress, once
    if e["state"] in ("running", "dead") or final:  # bounded: the log's last 64 KiB, a capped walk of run/
        observe_run(e, lay, job_id, spec, n)
    return e


def blank_entry(lay: Layout, job_id: str, spec: JobSpec | None, n: int) -> dict[str, Any]:
    """A job's entry before its attempt files are read: what its spec says, every other field None."""
    return {"job_id": job_id, "name": spec.name if spec is not None else None,
            "queue_id": spec.queue_id if spec is not None else None,
            "attempt": n, "state": None, "slots": None, "pgid": None, "group_alive": None,
            "launched_at": None, "exit": None, "heartbeat": None, "heartbeat_age_s": None,
            "log_bytes": None, "log_mtime": None, "ckpt": None, "progress": None,
            "run_ckpt_mtime": None, "run_metrics_mtime": None, "gpu_util_pct": None,
            "cancel_requested": os.path.exists(lay.job(job_id, P.CANCEL_FILE))}


def read_attempt_files(e: dict[str, Any], lay: Layout, job_id: str, adir: str,
                       now: float) -> tuple[Any, Any]:
    """Fill ``e`` from the attempt's files (its log's size, the checkpoint pointer, heartbeat, exit
    record, provenance, launch record, group record); returns (launch.json, pgid.json) as read."""
    launch = read_json(os.path.join(adir, P.LAUNCH_FILE))
    rec = read_json(os.path.join(adir, P.PGID_FILE))
    ex = read_json(os.path.join(adir, P.EXIT_FILE))
    hb = read_json(os.path.join(adir, P.HEARTBEAT_FILE))
    hb_m = mtime(os.path.join(adir, P.HEARTBEAT_FILE))
    try:
        st = os.stat(os.path.join(adir, P.JOB_LOG))
        e["log_bytes"], e["log_mtime"] = st.st_size, st.st_mtime
    except OSError:
        pass
    ck = read_json(lay.job(job_id, P.CKPT_DIR, P.LATEST_POINTER))
    if isinstance(ck, dict):
        ck = dict(ck)
        ck["mtime"] = mtime(lay.job(job_id, P.CKPT_DIR, P.LATEST_POINTER))
    e["ckpt"] = ck
    e["heartbeat"] = hb if isinstance(hb, dict) else None
    e["heartbeat_age_s"] = round(now - hb_m, 1) if hb_m is not None else None
    e["exit"] = ex if isinstance(ex, dict) else None
    prov = read_json(os.path.join(adir, P.PROVENANCE_FILE))
    e["provenance"] = prov if isinstance(prov, dict) else None
    if isinstance(launch, dict):
        e["slots"] = launch.get("slots")
        e["launched_at"] = launch.get("time")
    if isinstance(rec, dict):
        e["pgid"] = rec.get("pgid")
        e["boot_id"] = rec.get("boot_id")  # the boot the attempt started in: differs after a reboot
        e["group_alive"] = group_alive(rec)
    return launch, rec


def attempt_state(e: dict[str, Any], adir: str, launch: Any, rec: Any, now: float) -> str:
    """Which state a claimed job's attempt is in: exited (an exit record), claimed (not launched, or
    launching: no group recorded yet), running (its group lives) or dead."""
    if e["exit"] is not None:
        return "exited"
    if launch is None and not os.path.exists(os.path.join(adir, P.LAUNCH_FILE)):
        return "claimed"
    if e["group_alive"]:
        return "running"
    if rec is None and now - (mtime(os.path.join(adir, P.LAUNCH_FILE)) or 0) < LAUNCH_PGID_GRACE_S:
        return "claimed"  # launching: the wrapper has not recorded its group yet
    return "dead"


def observe_run(e: dict[str, Any], lay: Layout, job_id: str, spec: JobSpec | None, n: int) -> None:
    """The progress of a running (or dead, or just ended) attempt: its log's progress line, its
    metrics files, its newest own checkpoint's mtime."""
    run = spec.run if spec is not None and spec.run is not None else RunSection()
    if e["log_bytes"]:
        e["progress"] = job_progress(os.path.join(lay.attempt(job_id, n), P.JOB_LOG), run.progress)
    observe_metrics(e, lay.job(job_id), run, n)
    if run.checkpoint:
        newest = gpuq_own.newest_checkpoint(lay.job(job_id, P.RUN_DIR), run.checkpoint)
        e["run_ckpt_mtime"] = newest.mtime if newest is not None else None


def observe_metrics(e: dict[str, Any], job_dir: str, run: RunSection, attempt: int) -> None:
    """A trainer's metrics files as signs of life ("run_metrics_mtime") and, when its log shows no
    step or epoch (a Rich progress bar writes nothing to a file), as its progress; when its log shows
    no loss (Lightning's bar shows only what is logged with ``prog_bar=True``), the rows' loss
    (``train_loss`` in a CSVLogger's metrics.csv) fills it."""
    prog = e.get("progress")
    shown = prog is not None and (prog.get("step") is not None or prog.get("epoch") is not None)
    lossless = prog is None or prog.get("loss") is None
    mtime_, rows = metrics_progress(job_dir, run, attempt, rows_too=not shown or lossless)
    e["run_metrics_mtime"] = mtime_
    if rows is None:
        return
    prog = dict(prog or {"total": None, "epochs": None, "pct": None, "line": None})
    if not shown:
        prog.update(step=rows["step"], epoch=rows["epoch"], source="metrics")
    if prog.get("loss") is None:
        prog["loss"] = rows["loss"]
    e["progress"] = prog


# what a job's own output or files can put in an entry
HOST_TEXT = ("exit", "progress", "scan", "heartbeat", "provenance", "host_retried")


def redact_host_text(entry: dict[str, Any], hide: list[str]) -> None:
    """Forwarded secret values out of an entry's host text (exit record, progress line, scan hits and
    traceback, heartbeat, the results' summary); paths and hashes the controller acts on stay as they are."""
    for key in HOST_TEXT:
        if entry.get(key) is not None:
            entry[key] = gpuq_secrets.redact_doc(entry[key], hide)
    results = entry.get("results")
    if isinstance(results, dict) and results.get("summary") is not None:
        results["summary"] = gpuq_secrets.redact_doc(results["summary"], hide)
    partial = entry.get("partial")
    if isinstance(partial, dict) and partial.get("curves"):
        partial["curves"] = gpuq_secrets.redact_doc(partial["curves"], hide)


def cmd_status(lay: Layout, args: argparse.Namespace) -> int:
    now = time.time()
    agent, rec = agent_state(lay)
    gpus = query_gpus()
    kind, total = slot_capacity(rec, gpus)
    wanted = set(getattr(args, "results_for", ()) or ())
    jobs = [job_entry(lay, j, w, now, wanted) for j, w in sorted(where_each_job_is(lay).items())]
    used = sum(len(j["slots"] or []) for j in jobs if j["state"] == "running")
    slurm_conf = gpuq_slurm.config(lay)
    slurm = None
    if slurm_conf is not None:  # a login node: Slurm says which jobs live, capacity is the job cap
        from gpuq_slurmmode import gpuq_slurm_view  # only on login nodes: every import compiles from source
        slurm = gpuq_slurm_view.apply_view(lay, jobs, now)
        kind, total = "slurm", int(slurm_conf.get("max_jobs") or 1)
        used = slurm["jobs"]
    if kind == "gpu":
        show_gpu_util(jobs, gpus)
    uptime = uptime_s()
    bundles = bundle_names(lay)
    try:
        scans = parse_scan_args(getattr(args, "scan", ()))
    except ValueError as exc:
        print(f"gpuq status: {exc}", file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    attach_scans(lay, jobs, scans)
    attach_results(lay, jobs, wanted)
    attach_partial(lay, jobs, set(getattr(args, "curves_for", ()) or ()))
    hide = gpuq_secrets.held_values(lay)
    for e in jobs:
        redact_host_text(e, hide)
    if slurm is not None:
        from gpuq_slurmmode import gpuq_slurm_view
        gpuq_slurm_view.drop_ended_secrets(lay, jobs, slurm)
    doc = {"schema": P.STATUS_SCHEMA, "protocol": P.PROTOCOL_VERSION, "hostname": socket.gethostname(),
           "root": lay.root, "time": utc(now), "boot_id": boot_id(), "uptime_s": uptime, "agent": agent,
           "slots": {"kind": kind, "total": total, "free": max(0, total - used)},
           "gpus": gpus, "disk": disk_info(lay.root), "memory": memory_info(), "bundles": bundles,
           "jobs": jobs, "kernel": kernel_section(getattr(args, "kernel_since", None))}
    if slurm is not None:
        doc["slurm"] = slurm
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return 0


def slot_capacity(rec: Any, gpus: list[dict[str, Any]]) -> tuple[str, int]:
    """(slot kind, slot count): the running agent's slots as its pid record says, else the GPUs seen,
    else the CPUs."""
    if isinstance(rec, dict) and isinstance(rec.get("slots"), dict):
        return rec["slots"].get("kind", "cpu"), len(rec["slots"].get("ids") or [])
    if gpus:
        return "gpu", len(gpus)
    return "cpu", os.cpu_count() or 1


def where_each_job_is(lay: Layout) -> dict[str, str]:
    """{job id: the directory its spec is in}; a job in two is where it got last (claimed > inbox >
    withdrawn)."""
    seen: dict[str, str] = {}
    for where in (P.WITHDRAWN_DIR, P.INBOX_DIR, P.CLAIMED_DIR):  # later wins: claimed > inbox > withdrawn
        for job_id in list_specs(lay.p(where)):
            seen[job_id] = where
    return seen


def show_gpu_util(jobs: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> None:
    """Each running job's busiest GPU's utilisation: what a trainer without a heartbeat shows on its GPUs
    (shown, not a liveness proof: a hung NCCL collective spins at 100%)."""
    util = {g.get("index"): g.get("util_pct") for g in gpus}
    for e in jobs:
        busy: list[Any] = [util[s] for s in e["slots"] or [] if e["state"] == "running" and util.get(s) is not None]
        e["gpu_util_pct"] = max(busy) if busy else None


def uptime_s() -> float | None:
    """The host's uptime from /proc/uptime, None when unreadable."""
    up = (read_text("/proc/uptime") or "").split()
    if up:
        with contextlib.suppress(ValueError):
            return float(up[0])
    return None


def bundle_names(lay: Layout) -> list[str]:
    """The bundles on this host (hidden entries, such as the data trees, left out)."""
    try:
        return sorted(n for n in os.listdir(lay.p(P.BUNDLES_DIR)) if not n.startswith("."))
    except OSError:
        return []


def attach_scans(lay: Layout, jobs: list[dict[str, Any]], scans: dict[str, tuple[int, int, int]]) -> None:
    """The scan the controller asked for, per job: new log and metrics bytes, a running job's project
    metrics' newest non-finite losses, and whether this host retried the attempts the controller has
    not seen end."""
    for e in jobs:
        if e["job_id"] in scans:
            n, log_off, metrics_off = scans[e["job_id"]]
            e["scan"] = scan_job(lay.job(e["job_id"]), n, log_off, metrics_off)
            if e["state"] == "running" and n == e["attempt"]:  # a project's own metrics: its newest losses
                e["scan"]["nonfinite"] = (e["scan"]["nonfinite"] + of_running_job(lay, e["job_id"], n,
                                                                                 e["launched_at"]))[:MAX_NONFINITE]
            if n < e["attempt"]:  # attempts the controller has not seen end: did this host retry them itself?
                from gpuq_watch.gpuq_retry import chain
                e["host_retried"] = chain(lay, e["job_id"], n, e["attempt"])


def attach_partial(lay: Layout, jobs: list[dict[str, Any]], wanted: set[str]) -> None:
    """The learning curves so far of the wanted jobs that are running (read, never written): what the
    controller's early stopping compares at its rungs."""
    if not wanted:
        return
    from gpuq_records.gpuq_inbox import partial_one
    for e in jobs:
        if e["job_id"] in wanted and e["state"] == "running":
            e["partial"] = partial_one(lay.root, e["job_id"])


def attach_results(lay: Layout, jobs: list[dict[str, Any]], wanted: set[str]) -> None:
    """The collected results of the wanted jobs that exited 0 (read, never written)."""
    if not wanted:  # gpuq_inbox and what it imports compile from source on every call: only when asked
        return
    from gpuq_records.gpuq_inbox import collect_one
    for e in jobs:
        ex = e.get("exit") or {}
        if e["job_id"] in wanted and e["state"] == "exited" and ex.get("wrapper_code") == 0:
            e["results"] = collect_one(lay.root, e["job_id"], write=False)
