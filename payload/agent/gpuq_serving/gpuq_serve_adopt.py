"""Restart safety for the serving agent (gpuq_serve.py): what an agent starting on a root finds of the
claims an earlier agent left -- never launched (to launch), launched and alive (to adopt), launched and
gone without an exit record (dead: never re-run).

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, read_json
from gpuq_base.gpuq_jobspec import JobSpec, unfinished_claims
from gpuq_base.gpuq_procs import boot_id, group_alive, proc_cmdline, start_ticks


@dataclass(frozen=True)
class Claim:
    """An unfinished claim found at start-up: ``launched`` or not; when launched, ``rec`` its group
    record (None: none found) and ``slots`` the launch's slots this host has, when its group lives.
    ``spec``: None for a claimed file that is not a sound spec (never launched: the loop fails it with
    the parser's reason)."""

    job_id: str
    attempt: int
    spec: JobSpec | None
    launched: bool
    rec: dict[str, Any] | None = None
    alive: bool = False
    slots: tuple[int, ...] = ()


def found_claims(lay: Layout, slot_ids: Sequence[int]) -> list[Claim]:
    """Every claimed job whose current attempt has no exit record, as an agent starting finds it."""
    out = []
    for job_id, spec, n in unfinished_claims(lay):
        launch = read_json(lay.attempt(job_id, n, P.LAUNCH_FILE))
        rec = read_json(lay.attempt(job_id, n, P.PGID_FILE))
        if not isinstance(spec, JobSpec):  # a refused spec is failed with its reason
            out.append(Claim(job_id, n, None, False))
            continue
        if launch is None and not os.path.exists(lay.attempt(job_id, n, P.LAUNCH_FILE)):
            out.append(Claim(job_id, n, spec, False))
            continue
        if rec is None:
            rec = find_wrapper(lay.root, job_id, n)
        if rec is not None and group_alive(rec):
            slots = [s for s in (launch or {}).get("slots", []) if s in slot_ids]
            out.append(Claim(job_id, n, spec, True, rec, True, tuple(slots)))
        else:
            out.append(Claim(job_id, n, spec, True, rec))
    return out


def find_wrapper(root: str, job_id: str, n: int) -> dict[str, Any] | None:
    """The agent died between spawning a wrapper and its pgid record: find it by exact argv."""
    want = ["--root", root, "wrap", job_id, str(n)]
    for name in os.listdir("/proc"):
        if name.isdigit():
            argv = proc_cmdline(int(name))
            if argv[-5:] == want and any(a.endswith("gpuq_agent.py") for a in argv):
                pid = int(name)
                return {"pgid": pid, "start_ticks": start_ticks(pid), "boot_id": boot_id()}
    return None
