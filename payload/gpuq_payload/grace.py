"""The SIGTERM grace budget (docs/checkpoints.md): is there time for a last checkpoint?

``GPUQ_SIGTERM_GRACE_S`` says how many seconds pass between the SIGTERM this process gets and the
SIGKILL that follows (RunPod spot ~5 s, a cancel: the job's ``kill_grace_s``).  Absent or empty
means unknown: the payload then behaves as it always did (it saves on SIGTERM and hopes).

With a known grace G, at a step boundary after a signal (never in the handler), every rank
decides from the same all-reduced numbers:

    save   iff  elapsed + save_s * SAFETY + MARGIN_S <= G

and, in the middle of a step (after the forward pass, before the backward pass), when steps are
long enough to matter (step_s * SAFETY >= MIDSTEP_MIN_FRACTION * G):

    finish iff  elapsed + (step_s + save_s) * SAFETY + MARGIN_S <= G

otherwise the step is abandoned (never applied) and the process exits without a save: finishing a
step that cannot be saved buys nothing and risks the SIGKILL.  ``save_s`` is the longest of the
last few measured saves (all-gather, write, fsync, rename, pointer, barrier); before any save was
measured, it is estimated from the state's bytes at ``ASSUMED_SAVE_BYTES_PER_S``.

Pure Python (no torch): unit-testable anywhere.
"""

from __future__ import annotations

import os
from collections import deque

from . import ConfigError

SAFETY = 1.5  # measured durations are multiplied by this
MARGIN_S = 0.5  # signal relay, barrier, exit and launcher teardown after the save
ASSUMED_SAVE_BYTES_PER_S = 100e6  # until a save has been measured (slow network disk)
ASSUMED_SAVE_OVERHEAD_S = 0.2  # ... plus this fixed cost
MIDSTEP_MIN_FRACTION = 0.01  # steps shorter than 1 % of the grace are always finished
RECENT_STEPS = 20
RECENT_SAVES = 3
TORCHRUN_DEFAULT_SHUTDOWN_S = 30.0  # torchrun SIGKILLs its workers this long after relaying SIGTERM


def parse_grace(raw: str | None, name: str = "GPUQ_SIGTERM_GRACE_S") -> float | None:
    """Seconds of grace, or None for unknown (absent or empty)."""
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"environment {name}={raw!r} is not a number") from exc
    if value != value or value < 0:
        raise ConfigError(f"environment {name}={raw!r} must be >= 0 seconds")
    return value


def launcher_cap(environ: dict[str, str] | None = None) -> float | None:
    """Under torchrun, the launcher SIGKILLs workers ``shutdown_timeout`` seconds after it relays a
    SIGTERM (TORCH_ELASTIC_SHUTDOWN_TIMEOUT where this torch honours it, else 30 s).  None when
    not under torchrun."""
    env = os.environ if environ is None else environ
    if not env.get("TORCHELASTIC_RUN_ID"):
        return None
    raw = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    if raw and _torchrun_honours_shutdown_env():
        try:
            return float(int(raw))
        except ValueError:
            pass
    return TORCHRUN_DEFAULT_SHUTDOWN_S


def _torchrun_honours_shutdown_env() -> bool:
    try:
        from torch.distributed.launcher.api import LaunchConfig
    except Exception:
        return False
    return "shutdown_timeout" in getattr(LaunchConfig, "__dataclass_fields__", {})


def effective_grace(raw: str | None, environ: dict[str, str] | None = None) -> float | None:
    """The grace this process can count on: GPUQ_SIGTERM_GRACE_S capped by the launcher's own kill."""
    grace = parse_grace(raw)
    if grace is None:
        return None
    cap = launcher_cap(environ)
    return grace if cap is None else min(grace, cap)


def save_need(elapsed: float, save_s: float) -> float:
    """Seconds after the signal by which a save started now would be done, with safety."""
    return max(0.0, elapsed) + save_s * SAFETY + MARGIN_S


def step_need(elapsed: float, step_s: float, save_s: float) -> float:
    """... for finishing the current step and then saving."""
    return max(0.0, elapsed) + (step_s + save_s) * SAFETY + MARGIN_S


def midstep_check(grace: float | None, step_s: float) -> bool:
    """Whether a step is long enough, against the grace, to be worth abandoning (then one more tiny
    all-reduce per step agrees on it; a grace of 0 leaves nothing to decide)."""
    return grace is not None and grace > 0 and step_s > 0 and step_s * SAFETY >= MIDSTEP_MIN_FRACTION * grace


class Timings:
    """Recent step and save durations of this process (seconds)."""

    def __init__(self) -> None:
        self.steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self.saves: deque[float] = deque(maxlen=RECENT_SAVES)

    def add_step(self, seconds: float) -> None:
        self.steps.append(max(0.0, float(seconds)))

    def add_save(self, seconds: float) -> None:
        self.saves.append(max(0.0, float(seconds)))

    def step_s(self) -> float:
        return max(self.steps, default=0.0)

    def measured_save_s(self) -> float | None:
        return max(self.saves) if self.saves else None

    def save_s(self, state_bytes: int) -> float:
        """The longest recent save, else an estimate from the state's size."""
        measured = self.measured_save_s()
        if measured is not None:
            return measured
        return ASSUMED_SAVE_OVERHEAD_S + state_bytes / ASSUMED_SAVE_BYTES_PER_S
