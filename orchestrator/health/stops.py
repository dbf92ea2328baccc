"""Stops and kills from outside: which ended attempts were interrupted rather than failed.

Two kinds of evidence say an attempt did not fail on its own merits:

- the wrapper's exit record (docs/host-protocol.md): ``wrapper_signal`` is the signal the wrapper
  itself received (SIGTERM from a preemption's grace, a shutdown).  Such an attempt is a **stop**
  whatever the trainer's code: when a peer rank vanishes first, the survivor exits 1 before the
  deliberate 143 is recorded.  A trainer killed by a signal nobody sent to the wrapper (kill -9 of the
  ranks, the kernel's OOM killer, a watchdog) is a **kill**: ``host_oom`` when the cgroup's
  ``oom_kill`` counter rose or the log shows a bare ``Killed``, else ``killed``.  Both are retried
  with resume within ``retries=``.  A cancel or a stall kill never reaches this: gpuq settles those
  itself.  Under torchrun the first failure decides: when its "Root Cause" is a rank that raised,
  torchrun's SIGTERM to the other ranks is not a stop.
- the provider's word, a tick later: a spot preemption reported after the attempt already ended on
  that host turns the just-ended attempt into PREEMPTED (:func:`reclaim_preempted`), so it is resumed
  and counted against ``max_preemptions``, not ``retries=``.

Pure functions over documents and the ledger; no host I/O.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Collection

from orchestrator.core import protocol
from orchestrator.core.states import AttemptState, JobState
from orchestrator.host_documents import ExitRecord, JobEntry, StatusDocument
from orchestrator.ledger import Ledger

STOP_SIGNALS = frozenset({int(signal.SIGTERM), int(signal.SIGINT)})  # a request to stop, honoured
RANK_FAILED = "rank_failed"  # the log scan's word for torchrun's root cause: a rank that exited with a code
MAX_SIGNAL = 64


def wrapper_signal(exit_doc: ExitRecord | None) -> int | None:
    """The signal the wrapper itself received, from its exit record; None when it got none."""
    value = exit_doc.wrapper_signal if exit_doc is not None else None
    if value is not None and 0 < value <= MAX_SIGNAL:
        return value
    return None


def death_signal(exit_code: int | None, trainer_code: int | None) -> int | None:
    """The signal that killed the trainer (wrapper code 128+N, or a negative trainer code), else None."""
    if isinstance(trainer_code, int) and -MAX_SIGNAL <= trainer_code < 0:
        return -trainer_code
    if isinstance(exit_code, int) and protocol.EXIT_SIGNAL_BASE < exit_code <= protocol.EXIT_SIGNAL_BASE + MAX_SIGNAL:
        return exit_code - protocol.EXIT_SIGNAL_BASE
    return None


def outside_class(exit_code: int | None, trainer_code: int | None, got_signal: int | None, *,
                  oom_evidence: bool, signatures: Collection[str] = ()) -> str | None:
    """"stopped" | "host_oom" | "killed" for an attempt interrupted from outside, else None (let the
    log evidence decide).  ``signatures``: the log scan's; torchrun turns a rank's signal death into
    its own exit 1 and says which signal in the log ("rank_terminated", "rank_killed"), and names the
    first failure: when that is a rank's own exit ("rank_failed"), its exception decides, never the
    SIGTERMs torchrun sent the others."""
    if got_signal in STOP_SIGNALS:
        return "stopped"
    sig = death_signal(exit_code, trainer_code)
    # torchrun's root cause was a rank's own exit (an exception): the signals it then sent the other ranks,
    # and whatever they died of after it, are its doing, not an interruption from outside
    rank_failed = RANK_FAILED in signatures
    killed_rank = "rank_killed" in signatures and not rank_failed  # torchrun SIGTERMs a killed rank's survivors
    if sig in STOP_SIGNALS or (sig is None and "rank_terminated" in signatures and not killed_rank
                               and not rank_failed):
        return "stopped"  # SIGTERM straight to the trainer (a container stop): a stop, not a verdict
    if sig is None and not killed_rank:
        return None
    return "host_oom" if oom_evidence else "killed"


def reclaim_preempted(ledger: Ledger, host: str, reason: str, *, within_s: float,
                      now: float | None = None) -> list[str]:
    """The provider reports a spot preemption of ``host``: attempts on it that already ended badly in
    the last ``within_s`` seconds (the preemption's grace came before the provider said so) become
    PREEMPTED; a job that was failed for it is PREEMPTED too, so `gpuq resume` (or auto-resume)
    continues it.  A job already requeued stays QUEUED; its attempt no longer counts against
    ``retries=``.  Returns the job ids changed."""
    now = time.time() if now is None else now
    changed = []
    for job in ledger.jobs(states=[JobState.FAILED, JobState.QUEUED, JobState.LOST]):
        if job.host != host or job.updated_at < now - within_s:
            continue
        att = ledger.attempt(job.id, job.attempt_count)
        if att is None or att.state not in (AttemptState.EXITED.value, AttemptState.LOST.value):
            continue
        if att.state == AttemptState.EXITED.value and att.exit_code in (None, protocol.EXIT_OK):
            continue
        if att.exit_code in (protocol.EXIT_CONFIG,):
            continue  # a config error is the code's, whatever happened to the machine after
        message = f"spot preemption: {reason} (reported after the attempt ended: {att.message})"
        ledger.transition(job.id, AttemptState.PREEMPTED, attempt=att.number, message=message)
        if job.state != JobState.QUEUED.value:
            ledger.transition(job.id, JobState.PREEMPTED, message=message)
        changed.append(job.id)
    return changed


def interrupted(entry: JobEntry | None) -> bool:
    """A status document's job entry that exited non-zero on a signal from outside (not a cancel):
    on a rented host, worth asking the provider about before the attempt is called a failure."""
    if entry is None or entry.state != "exited" or entry.cancel_requested or entry.exit is None:
        return False
    code = entry.exit.wrapper_code
    if code == protocol.EXIT_OK:
        return False
    signatures = {h.signature for h in entry.scan.hits} if entry.scan is not None else set()
    return outside_class(code, entry.exit.trainer_code, wrapper_signal(entry.exit), oom_evidence=False,
                         signatures=signatures) is not None


def kernel_oom_kills(doc: StatusDocument) -> bool:
    """Whether a status document's kernel section reports OOM-killer kills since the cursor it was
    asked with (docs/host-protocol.md: "oom_kills", present only when there were some)."""
    return doc.kernel is not None and bool(doc.kernel.oom_kills)
