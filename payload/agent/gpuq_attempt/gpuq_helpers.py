"""The wrapper's helpers beside the trainer: the provenance probe (gpuq_provenance.py: a ``python -I`` and an
``nvidia-smi``) and the memory sampler (gpuq_memwatch.py: an ``nvidia-smi`` per row and a ``/proc`` walk).

They start once the trainer is up, never beside its start-up, where they slowed it (docs/performance.md,
the makespan): when the trainer's first heartbeat appears, after ``HELPERS_AFTER_S`` for a trainer that
writes none, or at once when the trainer has already ended.  They run in one thread at niceness
``HELPERS_NICE`` (a thread's own on Linux; the processes it starts inherit it).  What they record is
what they recorded before: ``provenance.json`` once, then a row of ``mem.tsv`` every MEM_SAMPLE_S;
``finish`` waits (bounded) for the probe and the first row, so a trainer shorter than the wait still
leaves both.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from gpuq_attempt import gpuq_provenance
from gpuq_attempt.gpuq_memwatch import sample_memory
from gpuq_base import gpuq_protocol as P

HELPERS_AFTER_S = 2.0  # a trainer that writes no heartbeat: the helpers start this long after its start
HELPERS_NICE = 10
POLL_S = 0.05
FINISH_TIMEOUT_S = 2 * gpuq_provenance.PROBE_TIMEOUT_S


class Helpers:
    """The provenance probe and the memory sampler of one attempt, in one thread started after the trainer."""

    def __init__(self, adir: str, python: str, env: dict[str, str], launch: dict[str, Any], gpu: bool,
                 trainer_pid: int, done: threading.Event) -> None:
        self.adir = adir
        self.python = python
        self.env = env
        self.launch = launch  # the probe's: the attempt's slots and their kind as this node sees them
        self.gpu = gpu  # the sampler reads the GPUs' use too
        self.trainer_pid = trainer_pid
        self.done = done  # the attempt's end: the sampler stops
        self.started = time.time()
        self.ended = threading.Event()  # the trainer has exited
        self.first_pass = threading.Event()  # provenance.json written and mem.tsv's first row taken
        self.up_at: float | None = None  # when the helpers started (the trainer was up, or ended)
        self.thread = threading.Thread(target=self._run, name="gpuq-helpers")
        self.thread.daemon = True

    def start(self) -> Helpers:
        self.thread.start()
        return self

    def trainer_up(self) -> bool:
        """The trainer's first heartbeat of this attempt is there."""
        try:
            return os.stat(os.path.join(self.adir, P.HEARTBEAT_FILE)).st_mtime >= self.started - 1.0
        except OSError:
            return False

    def _wait_for_trainer(self) -> None:
        deadline = self.started + HELPERS_AFTER_S
        while not self.ended.is_set() and time.time() < deadline and not self.trainer_up():
            self.ended.wait(POLL_S)
        self.up_at = time.time()

    def _run(self) -> None:
        try:
            with contextlib.suppress(AttributeError, OSError):  # a thread's own niceness (Linux)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HELPERS_NICE)
            self._wait_for_trainer()
            gpuq_provenance.write(self.adir, self.python, self.env, self.launch)
            sample_memory(os.path.join(self.adir, P.MEM_FILE), self.trainer_pid, self.gpu, self.done,
                          first_row=self.first_pass)
        finally:
            self.first_pass.set()

    def finish(self, timeout: float = FINISH_TIMEOUT_S) -> None:
        """The trainer has exited: start the helpers now if they wait still, and wait (at most ``timeout``)
        for the probe's record and the sampler's first row."""
        self.ended.set()
        self.first_pass.wait(timeout)
