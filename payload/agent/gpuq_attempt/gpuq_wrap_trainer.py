"""The wrapper's hold on the trainer's process (gpuq_wrap.py, phase "train"): the stop signals it gets
from outside, relayed to the trainer (Slurm's SIGUSR1 as a SIGTERM: the time limit is near), the wait
that touches wrapper.alive and kills the rest of the group once a relayed signal's grace has passed,
the ranks that died of a signal before the trainer, every leftover process ended, and the trainer's
exit status read as the attempt's end.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import append_line, read_json, touch
from gpuq_base.gpuq_procs import dead_rank_line, descendants, group_members, signaled_children


class Supervisor:
    """The trainer's process once started, and the first stop signal the wrapper got."""

    def __init__(self) -> None:
        self.trainer: subprocess.Popen[bytes] | None = None
        self.got_signal: int | None = None
        self.sig_at: float | None = None
        self.time_limit_near = False

    def catch_signals(self) -> None:
        """SIGTERM, SIGINT and SIGUSR1 relayed to the trainer; SIGHUP ignored."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR1:  # Slurm's --signal=B:USR1@grace: the time limit is near
            self.time_limit_near = True
            signum = signal.SIGTERM  # the trainer checkpoints and stops, as for any stop request
        if self.got_signal is None:
            self.got_signal = signum
            self.sig_at = time.time()
            if self.trainer is not None and self.trainer.poll() is None:
                with contextlib.suppress(OSError):
                    self.trainer.send_signal(signum)

    def kill_trainer(self) -> None:
        """SIGKILL the trainer if it still runs (a wrapper error ends the attempt)."""
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()

    def supervise(self, trainer: subprocess.Popen[bytes], alive_path: str, heartbeat_s: float,
                  grace: float) -> int:
        """Wait for the trainer: touch wrapper.alive every heartbeat, kill the rest of the group once
        a relayed signal's grace has passed.  Returns the trainer's exit status."""
        next_touch = 0.0
        killed_rest = False
        while True:
            now = time.time()
            if now >= next_touch:
                with contextlib.suppress(OSError):
                    touch(alive_path)
                next_touch = now + heartbeat_s
            if self.sig_at is not None and not killed_rest and now - self.sig_at >= grace:
                self.kill_rest()
                killed_rest = True
            try:
                return int(trainer.wait(timeout=0.2))
            except subprocess.TimeoutExpired:
                continue

    def report_dead_ranks(self, log_path: str) -> None:
        """A process the trainer started that died of a signal before it (a rank Lightning or another
        framework spawned, kill -9'd; the survivor then fails on the lost peer): say so in the log, in
        torchrun's own words, so the attempt is classed by that death (docs/health.md).  Only orphans the
        wrapper inherited as a subreaper are seen, and only before gpuq's own kill (``kill_rest``)."""
        trainer = self.trainer
        for pid, sig in signaled_children({trainer.pid} if trainer is not None else ()):
            append_line(log_path, dead_rank_line(pid, sig))

    def kill_rest(self) -> None:
        """SIGKILL our group and every descendant (workers in other sessions included), then reap.

        The trainer is reaped through its Popen first: a status reaped here would be lost to it (Popen
        then reads the missing child as exit 0, and a trainer killed after its grace would look trained)."""
        me = os.getpid()
        for pid in set(group_members(os.getpgrp())) | set(descendants(me)):
            if pid != me:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        trainer = self.trainer
        if trainer is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                trainer.wait(timeout=2.0)
        deadline = time.time() + 2.0
        while time.time() < deadline:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.02)
            elif trainer is not None and pid == trainer.pid and trainer.returncode is None:
                trainer.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


@dataclass(frozen=True)
class TrainerEnd:
    """The attempt's end as a trainer's non-zero exit status says it: what ``finish`` records."""

    code: int
    message: str
    trainer_code: int
    sig: int | None = None


def trainer_end(rc: int, adir: str, why: str) -> TrainerEnd:
    """The end of an attempt whose trainer exited ``rc`` (not 0): a signal's death, the code the
    payload wrote to its trainer-exit file, else the status itself; ``why`` ends the message."""
    if rc < 0:
        sig = -rc
        return TrainerEnd(P.EXIT_SIGNAL_BASE + sig, "trainer killed by signal %d%s" % (sig, why), rc, sig)
    told = read_json(os.path.join(adir, P.TRAINER_EXIT_FILE))
    if isinstance(told, dict) and isinstance(told.get("code"), int) and 0 < told["code"] < 256:
        # torchrun turns every worker failure into 1; the payload said what it meant
        code = told["code"]
        detail = str(told.get("message") or "")
        return TrainerEnd(code, "trainer exited %d (rank %s exited %d%s)%s" % (
            rc, told.get("rank"), code, ": " + detail if detail else "", why), code)
    return TrainerEnd(rc, "trainer exited %d%s" % (rc, why), rc)
