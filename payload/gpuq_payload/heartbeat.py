"""Heartbeat file written atomically by rank 0 (shape: see protocol.py)."""

from __future__ import annotations

import json
import os
import time


def write_json_atomic(path: str, doc: dict, fsync: bool = True) -> None:
    """Write ``doc`` as JSON to ``path`` via ``path.tmp`` + rename."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True)
        fh.write("\n")
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


RATE_WINDOW_S = 2.0  # the shortest time a step rate is measured over


class Heartbeat:
    """Rate-limited heartbeat writer; ``enabled`` is False on ranks other than 0."""

    def __init__(self, path: str, interval_s: float, enabled: bool) -> None:
        self.path = path
        self.interval_s = max(0.0, float(interval_s))
        self.enabled = enabled
        self._last_write = 0.0
        self._last_phase: str | None = None
        self._rate_t = time.monotonic()
        self._rate_step: int | None = None
        self.steps_per_s = 0.0
        if enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def beat(self, *, step: int, total_steps: int, epoch: int, epochs: int, loss: float | None,
             lr: float, phase: str, force: bool = False) -> bool:
        """Write a heartbeat if forced, the phase changed, or ``interval_s`` passed. True if written."""
        if not self.enabled:
            return False
        now = time.monotonic()
        due = force or phase != self._last_phase or now - self._last_write >= self.interval_s
        if not due:
            return False
        self._measure(now, step)
        doc = {
            "time": time.time(), "step": step, "total_steps": total_steps, "epoch": epoch,
            "epochs": epochs, "loss": _finite_or_none(loss), "lr": lr, "phase": phase,
            "steps_per_s": round(self.steps_per_s, 4),
        }
        write_json_atomic(self.path, doc, fsync=False)
        self._last_write = now
        self._last_phase = phase
        return True

    def _measure(self, now: float, step: int) -> None:
        """The step rate over a window of at least RATE_WINDOW_S (and the heartbeat interval): a beat
        forced by a phase change milliseconds after the last one measures no burst rate (an ETA of 0 s
        with a quarter of the steps to go), and evals and saves inside the window count."""
        if self._rate_step is None or step < self._rate_step:  # the first beat, or a restart of the count
            self._rate_t, self._rate_step = now, step
            return
        window = now - self._rate_t
        if window < max(RATE_WINDOW_S, self.interval_s) or step == self._rate_step:
            return  # too short, or no step since (an eval): the window grows until one can be measured
        self.steps_per_s = (step - self._rate_step) / window
        self._rate_t, self._rate_step = now, step


def _finite_or_none(x: float | None) -> float | None:
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return float(x)
