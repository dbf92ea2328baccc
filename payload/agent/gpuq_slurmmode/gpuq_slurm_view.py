"""Slurm mode, in ``status``: correct the attempts' entries with Slurm's word (one squeue call),
report which machine got which node rank, and delete the forwarded secrets of a sweep none of whose
attempts lives any more (gpuq_slurm.py says what Slurm mode is).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base import gpuq_secrets
from gpuq_slurmmode import gpuq_slurm
from gpuq_base.gpuq_files import Layout, exit_record, mtime, read_json
from gpuq_slurmmode.gpuq_slurm import ALIVE, JOB_FILE, JOB_ID, NODE_FILE, UNSUBMITTED_GRACE_S


MAX_NODES_SHOWN = 256
LIVE_STATES = ("claimed", "running")


def apply_view(lay: Layout, jobs: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Correct the status entries of Slurm attempts with Slurm's view (one squeue call).

    - no exit record: alive in Slurm -> "running" (RUNNING) or "claimed" (pending); ended in Slurm
      or forgotten by it -> "exited" with a record written here (not on disk: status writes nothing)
      naming Slurm's state, marked ``vanished``;
    - an exit record left by a run that Slurm then requeued (the wrapper stopped on a signal, and
      Slurm still runs or queues the job): the attempt goes on, so it is not reported as exited.

    Returns the document's "slurm" section: {"jobs": alive count, "error": ""}."""
    mine, unsubmitted = slurm_attempts(lay, jobs, now)
    view, error = ask_slurm(lay, mine, unsubmitted)
    alive = 0
    for e, sid in mine:
        alive += correct_entry(lay, e, sid, view)
    return {"jobs": alive, "error": error}


def slurm_attempts(lay: Layout, jobs: list[dict[str, Any]],
                   now: float) -> tuple[list[tuple[dict[str, Any], str]], dict[str, dict[str, Any]]]:
    """(entries with their recorded Slurm job id, {attempt comment: entry} of those launched with no id
    recorded yet); an unsubmitted one is "claimed" within its grace (sbatch may still be running, or
    its reply was lost), "dead" after it."""
    mine = []
    unsubmitted = {}  # comment -> entry: launched, but no Slurm id recorded (sbatch running, or its reply lost)
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
            unsubmitted[gpuq_slurm.attempt_comment(e["job_id"], int(e["attempt"]))] = e
    return mine, unsubmitted


def ask_slurm(lay: Layout, mine: list[tuple[dict[str, Any], str]],
              unsubmitted: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, str]] | None, str]:
    """(Slurm's view of these jobs, ""), or (None, the error) when it did not answer (the unsubmitted
    entries then stay "claimed": nothing is concluded).  An unsubmitted attempt Slurm lists by its
    comment joins ``mine`` with that job id (sbatch submitted it, its reply was lost)."""
    try:
        view = gpuq_slurm.slurm_states(lay, [sid for _e, sid in mine], list(unsubmitted))
        error = ""
    except OSError as exc:
        view, error = None, str(exc)
        for e in unsubmitted.values():  # Slurm did not answer: nothing is concluded, an orphan may run
            e["state"] = "claimed"
    for sid, seen in sorted((view or {}).items()):
        orphan = unsubmitted.pop(seen.get("comment", ""), None)
        if orphan is not None:  # sbatch submitted it, its reply was lost: this is the attempt's Slurm job
            mine.append((orphan, sid))
    return view, error


def correct_entry(lay: Layout, e: dict[str, Any], sid: str, view: dict[str, dict[str, str]] | None) -> int:
    """Correct one attempt's entry with what Slurm says of its job ``sid`` (``view`` None: Slurm did not
    answer); 1 when the attempt is alive, else 0."""
    e["group_alive"] = None
    nodes = node_ranks(lay.attempt(e["job_id"], e["attempt"]))
    if nodes:
        e["nodes"] = nodes
    row = (view or {}).get(sid)
    state = row["state"] if row else ""
    e["slurm"] = {"id": sid, "state": state or ("UNKNOWN" if view is None else "GONE"),
                  "reason": row["reason"] if row else "", "nodes": row["nodes"] if row else ""}
    if view is None:  # Slurm did not answer: say nothing new about the attempt
        if e["state"] == "dead":
            e["state"] = "running" if e.get("heartbeat") else "claimed"
        return int(e["state"] != "exited")
    ex = e.get("exit")
    if state in ALIVE or (state == "" and ex is None and e.get("heartbeat_age_s") is not None
                          and float(e["heartbeat_age_s"]) < 120):
        if ex is not None and (ex.get("wrapper_code") == P.EXIT_OK or ex.get("wrapper_signal") is None):
            return 1  # a verdict of its own: the run ended, whatever Slurm still tidies up
        e["exit"] = None
        e["state"] = "running" if state in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT") else "claimed"
        return 1
    if ex is None:
        e["exit"] = vanished_exit(e, sid, state, row)
    e["state"] = "exited"
    return 0


def vanished_exit(e: dict[str, Any], sid: str, state: str, row: dict[str, str] | None) -> dict[str, Any]:
    """The exit record status reports (never writes) for an attempt whose Slurm job ended, or was
    forgotten, before its wrapper wrote one: ``vanished``, naming Slurm's state."""
    what = state or "no longer listed by squeue"
    code = P.EXIT_SIGNAL_BASE + 9
    msg = "Slurm job %s ended %s%s before the wrapper wrote exit.json" % (
        sid, what, " (%s)" % row["reason"] if row and row["reason"] not in ("", "None") else "")
    rec = exit_record(e["job_id"], e["attempt"], code, "train", msg, heartbeat=e.get("heartbeat"))
    rec["vanished"] = True
    rec["slurm_state"] = state or "GONE"
    return rec


def drop_ended_secrets(lay: Layout, jobs: list[dict[str, Any]], slurm: dict[str, Any]) -> list[str]:
    """No agent runs on a login node to delete a sweep's forwarded secrets: ``status`` deletes them
    once Slurm has answered and no attempt of that sweep is queued, pending or running (the entries
    as apply_view corrected them; an attempt that appeared since counts as alive).  Returns the queue
    ids deleted."""
    if slurm.get("error"):
        return []  # Slurm did not answer: nothing is concluded
    state = {(str(e["job_id"]), e["attempt"]): e["state"] for e in jobs}
    return gpuq_secrets.drop_unused(
        lay, lambda j, s: state.get((j, s.attempt), "claimed") in LIVE_STATES)


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
