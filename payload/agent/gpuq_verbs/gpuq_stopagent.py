"""``stop-agent [--force]``: stop this root's idle agent now (``gpuq hosts stop-agent HOST``, docs/cli.md).

An agent exits by itself after ``--idle-exit-s`` (600 s) without work; this stops it at once.  It is
refused while the agent has work (running attempts, claimed or inbox jobs) unless ``--force``: then the
agent stops anyway, its running attempts keep running under their wrappers, and the next agent (started
by the next ``enqueue --serve``) adopts them and launches what waits.  The agent is identified by its
recorded pid, start ticks and boot id before it is signalled (SIGTERM: it removes its pid file and lock).

Prints one document: {"outcome": "stopped" | "none" | "busy" | "timeout", "pid", "running": [job ids],
"queued": N}.  stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, list_specs, read_json
from gpuq_base.gpuq_jobspec import unfinished_claims
from gpuq_base.gpuq_procs import group_alive, leader_alive

STOP_WAIT_S = 15.0


def work(lay: Layout) -> tuple[list[str], int]:
    """(job ids with a live attempt, jobs waiting: claimed but not launched, or still in the inbox)."""
    running: list[str] = []
    waiting = len(list_specs(lay.p(P.INBOX_DIR)))
    for job_id, _spec, n in unfinished_claims(lay):
        if not os.path.exists(lay.attempt(job_id, n, P.LAUNCH_FILE)):
            waiting += 1
        else:
            rec = read_json(lay.attempt(job_id, n, P.PGID_FILE))
            if rec is None or group_alive(rec):  # no pgid record yet: its wrapper is starting
                running.append(job_id)
    return running, waiting


def cmd_stop_agent(lay: Layout, force: bool) -> int:
    rec = read_json(lay.p(P.AGENT_PID))
    out: dict[str, Any] = {"outcome": "none", "pid": None, "running": [], "queued": 0}
    alive = isinstance(rec, dict) and leader_alive(rec.get("pid"), rec.get("start_ticks"), rec.get("boot_id"))
    running, waiting = work(lay)
    out.update(running=running, queued=waiting)
    if not alive or not isinstance(rec, dict):
        print(json.dumps(out))
        return 0
    pid = int(rec["pid"])
    out["pid"] = pid
    if (running or waiting) and not force:
        out["outcome"] = "busy"
        print(json.dumps(out))
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass
    deadline = time.time() + STOP_WAIT_S
    while time.time() < deadline and leader_alive(pid, rec.get("start_ticks"), rec.get("boot_id")):
        time.sleep(0.1)
    gone = not leader_alive(pid, rec.get("start_ticks"), rec.get("boot_id"))
    out["outcome"] = "stopped" if gone else "timeout"
    print(json.dumps(out))
    return 0
