"""The attempts the serving agent (gpuq_serve.py) watches while they run: ``Running``, one per live
attempt; an adopted attempt's end; a cancel acted on; a stall healed here (gpuq_stall.py).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable

from gpuq_base import gpuq_protocol as P
from gpuq_serving import gpuq_stall
from gpuq_base.gpuq_files import Layout
from gpuq_base.gpuq_jobspec import JobSpec
from gpuq_base.gpuq_procs import group_alive, leader_alive, signal_group
from gpuq_serving.gpuq_serve_ends import end_leftovers


class Running:
    def __init__(self, job_id: str, attempt: int, slots: list[int], spec: JobSpec,
                 pid: int | None, rec: dict[str, Any] | None) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.slots = slots
        self.spec = spec
        self.pid = pid  # our child (waitpid) or None when adopted (liveness polling)
        self.rec = rec  # {"pgid","start_ticks","boot_id"}
        self.kill_at: float | None = None  # SIGKILL deadline once a cancel (or a host stall kill) was acted on
        self.killed = False
        self.stall_next = 0.0  # when its files are looked at again for a stall (monotonic; gpuq_stall.py)
        self.stall_off = False  # its stalls are not this agent's to heal (no limits, handled, or left to gpuq)


def watch_adopted(lay: Layout, running: list[Running], log: Callable[[str], None],
                  finish: Callable[[str], None]) -> None:
    """An adopted attempt (no child of ours to reap) ended once its wrapper is gone: what it left
    behind is killed, and ``finish`` is told."""
    for r in running:
        job_id = r.job_id
        if r.pid is not None:
            continue
        rec = r.rec or {}
        leader = rec.get("pgid")
        if isinstance(leader, int) and leader_alive(leader, rec.get("start_ticks"), rec.get("boot_id")):
            continue  # the wrapper still supervises its attempt
        # the wrapper is gone, so the attempt has ended: nothing it started may keep running
        end_leftovers(lay, job_id, r.attempt, r.rec, log)
        if os.path.exists(lay.attempt(job_id, r.attempt, P.EXIT_FILE)):
            log("adopted %s a%d exited" % (job_id, r.attempt))
        else:
            log("DEAD %s a%d: adopted group gone, no exit.json (not re-run)" % (job_id, r.attempt))
        finish(job_id)


def handle_cancels(lay: Layout, running: list[Running], log: Callable[[str], None]) -> None:
    """A cancel file: TERM to the attempt's group, then KILL once its kill_grace_s has passed."""
    now = time.monotonic()  # the SIGKILL deadline: a wall-clock step must not move it
    for r in running:
        job_id = r.job_id
        if r.kill_at is None:
            if not os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
                continue
            if not r.rec or not group_alive(r.rec):
                continue
            grace = r.spec.kill_grace_s
            log("CANCEL %s a%d: TERM to group %d, KILL in %.0fs" % (
                job_id, r.attempt, r.rec["pgid"], grace))
            signal_group(r.rec["pgid"], signal.SIGTERM)
            r.kill_at = now + grace
        elif not r.killed and now >= r.kill_at:
            if r.rec is not None and group_alive(r.rec):
                signal_group(r.rec["pgid"], signal.SIGKILL)
            r.killed = True


def watch_stalls(lay: Layout, running: list[Running], log: Callable[[str], None]) -> None:
    """A running attempt that stalled is healed here, at once, when its spec lets the host retry it
    (gpuq_stall.py): decided under retry.lock, its stacks saved, its group killed (TERM, then KILL after
    kill_grace_s by handle_cancels); attempt n+1's spec follows once it has ended (``Agent.retry``)."""
    mono = time.monotonic()
    for r in running:
        job_id = r.job_id
        if r.stall_off or r.kill_at is not None or mono < r.stall_next:
            continue
        th = gpuq_stall.limits(r.spec)
        if th is None:
            r.stall_off = True
            continue
        r.stall_next = mono + gpuq_stall.check_every(th)
        try:
            r.stall_off, kill_at = gpuq_stall.heal(lay, r.job_id, r.attempt, r.spec, r.rec, th, log)
            r.kill_at = kill_at if kill_at is not None else r.kill_at
        except Exception as e:  # an odd file: the patrol judges the attempt as ever, the round goes on
            r.stall_off = True
            log("STALL %s a%d: not watched here any more: %s" % (job_id, r.attempt, e))
