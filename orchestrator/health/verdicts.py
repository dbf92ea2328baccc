"""PURE: what an attempt that ended badly was (``classify``: its failure class from the exit codes and the
log's evidence, docs/health.md) and what follows (``decide``: requeue, fail or keep it lost, in words)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core import protocol
from orchestrator.health import stops
from orchestrator.health.hints import HINTS
from orchestrator.host_documents import ScanHit

CONFIG_EXCEPTIONS = ("KeyError", "AttributeError", "ImportError", "ModuleNotFoundError", "FileNotFoundError",
                     "TypeError", "ValueError", "NameError", "SyntaxError", "IndentationError")


def classify(exit_code: int | None, trainer_code: int | None, hits: Sequence[ScanHit],
             traceback: Sequence[str] = (), *, oom_kill_rose: bool = False, rebooted: bool = False,
             wrapper_signal: int | None = None) -> str:
    """The failure class (docs/health.md) from the exit code and the log evidence:
    "transient" | "config" | "divergence" | "gpu_oom" | "host_oom" | "disk_full" | "control_plane"
    | "stopped" (SIGTERM from outside: a preemption's grace, a shutdown; ``wrapper_signal`` is the
    signal the wrapper received, a stop whatever the trainer's code) | "killed" (a signal death gpuq
    did not cause, no OOM evidence) | "vanished" | "unknown".  See ``orchestrator.health.stops``."""
    signatures = {h.signature for h in hits}
    last = next((line.strip() for line in reversed(traceback) if line.strip()), "")
    outside = stops.outside_class(exit_code, trainer_code, wrapper_signal,
                                  oom_evidence=oom_kill_rose or "killed" in signatures,
                                  signatures=signatures if exit_code is not None else ())
    if outside == "stopped":
        return outside
    if exit_code == protocol.EXIT_CONFIG or trainer_code == protocol.EXIT_CONFIG or "state_dict" in signatures:
        return "config"
    if exit_code == protocol.EXIT_TRANSIENT or trainer_code == protocol.EXIT_TRANSIENT:
        return "transient"
    if "nccl" in signatures and outside is None:
        return "transient"  # a collective failing after a rank's signal death is that death's (below)
    if exit_code == protocol.EXIT_FINALIZE:
        return "control_plane"
    if exit_code == protocol.EXIT_SIGNAL_BASE + 15 or trainer_code == protocol.EXIT_SIGNAL_BASE + 15:
        return "stopped"  # a SIGTERM gpuq did not send (a cancel never gets here): a stop, not a verdict
    if "nonfinite_loss" in signatures:
        return "divergence"
    if "cuda_oom" in signatures:
        return "gpu_oom"
    if "disk_full" in signatures or exit_code == protocol.EXIT_DISK_GATE:
        return "disk_full"
    if outside is not None:
        return outside  # killed by a signal from outside: host_oom with OOM evidence, else killed
    if oom_kill_rose or "killed" in signatures:
        return "host_oom"
    if any(last.startswith(name) for name in CONFIG_EXCEPTIONS):
        return "config"
    if rebooted:
        return "transient"  # a reboot with a clean kernel log: an identical retry (docs/health.md)
    if exit_code is None:
        return "vanished"
    return "unknown"


# host_oom and killed: a signal death gpuq did not cause is retried with resume within retries=
RETRYABLE = frozenset({"transient", "vanished", "stalled", "stopped", "killed", "host_oom"})


DEADLOCK_AT_START = "deadlock_at_start"  # stalled before its first step: retried once at most


DEADLOCK_RETRIES = 1


DEADLOCK_HINT = HINTS[DEADLOCK_AT_START]  # the fixes live in orchestrator/health/hints.py, as `gpuq explain` shows them


DIVERGENCE_HINT = HINTS["divergence"]


@dataclass(frozen=True)
class Decision:
    action: str  # "requeue" | "fail" | "keep_lost" | "none" | "stale" (settled already, by another command)
    words: str  # what was decided and why, without the next step
    next_step: str = ""  # what the user may do next, a command quoted in backticks ("" when none)

    @property
    def reason(self) -> str:
        """The decision as one line: its words, then the next step."""
        return f"{self.words}; {self.next_step}" if self.next_step else self.words


def decide(klass: str, failures: int, retries: int) -> Decision:
    """Policy for an attempt that ended badly.  ``failures`` counts this one too.  Retries are
    always the identical job resumed from its latest verified checkpoint; never for a config
    error or divergence (docs/health.md)."""
    if klass in ("config", "divergence"):
        return Decision("fail", f"{klass} error: never retried (fix it and submit again)")
    if klass == DEADLOCK_AT_START:  # a start that hangs twice will hang again: one retry at most
        allowed = min(retries, DEADLOCK_RETRIES)
        if failures <= allowed:
            return Decision("requeue", f"{klass}: requeued (retry {failures} of {allowed}; a second stall before "
                                       "the first step ends it)")
        return Decision("fail", f"{klass}: stalled before its first step, not retried again; {DEADLOCK_HINT}")
    if klass in RETRYABLE:
        if failures <= retries:
            return Decision("requeue", f"{klass}: requeued with resume (retry {failures} of {retries})")
        return Decision("keep_lost", f"{klass}: no retries left ({retries})", "`gpuq resume` once the cause is fixed")
    return Decision("none", f"{klass}: not retried automatically; see `gpuq logs`")
