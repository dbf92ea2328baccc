"""``reap``: find (and only with ``--force`` kill) VRAM zombies (docs/health.md), one "gpuq.reap/1" document.

Usage: ``gpuq_agent.py --root R reap [--force] [--min-age-s 120] [--resample-s 60]
[--include-other-users]``.

1. Enumerate the real ``/dev/nvidia*`` character-device nodes (none: exit 1) and their holders via
   ``fuser`` (mode letters stripped) or ``lsof -t`` (neither tool: exit 1): gpuq_reap_find.py.
2. Drop the pids ``nvidia-smi --query-compute-apps=pid`` lists (steps 2 to 4: gpuq_reap_judge.py).
3. Drop every pid in the tree of a live gpuq agent or attempt group of this root (recorded groups,
   identity-checked, plus /proc/<pid>/task/*/children): in containers nvidia-smi often reports
   host-namespace pids, so a healthy trainer looks invisible; this keeps it alive.
4. Drop system daemons (nvidia-persistenced, nv-hostengine, Xorg, display managers), processes
   younger than --min-age-s, vanished pids and, unless --include-other-users, other users' processes.
5. Sample again --resample-s later; a candidate must be in both samples with the same start time.
6. Dry run by default: list them, exit 0.  With --force: SIGTERM, wait 10 s, SIGKILL survivors,
   report each outcome; exit 1 when a kill failed.  Never a kill by pattern: by pid, after
   re-checking that pid's start time (gpuq_reap_kill.py).

Document: {"schema": "gpuq.reap/1", "clean", "dry_run", "host", "time", "devices", "tool",
"candidates": [{"pid", "user", "comm", "age_s", "devices", "cmdline"}], "killed": [{"pid",
"outcome"}], "excluded": {reason: count}, "notes": [...], "error" (only when it could not look)}.
Command lines are redacted (values of key/token/secret/password-like arguments: gpuq_reap_redact.py).

stdlib only, Python >= 3.8, Linux.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, utc
from gpuq_verbs import gpuq_reap_find, gpuq_reap_judge, gpuq_reap_kill

BUSY_MIB = 1024.0


def run_reap(lay: Layout, force: bool, min_age_s: float, resample_s: float, other_users: bool,
             sleep: Any = time.sleep) -> tuple[int, dict[str, Any]]:
    doc: dict[str, Any] = {"schema": P.REAP_SCHEMA, "clean": False, "dry_run": not force,
                           "host": socket.gethostname(), "time": utc(), "devices": [], "tool": "",
                           "candidates": [], "killed": [], "excluded": {}, "notes": []}
    nodes = gpuq_reap_find.device_nodes()
    doc["devices"] = nodes
    if not nodes:
        doc["error"] = "no /dev/nvidia* device nodes: not a GPU host, or this container was given no GPUs"
        return P.AGENT_EXIT_REAP_FAILED, doc
    tool = gpuq_reap_find.holder_tool()
    doc["tool"] = tool
    if not tool:
        doc["error"] = "neither fuser nor lsof is installed: cannot find device holders (install psmisc or lsof)"
        return P.AGENT_EXIT_REAP_FAILED, doc
    first = gpuq_reap_judge.take_sample(lay, nodes, tool, min_age_s, other_users)
    final = first
    if first.cands:
        sleep(max(0.0, resample_s))
        second = gpuq_reap_judge.take_sample(lay, nodes, tool, min_age_s, other_users)
        for pid in list(second.cands):
            if first.ticks.get(pid) != second.ticks[pid]:
                del second.cands[pid]
                del second.ticks[pid]
                second.skip("not in both samples")
        final = second
    doc["excluded"] = final.excluded
    doc["notes"] = final.notes
    doc["candidates"] = [final.cands[p] for p in sorted(final.cands)]
    doc["clean"] = not final.cands
    mem = gpuq_reap_find.gpu_memory()
    for idx, used in sorted(mem.items()):
        node = "/dev/nvidia%d" % idx
        if used > BUSY_MIB and node in nodes and node not in final.held:
            doc["notes"].append("GPU %d: %g MiB used but no process here holds %s: the holder may live in "
                                "another container, which only restarting that container frees" % (idx, used, node))
    if not force or not final.cands:
        return 0, doc
    doc["memory_used_mib"] = {"before": {str(k): v for k, v in sorted(mem.items())}}
    doc["killed"] = gpuq_reap_kill.kill_all(final.ticks)
    doc["memory_used_mib"]["after"] = {str(k): v for k, v in sorted(gpuq_reap_find.gpu_memory().items())}
    failed = any(k["outcome"].startswith("failed") for k in doc["killed"])
    return (P.AGENT_EXIT_REAP_FAILED if failed else 0), doc


def cmd_reap(lay: Layout, args: argparse.Namespace) -> int:
    if args.min_age_s < 0 or args.resample_s < 0:
        print("gpuq reap: --min-age-s and --resample-s must be >= 0", file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    code, doc = run_reap(lay, bool(args.force), float(args.min_age_s), float(args.resample_s),
                         bool(args.include_other_users))
    if doc.get("error"):
        print("gpuq reap: %s" % doc["error"], file=sys.stderr)
    elif doc["clean"]:
        print("gpuq reap: clean (no zombie holds a GPU device)", file=sys.stderr)
    for c in doc["candidates"]:
        print("gpuq reap: zombie pid %d user %s comm %s age %.0fs devices %s: %s" % (
            c["pid"], c["user"], c["comm"], c["age_s"], ",".join(c["devices"]), c["cmdline"]), file=sys.stderr)
    for k in doc["killed"]:
        print("gpuq reap: pid %d %s" % (k["pid"], k["outcome"]), file=sys.stderr)
    for n in doc["notes"]:
        print("gpuq reap: note: %s" % n, file=sys.stderr)
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return code


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--force", action="store_true", help="kill the candidates (SIGTERM, 10 s, SIGKILL)")
    ap.add_argument("--min-age-s", type=float, default=float(P.REAP_MIN_AGE_S),
                    help="ignore holders younger than this (context start-up)")
    ap.add_argument("--resample-s", type=float, default=float(P.REAP_RESAMPLE_S),
                    help="seconds between the two samples")
    ap.add_argument("--include-other-users", action="store_true", help="also list other users' processes")
